"""Read and validate GGUF model files without loading their weights.

llama.cpp aborts the whole process (a failed GGML_ASSERT, uncatchable from Python) on some malformed
files, and reports others only as a bare "failed to load model". So before a path is handed to
llama-cpp-python we parse the GGUF header, metadata and tensor table here and check them.

We use a small own parser rather than ``gguf.GGUFReader``: the reader builds a numpy view for every
element of every array (slow on 150k-token vocabularies plus their merges) and builds views of the
tensor data, which fails with assorted numpy errors on truncated files. This parser reads only the
header bytes through a read-only memory map; tensor data pages are never touched.
"""

from __future__ import annotations

import difflib
import hashlib
import math
import mmap
import os
import re
import struct
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specli.fileio import regular_file_problem

__all__ = [
    "DIFFUSION_ARCHITECTURES",
    "HYBRID_ARCHITECTURES",
    "LLAMA_CPP_VERSION",
    "RECURRENT_ARCHITECTURES",
    "ROLLBACK_ARCHITECTURES",
    "SUPPORTED_ARCHITECTURES",
    "ArrayInfo",
    "GGUFError",
    "GGUFInfo",
    "TensorInfo",
    "check_gguf",
    "human_count",
    "human_size",
    "read_gguf_info",
    "validate_gguf",
]

# --------------------------------------------------------------------------------------------------
# Facts taken from the llama.cpp sources vendored by llama-cpp-python 0.3.36
# (ggml-org/llama.cpp@0c1e57098). Refresh these when the llama-cpp-python pin changes.
# --------------------------------------------------------------------------------------------------

LLAMA_CPP_VERSION = "llama.cpp 0c1e57098 (llama-cpp-python 0.3.36)"

# src/llama-arch.cpp, LLM_ARCH_NAMES, minus "clip" (a dummy used only by llama-quantize) and
# "(unknown)". An architecture outside this set makes llama.cpp refuse the model.
SUPPORTED_ARCHITECTURES: frozenset[str] = frozenset({
    "afmoe", "apertus", "arcee", "arctic", "arwkv7", "baichuan", "bailingmoe", "bailingmoe2",
    "bailingmoe3", "bert", "bitnet", "bloom", "chameleon", "chatglm", "codeshell", "cogvlm",
    "cohere2", "cohere2moe", "command-r", "dbrx", "deci", "deepseek", "deepseek2", "deepseek2-ocr",
    "deepseek32", "deepseek4", "dflash", "dots1", "dots3note", "dream", "eagle3", "ernie4_5",
    "ernie4_5-moe", "eurobert", "exaone", "exaone-moe", "exaone4", "falcon", "falcon-h1", "gemma",
    "gemma-embedding", "gemma2", "gemma3", "gemma3n", "gemma4", "gemma4-assistant", "glm-dsa", "glm4",
    "glm4moe", "glm5-next", "gpt-oss", "gpt2", "gptj", "gptneox", "granite", "granite_swa",
    "granitehybrid", "granitemoe", "graniteswitch", "grok", "grovemoe", "hrm_text", "hunyuan-dense",
    "hunyuan-moe", "hunyuan_vl", "hy_v3", "hy_v4", "internlm2", "jais", "jais2", "jamba",
    "jina-bert-v2", "jina-bert-v3", "kimi-k3", "kimi-linear", "laguna", "lfm2", "lfm2moe", "llada",
    "llada-moe", "llama", "llama-embed", "llama4", "maincoder", "mamba", "mamba2", "maple", "mellum",
    "mimo2", "minicpm", "minicpm3", "minimax-01", "minimax-m2", "minimax-m3", "mistral3", "mistral4",
    "modern-bert", "mpt", "muse-glimmer", "nanbeige", "nemotron", "nemotron_h", "nemotron_h_moe",
    "neo-bert", "nomic-bert", "nomic-bert-moe", "olmo", "olmo2", "olmoe", "openelm", "paddleocr",
    "pangu-embedded", "phi2", "phi3", "phimoe", "plamo", "plamo2", "plamo3", "plm", "pockettts", "qwen",
    "qwen2", "qwen2moe", "qwen2vl", "qwen35", "qwen35moe", "qwen3", "qwen3moe", "qwen3next",
    "qwen3tts", "qwen3vl", "qwen3vlmoe", "qwen4exp", "refact", "rnd1", "rwkv6", "rwkv6qwen2", "rwkv7",
    "seed_oss", "smallthinker", "smollm3", "spark2_5", "stablelm", "starcoder", "starcoder2", "step35",
    "t5", "t5encoder", "talkie", "wavtokenizer-dec", "xverse",
})

# src/llama-arch.cpp, llm_arch_is_recurrent(): the whole state is a recurrent state, no KV cache.
RECURRENT_ARCHITECTURES: frozenset[str] = frozenset({
    "mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7",
})

# src/llama-arch.cpp, llm_arch_is_hybrid(): attention layers mixed with recurrent layers.
HYBRID_ARCHITECTURES: frozenset[str] = frozenset({
    "jamba", "falcon-h1", "plamo2", "granitehybrid", "lfm2", "lfm2moe", "nemotron_h", "nemotron_h_moe",
    "qwen3next", "kimi-linear", "bailingmoe3", "kimi-k3", "glm5-next", "qwen35", "qwen35moe",
    "qwen4exp", "deepseek4", "minimax-01",
})

# src/llama-arch.cpp, llm_arch_supports_rs_rollback(): the recurrent state keeps n_rs_seq snapshots, so a
# rejected draft suffix can be rolled back (bounded): these can be speculative targets.
ROLLBACK_ARCHITECTURES: frozenset[str] = frozenset({
    "kimi-k3", "qwen35", "qwen35moe", "qwen4exp", "deepseek4", "glm5-next", "nemotron_h",
    "nemotron_h_moe", "lfm2", "lfm2moe", "bailingmoe3",
})

# src/llama-arch.cpp, llm_arch_is_diffusion(): not autoregressive, nothing to speculate on.
DIFFUSION_ARCHITECTURES: frozenset[str] = frozenset({"dream", "llada", "llada-moe", "rnd1"})

