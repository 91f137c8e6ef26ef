from __future__ import annotations

import os
import random
import shutil
import zipfile
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from support import BYTE_TOKENS, DEFAULT_TOKENS, N_VOCAB, OMIT, write_gguf
from support import SHARED_MODELS_DIR as SHARED_MODELS
from support import STORIES_DRAFT as DRAFT
from support import STORIES_TARGET as STORIES

from specli import gguf_info
from specli.gguf_info import (
    HYBRID_ARCHITECTURES,
    RECURRENT_ARCHITECTURES,
    SUPPORTED_ARCHITECTURES,
    GGUFError,
    check_gguf,
    human_count,
    human_size,
    read_gguf_info,
    validate_gguf,
)


def error_of(path: Path) -> str:
    with pytest.raises(GGUFError) as exc:
        validate_gguf(path)
    message = str(exc.value)
    assert "\n" not in message
    assert message.startswith(str(path))
    return message


# --------------------------------------------------------------------------------------------------
# happy path
# --------------------------------------------------------------------------------------------------


def test_valid_file_fields(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "ok.gguf")
    info = validate_gguf(path)
    assert info.path == path
    assert info.file_size == path.stat().st_size
    assert info.version == 3
    assert info.architecture == "llama"
    assert info.name == "tiny test model"
    assert info.n_layer == 2 and info.n_embd == 16 and info.n_head == 4 and info.n_head_kv == 2
    assert info.context_length == 128
    assert info.vocab_size == N_VOCAB
    assert info.tokenizer_model == "llama"
    assert (info.bos_token_id, info.eos_token_id) == (1, 2)
    assert info.chat_template and "messages" in info.chat_template
    assert info.file_type == 0 and info.quantization == "F32"
    assert info.n_tensors == 4
    assert info.n_params == N_VOCAB * 16 + 16 + 2 * 16
    assert info.alignment == 32 and info.data_offset % 32 == 0
    assert not info.is_recurrent and not info.is_hybrid and not info.is_diffusion
    assert info.tensors[0].name == "token_embd.weight" and info.tensors[0].shape == (16, N_VOCAB)
    assert check_gguf(info) == []


def test_read_accepts_str_and_gives_same_fingerprint_for_same_vocab(tmp_path: Path) -> None:
    a = read_gguf_info(str(write_gguf(tmp_path / "a.gguf")))
    b = read_gguf_info(write_gguf(tmp_path / "b.gguf", n_embd=32, n_layer=3))
    other_vocab = ["x", "<s>", "</s>", *BYTE_TOKENS] + [f"u{i}" for i in range(29)]
    c = read_gguf_info(write_gguf(tmp_path / "c.gguf", tokens=other_vocab))
    assert a.vocab_fingerprint == b.vocab_fingerprint != c.vocab_fingerprint


def test_custom_alignment(tmp_path: Path) -> None:
    info = validate_gguf(write_gguf(tmp_path / "a.gguf", alignment=64))
    assert info.alignment == 64 and info.data_offset % 64 == 0