# Architectures whose loader (src/models/<arch>.cpp) creates token_embd.weight as {n_embd, n_vocab}, one
# blk.N group per layer, and sizes attention from n_embd / n_head and n_head / n_head_kv. Only for these
# do we check head counts and the tensor table against the metadata strictly, so an exotic architecture
# that llama.cpp loads fine is never refused by a guess of ours.
_STRICT_ARCHITECTURES: frozenset[str] = frozenset({
    "baichuan", "deepseek", "exaone", "falcon", "gemma", "gemma2", "gemma3", "gpt2", "gptneox", "granite",
    "internlm2", "llama", "minicpm", "mistral3", "olmo2", "phi2", "phi3", "qwen2", "qwen2moe", "qwen3",
    "qwen3moe", "smollm3", "stablelm", "starcoder", "starcoder2",
})

# src/llama-vocab.cpp, llama_vocab::impl::load(): tokenizer.ggml.model values it accepts.
# "none"/"no_vocab" are accepted by llama.cpp but mean "no tokenizer", which specli cannot use.
_KNOWN_TOKENIZERS: frozenset[str] = frozenset({
    "llama", "bert", "gpt2", "hybriddna", "whitespace", "t5", "rwkv", "plamo2", "gemma4", "test",
})
_NO_TOKENIZER = frozenset({"none", "no_vocab"})

# src/llama-model.cpp, LLAMA_ROPE_SCALING_TYPES; any other value fails a GGML_ASSERT.
_ROPE_SCALING_TYPES = frozenset({"none", "linear", "yarn", "longrope"})

# src/llama-hparams.h
_LLAMA_MAX_LAYERS = 512
_LLAMA_MAX_EXPERTS = 1024

# ggml/include/ggml.h GGML_MAX_NAME (64, including the NUL) and GGML_MAX_DIMS
_MAX_TENSOR_NAME_LEN = 63
_MAX_DIMS = 4

# ggml/include/gguf.h
_GGUF_MAGIC = b"GGUF"
_GGUF_VERSIONS = frozenset({2, 3})  # v1 is rejected by llama.cpp ("no longer supported")
_DEFAULT_ALIGNMENT = 32

# ggml/src/ggml.c type_traits: type id -> (name, block size in elements, block size in bytes)
_GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36), 10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292), 16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110), 22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8),
    28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54),
    35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17), 40: ("NVFP4", 64, 36), 41: ("Q1_0", 128, 18),
    42: ("Q2_0", 64, 18),
}

# include/llama.h, enum llama_ftype (general.file_type)
_FILE_TYPES: dict[int, str] = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M",
    18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S",
    25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M",
    32: "BF16", 36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4_MOE", 39: "NVFP4", 40: "Q1_0", 41: "Q2_0",
}

# GGUF metadata value types: id -> (name, struct format); string (8) and array (9) are special.
_VALUE_TYPES: dict[int, tuple[str, str]] = {
    0: ("uint8", "<B"), 1: ("int8", "<b"), 2: ("uint16", "<H"), 3: ("int16", "<h"), 4: ("uint32", "<I"),
    5: ("int32", "<i"), 6: ("float32", "<f"), 7: ("bool", "<?"), 8: ("string", ""), 9: ("array", ""),
    10: ("uint64", "<Q"), 11: ("int64", "<q"), 12: ("float64", "<d"),
}
_STRING, _ARRAY = 8, 9

# Arrays longer than this are summarised (ArrayInfo) instead of decoded: only the token list is needed
# in full, and decoding merges/scores/token types of a 150k vocabulary would cost time and memory.
_MAX_DECODED_ARRAY = 4096
_TOKENS_KEY = "tokenizer.ggml.tokens"
_TOKEN_TYPE_KEY = "tokenizer.ggml.token_type"
_TOKEN_TYPE_BYTE = 6  # include/llama.h LLAMA_TOKEN_TYPE_BYTE
_BYTE_TOKEN_RE = re.compile(rb"<0x[0-9A-Fa-f]{2}>")

_REDOWNLOAD = "re-download it (the download was probably interrupted)"
_BLK_RE = re.compile(r"^blk\.(\d+)\.")
_SPLIT_RE = re.compile(r"^(.*)-(\d{5})-of-(\d{5})\.gguf$")


class GGUFError(Exception):
    """A GGUF file that specli cannot (or must not) hand to llama.cpp.

    ``str(err)`` is a one-line, user-facing message: ``"<path>: <problem>; <how to fix>"``.
    """

    def __init__(self, path: str | os.PathLike[str], problem: str, hint: str | None = None,
                 problems: list[str] | None = None) -> None:
        self.path = Path(path)
        self.problem = problem
        self.hint = hint
        # every problem found (validate_gguf reports the first one in the message)
        self.problems = problems if problems is not None else [problem + (f"; {hint}" if hint else "")]
        message = f"{path}: {problem}" + (f"; {hint}" if hint else "")
        if len(self.problems) > 1:
            more = len(self.problems) - 1
            message += f" (and {more} more problem{'s' if more > 1 else ''})"
        super().__init__(message)


@dataclass(frozen=True)
class ArrayInfo:
    """Stand-in for a long metadata array that was skipped rather than decoded."""

    element_type: str
    length: int

    def __len__(self) -> int:
        return self.length


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # GGUF/ggml order: shape[0] is the contiguous (row) dimension
    type_name: str
    type_id: int
    offset: int  # relative to the start of the data section
    n_elements: int
    n_bytes: int


@dataclass
class GGUFInfo:
    path: Path
    file_size: int
    version: int
    architecture: str | None
    name: str | None
    n_params: int
    n_layer: int | None
    n_embd: int | None
    n_head: int | None  # for per-layer arrays: the largest value
    n_head_kv: int | None
    context_length: int | None
    vocab_size: int | None
    tokenizer_model: str | None
    tokenizer_pre: str | None
    bos_token_id: int | None
    eos_token_id: int | None
    add_bos_token: bool | None
    chat_template: str | None
    file_type: int | None
    quantization: str | None  # e.g. "Q4_K_M"; guessed from the tensor types when general.file_type is absent
    n_tensors: int
    alignment: int
    data_offset: int
    is_recurrent: bool  # recurrent or hybrid: no plain KV cache that can be truncated after a rejection
    is_hybrid: bool
    is_diffusion: bool
    vocab_fingerprint: str | None  # sha256 prefix over the token strings, to compare draft/target vocabs
    metadata: dict[str, Any] = field(repr=False, default_factory=dict)
    metadata_types: dict[str, str] = field(repr=False, default_factory=dict)
    tensors: list[TensorInfo] = field(repr=False, default_factory=list)
    duplicate_tokens: list[tuple[int, int]] = field(repr=False, default_factory=list)  # (id, first id)
    # what llama.cpp's vocabulary looks up by text (see _byte_token_facts)
    missing_byte_tokens: list[int] = field(repr=False, default_factory=list)  # byte values without a token
    bad_byte_token: tuple[int, str] | None = field(repr=False, default=None)  # (id, why)
    # split models (gguf-split: NAME-00001-of-00003.gguf): llama.cpp is given the first part and
    # opens the others itself, so we read their tensor tables too
    split_count: int = 1
    split_index: int = 0
    shards: list[GGUFInfo] = field(repr=False, default_factory=list)  # the other parts that exist
    missing_shards: list[Path] = field(repr=False, default_factory=list)

    @property
    def all_tensors(self) -> list[TensorInfo]:
        """The tensors of this file and of the other parts of a split model."""
        return self.tensors + [t for shard in self.shards for t in shard.tensors]


def human_count(n: int | None) -> str:
    """292800 -> '292.8K', 7615616512 -> '7.6B'."""
    if n is None:
        return "?"
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.1f}{suffix}"
    return str(n)


def human_size(n: int | None) -> str:
    """File size in binary units: 4683073536 -> '4.4 GiB'."""
    if n is None:
        return "?"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"  # pragma: no cover - loop always returns


# --------------------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------------------


class _Truncated(Exception):
    pass


class _Corrupt(Exception):
    pass


_U64 = struct.Struct("<Q")


class _Cursor:
    """Bounds-checked little-endian reads from a buffer (the memory-mapped file)."""

    def __init__(self, buf: Any, size: int) -> None:
        self.buf = buf
        self.size = size
        self.pos = 0
        self.what = "the header"
        self.vocab_digest: str | None = None

    def _need(self, n: int) -> None:
        if n < 0 or self.pos + n > self.size:
            raise _Truncated(self.what)

    def unpack(self, fmt: str, n: int) -> Any:
        self._need(n)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return value

    def u32(self) -> int:
        return self.unpack("<I", 4)

    def u64(self) -> int:
        return self.unpack("<Q", 8)

    def raw_string(self) -> bytes:
        n = self.u64()
        self._need(n)
        data = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return data

    def string(self) -> str:
        return self.raw_string().decode("utf-8", errors="replace")

    def string_array(self, count: int, keep: bool) -> list[bytes]:
        """``count`` strings (returned if ``keep``, else skipped). A tight loop: vocabularies and their
        merges hold hundreds of thousands of strings."""
        buf, pos, size = self.buf, self.pos, self.size
        unpack = _U64.unpack_from
        out: list[bytes] = []
        append = out.append
        for _ in range(count):
            if pos + 8 > size:
                raise _Truncated(self.what)
            (n,) = unpack(buf, pos)
            pos += 8
            end = pos + n
            if end > size:
                raise _Truncated(self.what)
            if keep:
                append(buf[pos:end])  # slicing an mmap (or bytes) gives bytes
            pos = end
        self.pos = pos
        return out


def _type_name(vtype: int) -> str:
    return _VALUE_TYPES[vtype][0] if vtype in _VALUE_TYPES else f"type {vtype}"


def _read_value(cur: _Cursor, key: str, vtype: int) -> tuple[Any, str]:
    """Read one metadata value; returns (value, type description)."""
    if vtype == _STRING:
        return cur.string(), "string"
    if vtype == _ARRAY:
        etype = cur.u32()
        count = cur.u64()
        if etype == _ARRAY or etype not in _VALUE_TYPES:
            # llama.cpp rejects nested arrays too ("invalid GGUF type")
            raise _Corrupt(f"metadata key '{key}' is an array of invalid type {etype}")
        tdesc = f"array[{_type_name(etype)}]"
        if etype == _STRING:
            if key == _TOKENS_KEY:
                start = cur.pos
                tokens = cur.string_array(count, keep=True)
                # fingerprint the serialized (length-prefixed) token list in one go
                cur.vocab_digest = hashlib.sha256(cur.buf[start:cur.pos]).hexdigest()[:16]
                return tokens, tdesc
            if count > _MAX_DECODED_ARRAY:
                cur.string_array(count, keep=False)
                return ArrayInfo("string", count), tdesc
            return [s.decode("utf-8", errors="replace") for s in cur.string_array(count, keep=True)], tdesc
        fmt = _VALUE_TYPES[etype][1]
        width = struct.calcsize(fmt)
        # token types are needed in full: llama.cpp decodes BYTE-typed tokens by their text
        if count > _MAX_DECODED_ARRAY and key != _TOKEN_TYPE_KEY:
            cur._need(count * width)
            cur.pos += count * width
            return ArrayInfo(_type_name(etype), count), tdesc
        cur._need(count * width)
        values = list(struct.unpack_from(f"<{count}{fmt[1]}", cur.buf, cur.pos))
        cur.pos += count * width
        return values, tdesc
    if vtype not in _VALUE_TYPES:
        raise _Corrupt(f"metadata key '{key}' has invalid value type {vtype}")
    name, fmt = _VALUE_TYPES[vtype]
    return cur.unpack(fmt, struct.calcsize(fmt)), name