def test_quantization_guessed_without_file_type(tmp_path: Path) -> None:
    path = tmp_path / "q.gguf"
    w = gguf.GGUFWriter(path, "llama")
    w.add_tensor("token_embd.weight", np.zeros((4, 16), dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    info = read_gguf_info(path)
    assert info.file_type is None and info.quantization == "F16"


@pytest.mark.skipif(not STORIES.exists(), reason=f"{STORIES} not present (only on the dev machine)")
def test_real_stories_model() -> None:
    info = validate_gguf(STORIES)
    assert info.architecture == "llama"
    assert info.n_params == 292_800
    assert (info.n_layer, info.n_embd, info.n_head, info.n_head_kv) == (5, 64, 8, 4)
    assert info.vocab_size == 512
    assert (info.bos_token_id, info.eos_token_id) == (1, 2)
    assert info.tokenizer_model == "llama"
    assert info.context_length == 2048
    assert info.n_tensors == 48
    assert not info.is_recurrent and not info.is_hybrid and not info.is_diffusion


@pytest.mark.skipif(not DRAFT.exists() or not STORIES.exists(), reason=f"{SHARED_MODELS} not present")
def test_real_pair_shares_vocabulary() -> None:
    assert validate_gguf(DRAFT).vocab_fingerprint == validate_gguf(STORIES).vocab_fingerprint


# --------------------------------------------------------------------------------------------------
# not a usable file at all
# --------------------------------------------------------------------------------------------------


def test_missing_path(tmp_path: Path) -> None:
    msg = error_of(tmp_path / "nope.gguf")
    assert "no such file" in msg


def test_directory(tmp_path: Path) -> None:
    msg = error_of(tmp_path)
    assert "is a directory" in msg


def test_unreadable_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_gguf(tmp_path / "locked.gguf")

    def deny(*args: Any, **kwargs: Any) -> Any:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(gguf_info, "open", deny, raising=False)
    msg = error_of(path)
    assert "permission denied" in msg


def test_text_file_renamed(tmp_path: Path) -> None:
    path = tmp_path / "notes.gguf"
    path.write_text("hello, this is not a model\nat all\n")
    msg = error_of(path)
    assert "not a GGUF file" in msg and "text" in msg and "expected a llama.cpp .gguf model" in msg


def test_zip_magic(tmp_path: Path) -> None:
    path = tmp_path / "qwen.gguf"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("data.pkl", b"x" * 100)
    msg = error_of(path)
    assert "not a GGUF file (magic b'PK\\x03\\x04'" in msg
    assert "expected a llama.cpp .gguf model" in msg


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.gguf"
    path.write_bytes(b"")
    assert "empty file" in error_of(path)


def test_git_lfs_pointer(tmp_path: Path) -> None:
    path = tmp_path / "lfs.gguf"
    path.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 123\n")
    msg = error_of(path)
    assert "Git LFS pointer" in msg and "git lfs pull" in msg


def test_html_download(tmp_path: Path) -> None:
    path = tmp_path / "page.gguf"
    path.write_text("<!DOCTYPE html><html><body>Hugging Face</body></html>")
    assert "HTML page" in error_of(path)


@pytest.mark.parametrize(("version", "expected"), [
    (1, "version 1 is no longer supported"),
    (4, "unsupported GGUF version 4"),
    (0x03000000, "big-endian"),
])
def test_unsupported_version(tmp_path: Path, version: int, expected: str) -> None:
    path = write_gguf(tmp_path / "v.gguf")
    data = bytearray(path.read_bytes())
    data[4:8] = version.to_bytes(4, "little")
    path.write_bytes(bytes(data))
    assert expected in error_of(path)


def test_truncated_copy(tmp_path: Path) -> None:
    good = write_gguf(tmp_path / "good.gguf")
    bad = tmp_path / "bad.gguf"
    data = good.read_bytes()
    bad.write_bytes(data[: len(data) - 1000])
    msg = error_of(bad)
    assert "truncated" in msg and "re-download" in msg
    # the header is intact, so the file can still be described (e.g. by `specli models`)
    assert read_gguf_info(bad).architecture == "llama"


def test_truncated_inside_header(tmp_path: Path) -> None:
    good = write_gguf(tmp_path / "good.gguf")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(good.read_bytes()[:200])
    with pytest.raises(GGUFError) as exc:
        read_gguf_info(bad)
    assert "ends in the middle of" in str(exc.value) and "re-download" in str(exc.value)


def test_garbage_never_escapes_as_another_exception(tmp_path: Path) -> None:
    """Random byte flips in the header: every failure is a one-line GGUFError, and most mutated
    files are refused (counted, so a validator that accepts anything fails here). A BPE vocabulary
    of 32 tokens keeps the header mostly structure (counts, lengths, types, shapes) rather than text."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(29)]
    good = write_gguf(tmp_path / "good.gguf", tokenizer="gpt2", tokens=tokens).read_bytes()
    header_len = read_gguf_info(tmp_path / "good.gguf").data_offset
    rng = random.Random(1234)
    path = tmp_path / "fuzz.gguf"
    mutated = rejected = 0
    for _ in range(300):
        data = bytearray(good)
        for _ in range(rng.randint(1, 8)):
            pos = rng.randrange(4, header_len)
            data[pos] = rng.randrange(256)
        if rng.random() < 0.3:
            data = data[: rng.randrange(4, len(data))]
        if bytes(data) == good:
            continue
        mutated += 1
        path.write_bytes(bytes(data))
        try:
            validate_gguf(path)
        except GGUFError as e:
            rejected += 1
            assert "\n" not in str(e)
    assert mutated >= 290
    # Measured: 283 of 300 refused (seeded, so the same every run); the rest flipped a byte inside a
    # name or the chat template, which leaves a valid file.
    assert rejected >= 0.85 * mutated, (rejected, mutated)


# --------------------------------------------------------------------------------------------------
# metadata / tensor table problems
# --------------------------------------------------------------------------------------------------


def _raw_vocab_edit(src: Path, dst: Path, old: bytes, new: bytes) -> Path:
    """Copy `src` replacing `old` by `new` (same length) in the header only, so offsets stay valid."""
    assert len(old) == len(new)
    data = src.read_bytes()
    end = read_gguf_info(src).data_offset
    dst.write_bytes(data[:end].replace(old, new) + data[end:])
    return dst


def test_spm_vocabulary_without_byte_tokens(tmp_path: Path) -> None:
    # llama.cpp's SPM tokenizer spells unknown text as <0xNN> tokens, looked up with .at(): a vocabulary
    # without them aborts the process on the first such prompt
    renamed = ["<unk>", "<s>", "</s>", *[f"<1x{b:02X}>" for b in range(256)]] + [f"t{i}" for i in range(29)]
    msg = error_of(write_gguf(tmp_path / "nobytes.gguf", tokens=renamed))
    assert "lacks byte tokens for 256 of the 256 byte values" in msg
    some = [*DEFAULT_TOKENS]
    some[3 + 0x0A] = "<newline>"
    assert "lacks byte tokens for 1 of the 256" in error_of(write_gguf(tmp_path / "nonl.gguf", tokens=some))
    # the bare byte is llama.cpp's fallback: a vocabulary spelling "\n" as itself is fine
    some[3 + 0x0A] = "\n"
    validate_gguf(write_gguf(tmp_path / "bare.gguf", tokens=some))
    # a BPE vocabulary looks bytes up differently and never at tokenization time
    validate_gguf(write_gguf(tmp_path / "bpe.gguf", tokenizer="gpt2", tokens=renamed))


def test_byte_typed_token_needs_its_hex_text(tmp_path: Path) -> None:
    types = [3, 3, 3, *[6] * 256, *[1] * 29]
    validate_gguf(write_gguf(tmp_path / "ok.gguf", extra={"tokenizer.ggml.token_type": types}))
    tokens = [*DEFAULT_TOKENS]
    tokens[3 + 0x41], tokens[-1] = "A", "<0x41>"  # byte token 0x41 spelled by the bare byte, still BYTE
    msg = error_of(write_gguf(tmp_path / "bad.gguf", tokens=tokens,
                              extra={"tokenizer.ggml.token_type": types}))
    assert "token 68 is typed BYTE but its text 'A' is not of the form <0xNN>" in msg


@pytest.mark.skipif(not STORIES.exists(), reason=f"{STORIES} not present (only on the dev machine)")
def test_real_model_with_renamed_byte_tokens(tmp_path: Path) -> None:
    bad = _raw_vocab_edit(STORIES, tmp_path / "renamed.gguf", b"<0x", b"<1x")
    msg = error_of(bad)
    assert "lacks byte tokens" in msg


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_fifo_and_devices_are_not_opened(tmp_path: Path) -> None:
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)  # opening it for reading would block forever: no writer
    assert "is a named pipe (FIFO), not a regular file" in error_of(fifo)
    if Path("/dev/zero").exists():
        msg = str(pytest.raises(GGUFError, validate_gguf, "/dev/zero").value)
        assert "is a character device, not a regular file" in msg and "re-download" not in msg


def test_head_count_not_dividing_embedding(tmp_path: Path) -> None:
    msg = error_of(write_gguf(tmp_path / "h.gguf", n_head=5, n_head_kv=5))
    assert "llama.attention.head_count (5) does not divide llama.embedding_length (16)" in msg


def test_head_count_kv_not_dividing_head_count(tmp_path: Path) -> None:
    msg = error_of(write_gguf(tmp_path / "h.gguf", n_head=4, n_head_kv=3))
    assert "llama.attention.head_count_kv (3) does not divide llama.attention.head_count (4)" in msg


def test_per_layer_head_counts(tmp_path: Path) -> None:
    ok = write_gguf(tmp_path / "ok.gguf", n_head=[4, 0], n_head_kv=[2, 0])
    assert validate_gguf(ok).n_head == 4
    bad = write_gguf(tmp_path / "bad.gguf", n_head=[4, 4, 4], n_head_kv=2)
    assert "per-layer entries" in error_of(bad)


def test_unknown_architecture(tmp_path: Path) -> None:
    msg = error_of(write_gguf(tmp_path / "foo.gguf", arch="foo"))
    assert "architecture 'foo' is not supported" in msg and "llama.cpp" in msg


def test_misspelt_architecture_gets_suggestion(tmp_path: Path) -> None:
    assert "did you mean 'llama'" in error_of(write_gguf(tmp_path / "x.gguf", arch="lama"))


def test_missing_architecture(tmp_path: Path) -> None:
    path = tmp_path / "noarch.gguf"
    w = gguf.GGUFWriter(path, "llama")
    del w.kv_data[0]["general.architecture"]
    w.add_tokenizer_model("llama")
    w.add_token_list(["a", "b", "c"])
    w.add_tensor("token_embd.weight", np.zeros((3, 16), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert "general.architecture is missing" in error_of(path)


def test_missing_tokens(tmp_path: Path) -> None:
    msg = error_of(write_gguf(tmp_path / "t.gguf", tokens=OMIT))
    assert "no tokenizer" in msg and "tokenizer.ggml.tokens is missing" in msg


def test_tokenizer_model_none(tmp_path: Path) -> None:
    msg = error_of(write_gguf(tmp_path / "t.gguf", tokenizer="none"))
    assert "no tokenizer" in msg and "'none'" in msg


def test_unknown_tokenizer_model(tmp_path: Path) -> None:
    assert "unknown tokenizer model 'sentencepiece9'" in error_of(
        write_gguf(tmp_path / "t.gguf", tokenizer="sentencepiece9"))


@pytest.mark.parametrize("key", ["block_count", "embedding_length", "context_length"])
def test_missing_required_key(tmp_path: Path, key: str) -> None:
    kwargs: dict[str, Any] = {"block_count": {"n_layer": OMIT}, "embedding_length": {"n_embd": OMIT},
                              "context_length": {"ctx": OMIT}}[key]
    msg = error_of(write_gguf(tmp_path / "k.gguf", **kwargs))
    assert f"required metadata missing: llama.{key}" in msg


def test_zero_block_count(tmp_path: Path) -> None:
    msg = error_of(write_gguf(tmp_path / "z.gguf", n_layer=0, layers=0))
    assert "llama.block_count is 0, not a positive integer" in msg


def test_block_count_smaller_than_tensor_blocks(tmp_path: Path) -> None:
    msg = error_of(write_gguf(tmp_path / "b.gguf", n_layer=2, layers=4))
    assert "tensor blk.3.* exists but llama.block_count is 2" in msg


def test_block_count_larger_than_tensor_blocks(tmp_path: Path) -> None:
    msg = error_of(write_gguf(tmp_path / "b.gguf", n_layer=4, layers=2))
    assert "llama.block_count is 4 but the tensors cover 2 layers (blk.2.* is missing)" in msg


def test_too_many_layers(tmp_path: Path) -> None:
    msg = error_of(write_gguf(tmp_path / "l.gguf", n_layer=600, layers=1))
    assert "above llama.cpp's limit of 512" in msg


def test_token_embd_width_mismatch(tmp_path: Path) -> None:
    msg = error_of(write_gguf(tmp_path / "e.gguf", n_embd=32, n_head=4, embd_shape=(N_VOCAB, 16)))
    assert "token_embd.weight has 16 columns but llama.embedding_length is 32" in msg


def test_token_embd_vocab_mismatch(tmp_path: Path) -> None:
    msg = error_of(write_gguf(tmp_path / "e.gguf", embd_shape=(40, 16)))
    assert f"token_embd.weight has 40 rows but the vocabulary has {N_VOCAB} tokens" in msg


def test_duplicate_tokens(tmp_path: Path) -> None:
    msg = error_of(write_gguf(tmp_path / "d.gguf", tokens=["<unk>", "<s>", "</s>", "a", "b", "a"],
                              embd_shape=(6, 16)))
    assert "duplicate tokens (id 5 repeats id 3)" in msg


def test_add_bos_without_bos_id(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "b.gguf", tokenizer="gpt2", bos=OMIT,
                      extra={"tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.merges": ["a b"]})
    assert "tokenizer.ggml.add_bos_token is true but tokenizer.ggml.bos_token_id" in error_of(path)


def test_inconsistent_experts(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "moe.gguf", extra={"llama.expert_count": 8, "llama.expert_used_count": 9})
    assert "inconsistent mixture-of-experts metadata" in error_of(path)


def test_bad_rope_scaling_type(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "r.gguf", extra={"llama.rope.scaling.type": "dynamic"})
    assert "llama.rope.scaling.type is 'dynamic'" in error_of(path)


def test_no_tensors(tmp_path: Path) -> None:
    assert "contains no tensors" in error_of(write_gguf(tmp_path / "v.gguf", tensors=False))


def test_corrupt_tensor_offset(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "o.gguf")
    info = read_gguf_info(path)
    data = bytearray(path.read_bytes())
    # the offset is the last u64 of the second tensor's info; find it by its known value
    second = info.tensors[1]
    needle = second.offset.to_bytes(8, "little")
    pos = data.index(needle, data.index(b"output_norm.weight"))
    data[pos:pos + 8] = (second.offset + 64).to_bytes(8, "little")
    path.write_bytes(bytes(data))
    assert "corrupt tensor table: 'output_norm.weight' starts at data offset" in error_of(path)


def test_several_problems_are_counted(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf", arch="foo", tokens=OMIT)
    with pytest.raises(GGUFError) as exc:
        validate_gguf(path)
    assert len(exc.value.problems) == 2
    assert str(exc.value).endswith("(and 1 more problem)")


# --------------------------------------------------------------------------------------------------
# recurrent / hybrid / diffusion architectures: valid files, flagged (the refusal to speculate on a
# target that cannot roll back is the engine's, from llama.cpp's own bound: test_hybrid.py)
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["mamba", "rwkv6", "jamba"])
def test_recurrent_and_hybrid_flagged(tmp_path: Path, arch: str) -> None:
    info = validate_gguf(write_gguf(tmp_path / f"{arch}.gguf", arch=arch, n_head=OMIT, n_head_kv=OMIT))
    assert info.is_recurrent
    assert info.is_hybrid == (arch == "jamba")
    assert not info.is_diffusion


def test_diffusion_flagged(tmp_path: Path) -> None:
    info = validate_gguf(write_gguf(tmp_path / "d.gguf", arch="dream"))
    assert info.is_diffusion and not info.is_recurrent


def test_architecture_tables() -> None:
    assert {"llama", "qwen2", "qwen3", "gemma3", "phi3", "mistral3"} <= SUPPORTED_ARCHITECTURES
    assert "clip" not in SUPPORTED_ARCHITECTURES and "(unknown)" not in SUPPORTED_ARCHITECTURES
    assert {"mamba", "mamba2", "rwkv6", "rwkv7"} <= RECURRENT_ARCHITECTURES <= SUPPORTED_ARCHITECTURES
    assert {"jamba", "falcon-h1"} <= HYBRID_ARCHITECTURES <= SUPPORTED_ARCHITECTURES
    assert not RECURRENT_ARCHITECTURES & HYBRID_ARCHITECTURES


def test_human_formatting() -> None:
    assert human_count(292_800) == "292.8K"
    assert human_count(7_615_616_512) == "7.6B"
    assert human_count(12) == "12" and human_count(None) == "?"
    assert human_size(512) == "512 B"
    assert human_size(1_185_376) == "1.1 MiB"
    assert human_size(4_683_073_536) == "4.4 GiB"


def test_copy_of_real_model_truncated(tmp_path: Path) -> None:
    if not STORIES.exists():
        pytest.skip(f"{STORIES} not present (only on the dev machine)")
    bad = tmp_path / "stories-partial.gguf"
    shutil.copyfile(STORIES, bad)
    with open(bad, "r+b") as f:
        f.truncate(STORIES.stat().st_size // 2)
    msg = error_of(bad)
    assert "truncated" in msg and "missing" in msg


# --------------------------------------------------------------------------------------------------
# split models (NAME-00001-of-0000N.gguf)
# --------------------------------------------------------------------------------------------------


def write_split(directory: Path) -> list[Path]:
    w = gguf.GGUFWriter(directory / "m.gguf", "llama", split_max_tensors=2)
    w.add_block_count(2)
    w.add_context_length(128)
    w.add_embedding_length(16)
    w.add_head_count(4)
    w.add_tokenizer_model("llama")
    w.add_token_list(DEFAULT_TOKENS)
    w.add_tensor("token_embd.weight", np.zeros((N_VOCAB, 16), dtype=np.float32))
    w.add_tensor("output_norm.weight", np.zeros(16, dtype=np.float32))
    for i in range(2):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.zeros(16, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return sorted(directory.glob("m-*.gguf"))


def test_split_model_reads_all_parts(tmp_path: Path) -> None:
    first, second = write_split(tmp_path)
    assert first.name == "m-00001-of-00002.gguf"
    info = validate_gguf(first)
    assert info.split_count == 2 and [s.path for s in info.shards] == [second]
    assert info.n_params == N_VOCAB * 16 + 3 * 16
    sizes = [info.file_size, *(s.file_size for s in info.shards)]
    assert sizes == [first.stat().st_size, second.stat().st_size]


def test_split_model_later_part_given(tmp_path: Path) -> None:
    _, second = write_split(tmp_path)
    msg = error_of(second)
    assert "part 2 of 2 of a split model" in msg and "m-00001-of-00002.gguf" in msg
    assert "more problem" not in msg


def test_split_model_missing_part(tmp_path: Path) -> None:
    first, second = write_split(tmp_path)
    second.unlink()
    assert "1 of its 2 parts are missing (m-00002-of-00002.gguf)" in error_of(first)


def test_head_checks_only_for_known_layouts(tmp_path: Path) -> None:
    # gpt-oss sizes heads from attention.key_length; we don't second-guess architectures we have not checked
    info = validate_gguf(write_gguf(tmp_path / "g.gguf", arch="gpt-oss", n_head=5, n_head_kv=5))
    assert info.n_head == 5