def _describe_magic(head: bytes) -> tuple[str, str]:
    """Say what a non-GGUF file probably is, and what to do about it."""
    expected = "expected a llama.cpp .gguf model"
    if not head:
        return "empty file (0 bytes)", _REDOWNLOAD
    if head.startswith(b"version https://git-lfs"):
        return ("a Git LFS pointer file, not the model itself",
                "run `git lfs pull` or download the file directly")
    lowered = head.lstrip().lower()
    if lowered.startswith((b"<!doctype html", b"<html")):
        return ("an HTML page, not a model",
                "the download fetched a web page; on Hugging Face use the .../resolve/main/FILE URL")
    if head[:4] in (b"lmgg", b"fmgg", b"tjgg"):
        return (f"an old pre-GGUF GGML file (magic {head[:4]!r})",
                "convert it with llama.cpp's convert_llama_ggml_to_gguf.py or download a .gguf")
    if head.startswith(b"PK\x03\x04"):
        return (f"not a GGUF file (magic {head[:4]!r}: a ZIP archive, e.g. a PyTorch checkpoint)",
                f"{expected}; convert with llama.cpp's convert_hf_to_gguf.py or download a GGUF build")
    if len(head) >= 10 and head[8:10] == b'{"':
        return ("not a GGUF file (looks like .safetensors)",
                f"{expected}; convert with llama.cpp's convert_hf_to_gguf.py or download a GGUF build")
    if head[:2] in (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05"):
        return ("not a GGUF file (looks like a Python pickle / PyTorch .bin)",
                f"{expected}; convert with llama.cpp's convert_hf_to_gguf.py")
    sample = head[:64]
    if all(32 <= b < 127 or b in (9, 10, 13) for b in sample):
        text = sample.decode("ascii").split("\n")[0]
        text = text if len(text) <= 32 else text[:32] + "..."
        return f"not a GGUF file (it is text, starting {text!r})", expected
    return f"not a GGUF file (magic {head[:4]!r})", expected


def _open_buffer(path: Path) -> tuple[Any, Any, int]:
    """Open and memory-map ``path``; returns (file, buffer, size). Errors become GGUFError."""
    if not os.path.lexists(path):
        hint = "check the path, or run `specli models` to see the configured models"
        raise GGUFError(path, "no such file", hint)
    if path.is_dir():
        raise GGUFError(path, "is a directory, not a .gguf file", "pass the path of the .gguf file inside it")
    if not path.exists():
        raise GGUFError(path, "broken symbolic link", "point it at an existing .gguf file")
    not_regular = regular_file_problem(path)
    if not_regular is not None:
        # a FIFO would block open() forever; a device (/dev/zero) is endless: neither is a model file
        raise GGUFError(path, not_regular, "pass the path of a .gguf model file")
    try:
        f = open(path, "rb")  # closed by read_gguf_info
        size = os.fstat(f.fileno()).st_size
    except PermissionError:
        raise GGUFError(path, "cannot read the file (permission denied)", "check its permissions") from None
    except OSError as e:
        raise GGUFError(path, f"cannot read the file ({e.strerror or e})", None) from None
    if size == 0:
        f.close()
        raise GGUFError(path, "empty file (0 bytes)", _REDOWNLOAD)
    try:
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):
        # some file systems cannot be mapped: fall back to reading (only the header is needed, but
        # we don't know its length up front; this path is rare, so read everything up to 1 GiB)
        try:
            buf = f.read(min(size, 1 << 30))
        except OSError as e:
            f.close()
            raise GGUFError(path, f"cannot read the file ({e.strerror or e})", None) from None
    return f, buf, size


def read_gguf_info(path: str | os.PathLike[str]) -> GGUFInfo:
    """Parse a GGUF file's header, metadata and tensor table (never its tensor data).

    Raises GGUFError when the file is missing, unreadable, not a GGUF, of an unsupported GGUF version,
    or its header is truncated/corrupt. It does not judge whether llama.cpp can use the model: that is
    ``validate_gguf``'s job, so ``specli models`` can still show what a broken file claims to be.
    """
    info = _read_one(Path(path))
    count = _scalar_int(info.metadata.get("split.count")) or 1
    if count > 1:
        info.split_count = count
        info.split_index = _scalar_int(info.metadata.get("split.no")) or 0
        m = _SPLIT_RE.match(info.path.name)
        if info.split_index == 0 and m:
            for i in range(2, count + 1):
                part = info.path.with_name(f"{m.group(1)}-{i:05d}-of-{count:05d}.gguf")
                if part.is_file():
                    info.shards.append(_read_one(part))
                else:
                    info.missing_shards.append(part)
            info.n_params = sum(t.n_elements for t in info.all_tensors)
    return info


def _read_one(path: Path) -> GGUFInfo:
    f, buf, size = _open_buffer(path)
    try:
        return _parse(path, buf, size)
    except GGUFError:
        raise
    except _Truncated as e:
        raise GGUFError(path, f"the file ends in the middle of {e} ({human_size(size)} in total)",
                        _REDOWNLOAD) from None
    except _Corrupt as e:
        raise GGUFError(path, f"corrupt GGUF header: {e}", "re-download or re-convert the model") from None
    except (ValueError, struct.error, IndexError, OverflowError, MemoryError, UnicodeError) as e:
        raise GGUFError(path, f"corrupt GGUF header ({type(e).__name__}: {e})",
                        "re-download or re-convert the model") from None
    finally:
        if isinstance(buf, mmap.mmap):
            buf.close()
        f.close()


def _parse(path: Path, buf: Any, size: int) -> GGUFInfo:
    head = bytes(buf[:64])
    if head[:4] != _GGUF_MAGIC:
        problem, hint = _describe_magic(head)
        raise GGUFError(path, problem, hint)
    cur = _Cursor(buf, min(size, len(buf)))  # the non-mmap fallback may hold only a prefix
    cur.pos = 4
    version = cur.u32()
    if version not in _GGUF_VERSIONS:
        if version & 0xFFFF == 0 and struct.unpack("<I", struct.pack(">I", version))[0] in _GGUF_VERSIONS:
            raise GGUFError(path, "big-endian GGUF file (made for s390x/POWER machines)",
                            "download the standard little-endian GGUF")
        if version == 1:
            raise GGUFError(path, "GGUF version 1 is no longer supported by llama.cpp",
                            "re-convert the model with a current llama.cpp (GGUF v3)")
        raise GGUFError(path, f"unsupported GGUF version {version} (llama.cpp reads versions 2 and 3)",
                        "re-convert the model, or upgrade llama-cpp-python if the file is newer"
                        if version > 3 else "re-download or re-convert the model")
    n_tensors = cur.u64()
    n_kv = cur.u64()
    # every KV pair takes at least 13 bytes and every tensor info at least 24: larger counts are garbage
    if n_kv * 13 > size or n_tensors * 24 > size:
        raise _Corrupt(f"implausible counts ({n_kv} metadata keys, {n_tensors} tensors in {size} bytes)")

    metadata: dict[str, Any] = {}
    types: dict[str, str] = {}
    for i in range(n_kv):
        cur.what = f"metadata entry {i + 1} of {n_kv}"
        key = cur.string()
        if not key:
            raise _Corrupt(f"metadata entry {i + 1} has an empty key")
        cur.what = f"metadata key '{key}'"
        vtype = cur.u32()
        value, tdesc = _read_value(cur, key, vtype)
        if key in metadata:
            raise _Corrupt(f"metadata key '{key}' appears twice")
        metadata[key] = value
        types[key] = tdesc

    alignment = metadata.get("general.alignment", _DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or isinstance(alignment, bool) or alignment <= 0 \
            or alignment & (alignment - 1):
        alignment = _DEFAULT_ALIGNMENT  # reported by check_gguf; keep parsing with the default

    tensors: list[TensorInfo] = []
    for i in range(n_tensors):
        cur.what = f"tensor info {i + 1} of {n_tensors}"
        name = cur.string()
        cur.what = f"tensor info '{name}'"
        n_dims = cur.u32()
        if n_dims > _MAX_DIMS:
            raise _Corrupt(f"tensor '{name}' has {n_dims} dimensions (at most {_MAX_DIMS} allowed)")
        shape = tuple(cur.unpack("<q", 8) for _ in range(n_dims))
        if any(d < 0 for d in shape):
            raise _Corrupt(f"tensor '{name}' has a negative dimension {shape}")
        type_id = cur.u32()
        offset = cur.u64()
        if type_id not in _GGML_TYPES:
            raise _Corrupt(f"tensor '{name}' has unknown ggml type {type_id} "
                           "(corrupt, or made for a newer llama.cpp than the bundled one)")
        type_name, block, block_bytes = _GGML_TYPES[type_id]
        n_elements = 1
        for d in shape:
            n_elements *= d
        if n_elements >= 1 << 63:
            raise _Corrupt(f"tensor '{name}' has an impossible shape {shape}")
        row = shape[0] if shape else 1
        if row % block:
            raise _Corrupt(f"tensor '{name}' of type {type_name} has rows of {row} elements, "
                           f"not a multiple of the block size {block}")
        tensors.append(TensorInfo(name, shape, type_name, type_id, offset, n_elements,
                                  n_elements // block * block_bytes))
    header_end = cur.pos
    data_offset = -(-header_end // alignment) * alignment if n_tensors else header_end
    return _build_info(path, size, version, metadata, types, tensors, alignment, data_offset,
                       cur.vocab_digest)


def _scalar_int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def _int_or_max(value: Any) -> int | None:
    """A hyperparameter given either as one int or as a per-layer array: the (largest) value."""
    if isinstance(value, list) and value and all(_scalar_int(v) is not None for v in value):
        return max(value)
    return _scalar_int(value)


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _build_info(path: Path, size: int, version: int, md: dict[str, Any], types: dict[str, str],
                tensors: list[TensorInfo], alignment: int, data_offset: int,
                vocab_digest: str | None) -> GGUFInfo:
    arch = _str(md.get("general.architecture"))
    prefix = f"{arch}." if arch else "\0"  # no key starts with NUL: lookups below then find nothing

    tokens = md.get(_TOKENS_KEY)
    vocab_size = None
    duplicates: list[tuple[int, int]] = []
    if isinstance(tokens, list):
        vocab_size = len(tokens)
        if len(set(tokens)) != len(tokens):  # fast path in C; find the culprits only if needed
            seen: dict[bytes, int] = {}
            for i, tok in enumerate(tokens):
                # llama.cpp renames empty tokens, then GGML_ASSERTs that all token strings are unique
                key = tok or f"[EMPTY_{i}]".encode()
                first = seen.setdefault(key, i)
                if first != i and len(duplicates) < 5:
                    duplicates.append((i, first))
        missing_bytes, byte_typed = _byte_token_facts(
            tokens, md.get(_TOKEN_TYPE_KEY), _str(md.get("tokenizer.ggml.model"))
        )
        # keep the metadata dict light; callers that need the tokens read them themselves
        md[_TOKENS_KEY] = ArrayInfo("string", len(tokens))
    else:
        missing_bytes, byte_typed = [], None
    token_types = md.get(_TOKEN_TYPE_KEY)
    if isinstance(token_types, list) and len(token_types) > _MAX_DECODED_ARRAY:
        md[_TOKEN_TYPE_KEY] = ArrayInfo(types.get(_TOKEN_TYPE_KEY, "array")[6:-1], len(token_types))

    file_type = _scalar_int(md.get("general.file_type"))
    quantization = _FILE_TYPES.get(file_type) if file_type is not None else None
    if quantization is None and tensors:
        counts: Counter[str] = Counter()
        for t in tensors:
            if len(t.shape) >= 2:
                counts[t.type_name] += t.n_elements
        if counts:
            quantization = counts.most_common(1)[0][0]

    bos = _scalar_int(md.get("tokenizer.ggml.bos_token_id"))
    eos = _scalar_int(md.get("tokenizer.ggml.eos_token_id"))
    add_bos = md.get("tokenizer.ggml.add_bos_token")
    return GGUFInfo(
        path=path,
        file_size=size,
        version=version,
        architecture=arch,
        name=_str(md.get("general.name")),
        n_params=sum(t.n_elements for t in tensors),
        n_layer=_scalar_int(md.get(prefix + "block_count")),
        n_embd=_scalar_int(md.get(prefix + "embedding_length")),
        n_head=_int_or_max(md.get(prefix + "attention.head_count")),
        n_head_kv=_int_or_max(md.get(prefix + "attention.head_count_kv",
                                     md.get(prefix + "attention.head_count"))),
        context_length=_scalar_int(md.get(prefix + "context_length")),
        vocab_size=vocab_size,
        tokenizer_model=_str(md.get("tokenizer.ggml.model")),
        tokenizer_pre=_str(md.get("tokenizer.ggml.pre")),
        bos_token_id=bos,
        eos_token_id=eos,
        add_bos_token=add_bos if isinstance(add_bos, bool) else None,
        chat_template=_str(md.get("tokenizer.chat_template")),
        file_type=file_type,
        quantization=quantization,
        n_tensors=len(tensors),
        alignment=alignment,
        data_offset=data_offset,
        is_recurrent=arch in RECURRENT_ARCHITECTURES or arch in HYBRID_ARCHITECTURES,
        is_hybrid=arch in HYBRID_ARCHITECTURES,
        is_diffusion=arch in DIFFUSION_ARCHITECTURES,
        vocab_fingerprint=vocab_digest if vocab_size is not None else None,
        metadata=md,
        metadata_types=types,
        tensors=tensors,
        duplicate_tokens=duplicates,
        missing_byte_tokens=missing_bytes,
        bad_byte_token=byte_typed,
    )


# --------------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------------

_RECONVERT = "re-convert the model with llama.cpp's convert_hf_to_gguf.py"

# A problem is (what is wrong, how to fix it).
_Problem = tuple[str, str]


def check_gguf(info: GGUFInfo) -> list[str]:
    """Everything about ``info`` that would make llama.cpp refuse, crash on, or misuse the model.

    Returns "<problem>; <how to fix>" strings, most fundamental first (empty when the file looks usable).
    """
    return [f"{problem}; {hint}" for problem, hint in _problems(info)]


def validate_gguf(path: str | os.PathLike[str]) -> GGUFInfo:
    """``read_gguf_info`` plus every check of ``check_gguf``; raises GGUFError naming the first problem.

    Recurrent/hybrid/diffusion architectures are *not* errors here (llama.cpp can run them); see
    ``GGUFInfo.is_recurrent``, ``is_hybrid`` and ``is_diffusion``.
    """
    info = read_gguf_info(path)
    problems = _problems(info)
    if problems:
        problem, hint = problems[0]
        raise GGUFError(info.path, problem, hint, problems=[f"{p}; {h}" for p, h in problems])
    return info


def _problems(info: GGUFInfo) -> list[_Problem]:
    problems = _split_problems(info)
    if info.split_index != 0:
        return problems  # a later part carries no model metadata; only "pass the first part" matters
    problems += _container_problems(info)
    for shard in info.shards:
        problems += [(f"part {shard.path.name}: {p}", h) for p, h in _container_problems(shard)]
    if not info.all_tensors:
        problems.append(("the file contains no tensors (a vocabulary-only GGUF?)", "use the full model file"))
    arch = info.architecture
    if arch is None:
        problems.append(("general.architecture is missing, so this is not a llama.cpp model", _RECONVERT))
    else:
        if arch not in SUPPORTED_ARCHITECTURES:
            close = difflib.get_close_matches(arch, SUPPORTED_ARCHITECTURES, n=1)
            guess = f" (did you mean '{close[0]}'?)" if close else ""
            problems.append((f"architecture '{arch}' is not supported by the bundled "
                             f"{LLAMA_CPP_VERSION}{guess}",
                             "use a model with a supported architecture or upgrade llama-cpp-python"))
        problems += _hparam_problems(info, arch)
    problems += _tokenizer_problems(info)
    if arch is not None:
        problems += _tensor_table_problems(info, arch)
    return problems


def _split_problems(info: GGUFInfo) -> list[_Problem]:
    if info.split_count <= 1:
        return []
    m = _SPLIT_RE.match(info.path.name)
    if info.split_index != 0:
        first = f"{m.group(1)}-00001-of-{info.split_count:05d}.gguf" if m else "the first part"
        return [(f"this is part {info.split_index + 1} of {info.split_count} of a split model",
                 f"pass the first part instead ({first})")]
    if not m:
        return [(f"this is the first part of a model split into {info.split_count} files, but its name does "
                 "not end in -00001-of-NNNNN.gguf, so llama.cpp cannot find the other parts",
                 "keep the names gguf-split gave the parts")]
    if info.missing_shards:
        names = ", ".join(p.name for p in info.missing_shards[:3])
        missing = len(info.missing_shards)
        return [(f"split model: {missing} of its {info.split_count} parts are missing ({names})",
                 "download all parts into the same directory")]
    return []


def _container_problems(info: GGUFInfo) -> list[_Problem]:
    out: list[_Problem] = []
    align = info.metadata.get("general.alignment")
    align_type = info.metadata_types.get("general.alignment")
    if align is not None and (align_type != "uint32" or align <= 0 or align & (align - 1)):
        out.append((f"general.alignment is {align!r} ({align_type}), not a power-of-two uint32", _RECONVERT))
    # llama.cpp checks each tensor against the file size when it maps the weights
    data_end = max((info.data_offset + t.offset + t.n_bytes for t in info.tensors), default=0)
    if data_end > info.file_size:
        missing = data_end - info.file_size
        out.append((f"truncated: the tensor data needs {data_end:,} bytes but the file has "
                    f"{info.file_size:,} ({human_size(missing)} missing)", _REDOWNLOAD))
    # gguf_init_from_file: names < 64 bytes and unique, tensors packed in order at aligned offsets
    expected = 0
    seen: set[str] = set()
    for t in info.tensors:
        if len(t.name.encode()) > _MAX_TENSOR_NAME_LEN:
            out.append((f"tensor name '{t.name[:40]}...' is longer than {_MAX_TENSOR_NAME_LEN} bytes",
                        _RECONVERT))
            break
        if t.name in seen:
            out.append((f"tensor '{t.name}' appears twice in the tensor table", _RECONVERT))
            break
        seen.add(t.name)
        if t.offset != expected:
            out.append((f"corrupt tensor table: '{t.name}' starts at data offset {t.offset:,}, "
                        f"expected {expected:,}", "re-download or re-convert the model"))
            break
        expected += -(-t.n_bytes // info.alignment) * info.alignment
    return out


def _hparam_problems(info: GGUFInfo, arch: str) -> list[_Problem]:
    md = info.metadata
    out: list[_Problem] = []

    def key(name: str) -> str:
        return f"{arch}.{name}"

    # llama_model_base::load_hparams requires these for every architecture
    required = ("context_length", "embedding_length", "block_count")
    missing = [key(k) for k in required if key(k) not in md]
    if missing:
        out.append((f"required metadata missing: {', '.join(missing)}", _RECONVERT))
    for k in required:
        if key(k) in md and ((v := _scalar_int(md[key(k)])) is None or v <= 0):
            out.append((f"{key(k)} is {md[key(k)]!r}, not a positive integer", _RECONVERT))
    n_layer, n_embd = info.n_layer, info.n_embd
    if n_layer is not None and n_layer > _LLAMA_MAX_LAYERS:
        out.append((f"{key('block_count')} is {n_layer}, above llama.cpp's limit of {_LLAMA_MAX_LAYERS}",
                    "the file is corrupt or needs a newer llama.cpp"))
    nextn = _scalar_int(md.get(key("nextn_predict_layers"), 0))
    if n_layer and nextn is not None and nextn > n_layer:
        out.append((f"{key('nextn_predict_layers')} ({nextn}) exceeds {key('block_count')} ({n_layer})",
                    _RECONVERT))

    out += _head_problems(md, arch, n_layer, n_embd)

    # each of these is a GGML_ASSERT in load_hparams
    n_expert = _scalar_int(md.get(key("expert_count"), 0)) or 0
    n_used = _int_or_max(md.get(key("expert_used_count"), 0)) or 0
    n_groups = _scalar_int(md.get(key("expert_group_count"), 0)) or 0
    n_group_used = _scalar_int(md.get(key("expert_group_used_count"), 0)) or 0
    if n_expert > 0:
        bad = (n_expert > _LLAMA_MAX_EXPERTS or not 0 < n_used <= n_expert or n_groups >= n_expert
               or (n_groups > 1 and (n_expert % n_groups != 0 or not 0 < n_group_used < n_groups)))
    else:
        bad = n_used != 0 or n_groups != 0
    if bad:
        out.append((f"inconsistent mixture-of-experts metadata (expert_count={n_expert}, "
                    f"expert_used_count={n_used}, expert_group_count={n_groups}, "
                    f"expert_group_used_count={n_group_used})", _RECONVERT))

    out += _float_problems(info, arch)

    rope = md.get(key("rope.scaling.type"))
    if rope is not None and rope not in _ROPE_SCALING_TYPES:
        out.append((f"{key('rope.scaling.type')} is {rope!r}, llama.cpp knows "
                    f"{', '.join(sorted(_ROPE_SCALING_TYPES))}", _RECONVERT))
    return out


_FLOAT_TYPES = frozenset({"float32", "float64", "array[float32]", "array[float64]"})


def _float_problems(info: GGUFInfo, arch: str) -> list[_Problem]:
    """Float hyperparameters: finite, and the norm epsilons not negative. ggml's norm kernels abort on
    GGML_ASSERT(eps >= 0.0f), which a NaN fails too; an infinite value or a rope base that is not
    positive makes every logit NaN."""
    out: list[_Problem] = []
    for name, value in info.metadata.items():
        if not name.startswith(f"{arch}.") or info.metadata_types.get(name) not in _FLOAT_TYPES:
            continue
        values = value if isinstance(value, list) else [value] if isinstance(value, float) else []
        bad = next((v for v in values if not math.isfinite(v)), None)
        if bad is not None:
            out.append((f"{name} is {bad}, not a finite number", _RECONVERT))
        elif name.endswith("epsilon") and (bad := next((v for v in values if v < 0), None)) is not None:
            out.append((f"{name} is {bad:g}; llama.cpp needs an epsilon >= 0 (it aborts otherwise)",
                        _RECONVERT))
        elif name == f"{arch}.rope.freq_base" and values and values[0] <= 0:
            out.append((f"{name} is {values[0]:g}, not a positive number", _RECONVERT))
    return out


def _head_problems(md: dict[str, Any], arch: str, n_layer: int | None, n_embd: int | None) -> list[_Problem]:
    """Head counts (scalars or per-layer arrays) against each other and the embedding size."""
    k_head, k_kv = f"{arch}.attention.head_count", f"{arch}.attention.head_count_kv"
    heads = md.get(k_head)
    heads_kv = md.get(k_kv, heads)
    if heads is None or not n_layer or n_layer > _LLAMA_MAX_LAYERS:
        return []  # no attention heads (e.g. mamba), or already reported
    for name, value in ((k_head, heads), (k_kv, heads_kv)):
        if isinstance(value, list):
            if len(value) != n_layer:
                return [(f"{name} has {len(value)} per-layer entries but {arch}.block_count is {n_layer}",
                         _RECONVERT)]
        elif _scalar_int(value) is None:
            return [(f"{name} is {value!r}, not an integer", _RECONVERT)]
    if arch not in _STRICT_ARCHITECTURES:
        return []  # other loaders may size attention differently; leave their head counts to llama.cpp
    layered = isinstance(heads, list) or isinstance(heads_kv, list)
    for il in range(n_layer if layered else 1):
        h = heads[il] if isinstance(heads, list) else heads
        kv = heads_kv[il] if isinstance(heads_kv, list) else heads_kv
        where = f" at layer {il}" if layered else ""
        if not h:
            continue  # a layer without attention (hybrid models)
        # llama.cpp derives the head size as n_embd / n_head unless key_length is given
        if n_embd and f"{arch}.attention.key_length" not in md and n_embd % h:
            return [(f"{k_head} ({h}){where} does not divide {arch}.embedding_length ({n_embd})",
                     f"the metadata is inconsistent; {_RECONVERT}")]
        if not layered and kv == 0:
            return [(f"{k_kv} is 0 while {k_head} is {h}", _RECONVERT)]
        if kv and h % kv:
            return [(f"{k_kv} ({kv}){where} does not divide {k_head} ({h})", _RECONVERT)]
    return []


def _tokenizer_problems(info: GGUFInfo) -> list[_Problem]:
    md = info.metadata
    model = info.tokenizer_model
    specli_needs = "specli needs the model's own vocabulary; use a GGUF converted together with its tokenizer"
    if _TOKENS_KEY not in md:
        return [(f"no tokenizer in the file ({_TOKENS_KEY} is missing)", specli_needs)]
    if "tokenizer.ggml.model" not in md:
        return [("no tokenizer in the file (tokenizer.ggml.model is missing)", specli_needs)]
    if model in _NO_TOKENIZER:
        return [(f"no tokenizer in the file (tokenizer.ggml.model is {model!r})", specli_needs)]
    out: list[_Problem] = []
    if model not in _KNOWN_TOKENIZERS:
        known = ", ".join(sorted(_KNOWN_TOKENIZERS))
        out.append((f"unknown tokenizer model {model!r} (llama.cpp knows {known})",
                    "upgrade llama-cpp-python or use another model"))
    if info.metadata_types.get(_TOKENS_KEY) != "array[string]":
        out.append((f"{_TOKENS_KEY} is {info.metadata_types.get(_TOKENS_KEY)}, not an array of strings",
                    _RECONVERT))
        return out
    n_vocab = info.vocab_size or 0
    if n_vocab == 0:
        out.append((f"the vocabulary is empty ({_TOKENS_KEY} has no entries)", _RECONVERT))
        return out
    if info.duplicate_tokens:
        dup, first = info.duplicate_tokens[0]
        out.append((f"the vocabulary has duplicate tokens (id {dup} repeats id {first}), "
                    "which makes llama.cpp abort", _RECONVERT))
    for arr_key in ("tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
        arr = md.get(arr_key)
        if isinstance(arr, (list, ArrayInfo)) and len(arr) < n_vocab:
            out.append((f"{arr_key} has {len(arr)} entries for {n_vocab} tokens", _RECONVERT))
    out += _byte_token_problems(info)
    # a tokenizer told to add BOS/EOS without a usable id trips a GGML_ASSERT while tokenizing
    default_bos, default_eos = {"llama": (1, 2), "bert": (101, None)}.get(model or "", (None, None))
    for flag, id_key, default, label in (
        ("tokenizer.ggml.add_bos_token", "tokenizer.ggml.bos_token_id", default_bos, "BOS"),
        ("tokenizer.ggml.add_eos_token", "tokenizer.ggml.eos_token_id", default_eos, "EOS"),
    ):
        if md.get(flag) is not True:
            continue
        tok_id = _scalar_int(md.get(id_key))
        if tok_id is None or not 0 <= tok_id < n_vocab:
            tok_id = default if default is not None and default < n_vocab else None
        if tok_id is None:
            out.append((f"{flag} is true but {id_key} ({md.get(id_key)!r}) is missing or outside the "
                        f"{n_vocab}-token vocabulary, so llama.cpp would abort adding {label}", _RECONVERT))
    return out


def _byte_token_facts(tokens: list[bytes], types: Any,
                      model: str | None) -> tuple[list[int], tuple[int, str] | None]:
    """What llama.cpp's vocabulary (src/llama-vocab.cpp) looks up by text and would abort on:

    - An SPM tokenizer ("llama") spells every piece it has no token for as bytes: byte_to_token()
      looks up "<0xNN>", then the bare byte, with unordered_map::at, whose std::out_of_range kills
      the process from inside llama_tokenize. Returns the byte values with neither token.
    - token_to_piece() reads a BYTE-typed token's value from its text ("<0xNN>"[3:5]); a WPM
      tokenizer aborts on any BYTE token. Returns the first such token that would fail, and why.
    """
    missing: list[int] = []
    if model == "llama":
        known = set(tokens)
        missing = [b for b in range(256) if f"<0x{b:02X}>".encode() not in known and bytes([b]) not in known]
    bad = None
    if isinstance(types, list):
        for i, (text, kind) in enumerate(zip(tokens, types, strict=False)):
            if kind != _TOKEN_TYPE_BYTE:
                continue
            if model == "bert":
                bad = (i, "is typed BYTE, which llama.cpp's WPM tokenizer aborts on")
                break
            if not _BYTE_TOKEN_RE.fullmatch(text):
                shown = text[:20].decode("utf-8", errors="replace")
                bad = (i, f"is typed BYTE but its text {shown!r} is not of the form <0xNN>, "
                          "which llama.cpp reads the byte from")
                break
    return missing, bad


def _byte_token_problems(info: GGUFInfo) -> list[_Problem]:
    out: list[_Problem] = []
    missing = info.missing_byte_tokens
    if missing:
        shown = ", ".join(f"<0x{b:02X}>" for b in missing[:3]) + (", ..." if len(missing) > 3 else "")
        out.append((f"the SPM vocabulary lacks byte tokens for {len(missing)} of the 256 byte values "
                    f"({shown}); llama.cpp aborts when a text needs them",
                    f"the vocabulary is damaged or incomplete; {_RECONVERT}"))
    if info.bad_byte_token is not None:
        i, why = info.bad_byte_token
        out.append((f"token {i} {why}", _RECONVERT))
    return out


def _tensor_table_problems(info: GGUFInfo, arch: str) -> list[_Problem]:
    out: list[_Problem] = []
    n_layer = info.n_layer
    mismatch = f"the metadata does not match the weights; {_RECONVERT}"
    tensors = info.all_tensors
    if info.split_count > 1 and (info.split_index != 0 or info.missing_shards):
        return out  # the tensor table is incomplete; _split_problems already says why
    blocks = {int(m.group(1)) for t in tensors if (m := _BLK_RE.match(t.name))}
    if n_layer and 0 < n_layer <= _LLAMA_MAX_LAYERS and blocks:
        beyond = sorted(b for b in blocks if b >= n_layer)
        if beyond:
            out.append((f"tensor blk.{beyond[-1]}.* exists but {arch}.block_count is {n_layer}", mismatch))
        elif arch in _STRICT_ARCHITECTURES and len(blocks) != n_layer:
            absent = sorted(set(range(n_layer)) - blocks)
            out.append((f"{arch}.block_count is {n_layer} but the tensors cover {len(blocks)} layers "
                        f"(blk.{absent[0]}.* is missing)", mismatch))
    if arch not in _STRICT_ARCHITECTURES or not tensors:
        return out
    emb = next((t for t in tensors if t.name == "token_embd.weight"), None)
    if emb is None:
        out.append(("tensor token_embd.weight is missing", _RECONVERT))
    elif len(emb.shape) != 2:
        out.append((f"token_embd.weight has shape {list(emb.shape)}, expected 2 dimensions", _RECONVERT))
    else:
        if info.n_embd and emb.shape[0] != info.n_embd:
            out.append((f"token_embd.weight has {emb.shape[0]} columns but {arch}.embedding_length is "
                        f"{info.n_embd}", mismatch))
        if info.vocab_size and emb.shape[1] != info.vocab_size:
            out.append((f"token_embd.weight has {emb.shape[1]} rows but the vocabulary has "
                        f"{info.vocab_size} tokens",
                        f"the tokenizer does not belong to these weights; {_RECONVERT}"))
    return out
