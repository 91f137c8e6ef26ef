"""Writing llama-architecture GGUF files that llama.cpp loads, from numpy weights.

:func:`write_llama_gguf` takes a :class:`LlamaSpec` (hyperparameters), a :class:`~specli_synth.vocab.Vocab`
and a mapping of tensor name to numpy array, or to a zero-argument callable returning one (big models are
then generated and written one tensor at a time). The helpers below it (tensor encodings, the vocabulary
keys, writing the tensors under a temporary name) are shared with :mod:`specli_synth.hybrid`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from specli_synth.vocab import Vocab

ProgressCallback = Callable[[str, float], None]
"""``progress(stage, fraction)``: *stage* is a short human-readable label, *fraction* in [0, 1]."""

WeightDType = Literal["f32", "f16", "q8_0"]
StoredDType = Literal["f32", "f16", "q8_0", "i64"]  # i64: index tables (a drafter's d2t)


@dataclass(frozen=True)
class LlamaSpec:
    """Hyperparameters of a llama-architecture model (what goes into the ``llama.*`` GGUF keys)."""

    n_vocab: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_ctx_train: int = 4096
    rope_theta: float = 10000.0
    rms_eps: float = 1e-6
    name: str = "specli-synth"

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd {self.n_embd} is not a multiple of n_head {self.n_head}")
        if self.n_head % self.n_head_kv:
            raise ValueError(f"n_head {self.n_head} is not a multiple of n_head_kv {self.n_head_kv}")
        if (self.n_embd // self.n_head) % 2:
            raise ValueError("head dimension must be even (RoPE rotates pairs)")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """GGUF tensor names and their numpy shapes, in file order.

        Numpy shapes are (out_features, in_features) as in PyTorch; GGUF stores dimensions reversed,
        so ``token_embd.weight`` of numpy shape (n_vocab, n_embd) is ``{n_embd, n_vocab}`` for llama.cpp.
        """
        d, hd = self.n_embd, self.head_dim
        shapes: dict[str, tuple[int, ...]] = {
            "token_embd.weight": (self.n_vocab, d),
            "output_norm.weight": (d,),
            "output.weight": (self.n_vocab, d),
        }
        for i in range(self.n_layer):
            shapes |= {
                f"blk.{i}.attn_norm.weight": (d,),
                f"blk.{i}.attn_q.weight": (self.n_head * hd, d),
                f"blk.{i}.attn_k.weight": (self.n_head_kv * hd, d),
                f"blk.{i}.attn_v.weight": (self.n_head_kv * hd, d),
                f"blk.{i}.attn_output.weight": (d, self.n_head * hd),
                f"blk.{i}.ffn_norm.weight": (d,),
                f"blk.{i}.ffn_gate.weight": (self.n_ff, d),
                f"blk.{i}.ffn_up.weight": (self.n_ff, d),
                f"blk.{i}.ffn_down.weight": (d, self.n_ff),
            }
        return shapes

    def n_params(self) -> int:
        """Number of weights."""
        return sum(int(np.prod(s)) for s in self.tensor_shapes().values())


def write_llama_gguf(
    path: str | Path,
    spec: LlamaSpec,
    vocab: Vocab,
    weights: Mapping[str, np.ndarray | Callable[[], np.ndarray]],
    *,
    dtype: WeightDType = "f16",
    chat_template: str | None = None,
    progress: ProgressCallback | None = None,
) -> Path:
    """Write a llama-architecture GGUF file that llama.cpp loads.

    *weights* maps every name of :meth:`LlamaSpec.tensor_shapes` to an array of that numpy shape, or to
    a zero-argument callable producing it (called once, in file order, so only one tensor is in memory
    at a time). ``output.weight`` may be omitted (llama.cpp then ties it to ``token_embd.weight``).
    1-D tensors (norm weights) are always stored as F32; matrices as *dtype* (``q8_0`` needs row
    lengths that are multiples of 32). The vocabulary is written as ``tokenizer.ggml.model = "llama"``
    with ``add_bos_token = true`` and ``add_eos_token = false``.
    """
    if len(vocab) != spec.n_vocab:
        raise ValueError(f"vocabulary has {len(vocab)} tokens but spec.n_vocab is {spec.n_vocab}")
    shapes = spec.tensor_shapes()
    if "output.weight" not in weights:
        del shapes["output.weight"]
    unknown = sorted(set(weights) - set(shapes))
    missing = sorted(set(shapes) - set(weights))
    if unknown or missing:
        raise ValueError(f"weights do not match spec: missing {missing[:5]}, unknown {unknown[:5]}")

    path = Path(path)
    writer, partial = open_writer(path, "llama", spec.name, spec.n_vocab, dtype)
    add_attention_keys(writer, spec.n_ctx_train, spec.n_embd, spec.n_layer, spec.n_ff, spec.n_head,
                       spec.n_head_kv, spec.head_dim, spec.rope_theta, spec.rms_eps)

    add_spm_vocab(writer, vocab)
    if chat_template is not None:
        writer.add_chat_template(chat_template)

    stored_dtype = {name: ("f32" if len(shape) == 1 else dtype) for name, shape in shapes.items()}
    return write_tensors(writer, path, partial, shapes, stored_dtype, weights, progress)


def open_writer(path: Path, arch: str, name: str, n_vocab: int, dtype: WeightDType) -> tuple[Any, Path]:
    """A gguf.GGUFWriter of architecture *arch* on a temporary file beside *path* (write_tensors
    renames it into place when complete), with the general keys; returns (writer, temporary path)."""
    import gguf

    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    writer = gguf.GGUFWriter(partial, arch)
    writer.add_name(name)
    writer.add_file_type(llama_ftype(dtype))
    if dtype == "q8_0":
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_vocab_size(n_vocab)
    return writer, partial


def add_attention_keys(writer: Any, n_ctx_train: int, n_embd: int, n_layer: int, n_ff: int, n_head: int,
                       n_head_kv: int, head_dim: int, rope_theta: float, rms_eps: float, *,
                       key_length: bool = False) -> None:
    """The hyperparameter keys of a stack of attention blocks with RMS norms and RoPE over whole heads
    (*key_length*: state the head size, for a model whose heads are not n_embd / n_head wide)."""
    writer.add_context_length(n_ctx_train)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    if key_length:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(rope_theta)
    writer.add_layer_norm_rms_eps(rms_eps)


def llama_ftype(dtype: WeightDType) -> int:
    """The ``general.file_type`` (llama_ftype) value of a file whose matrices are *dtype*."""
    return {"f32": 0, "f16": 1, "q8_0": 7}[dtype]


def add_spm_vocab(writer: Any, vocab: Vocab) -> None:
    """The vocabulary keys: ``tokenizer.ggml.model = "llama"`` (SentencePiece), BOS added, EOS not."""
    writer.add_tokenizer_model("llama")
    writer.add_token_list(list(vocab.tokens))
    writer.add_token_scores([float(s) for s in vocab.scores])
    writer.add_token_types([int(t) for t in vocab.token_types])
    writer.add_unk_token_id(vocab.unk_id)
    writer.add_bos_token_id(vocab.bos_id)
    writer.add_eos_token_id(vocab.eos_id)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)


def write_tensors(
    writer: Any,
    path: Path,
    partial: Path,
    shapes: Mapping[str, tuple[int, ...]],
    stored_dtype: Mapping[str, StoredDType],
    weights: Mapping[str, np.ndarray | Callable[[], np.ndarray]],
    progress: ProgressCallback | None = None,
) -> Path:
    """Finish a file whose metadata keys *writer* (a ``gguf.GGUFWriter`` on *partial*) holds: the tensor
    table, then each tensor of *shapes* in order, encoded as *stored_dtype* says. *partial* is renamed
    to *path* when complete and removed on any failure, so no truncated model is ever left behind."""
    for name, shape in shapes.items():
        add_tensor_info(writer, name, shape, stored_dtype[name])

    total = sum(int(np.prod(s)) for s in shapes.values())
    done = 0
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for name, shape in shapes.items():
            source = weights[name]
            array = np.asarray(source() if callable(source) else source)
            if array.shape != shape:
                raise ValueError(f"{name}: expected numpy shape {shape}, got {array.shape}")
            if array.dtype.kind == "f" and not np.all(np.isfinite(array)):
                raise ValueError(f"{name}: non-finite values")
            writer.write_tensor_data(encode_tensor(array, stored_dtype[name]))
            done += array.size
            if progress is not None:
                progress(f"writing {path.name}", done / total)
        writer.close()
        partial.replace(path)
    except BaseException:
        writer.close()
        partial.unlink(missing_ok=True)
        raise
    return path


def add_tensor_info(writer: Any, name: str, shape: tuple[int, ...], dtype: StoredDType) -> None:
    import gguf

    n = int(np.prod(shape))
    if dtype == "i64":
        writer.add_tensor_info(name, shape, np.dtype(np.int64), n * 8,
                               raw_dtype=gguf.GGMLQuantizationType.I64)
    elif dtype == "f32":
        writer.add_tensor_info(name, shape, np.dtype(np.float32), n * 4)
    elif dtype == "f16":
        writer.add_tensor_info(name, shape, np.dtype(np.float16), n * 2)
    else:
        if shape[-1] % 32:
            raise ValueError(f"{name}: q8_0 needs a row length that is a multiple of 32, got {shape}")
        nbytes = n // 32 * 34  # per block of 32: one f16 scale + 32 int8
        writer.add_tensor_info(
            name, shape, np.dtype(np.float32), nbytes, raw_dtype=gguf.GGMLQuantizationType.Q8_0
        )


def encode_tensor(array: np.ndarray, dtype: StoredDType) -> np.ndarray:
    if dtype == "i64":
        return np.ascontiguousarray(array, dtype=np.int64)
    if dtype == "f32":
        return np.ascontiguousarray(array, dtype=np.float32)
    if dtype == "f16":
        if np.abs(array).max(initial=0.0) > 60000:
            raise ValueError("value too large for f16")
        return np.ascontiguousarray(array, dtype=np.float16)
    return _quantize_q8_0(np.asarray(array, dtype=np.float32))


def _quantize_q8_0(array: np.ndarray) -> np.ndarray:
    """Q8_0 blocks as raw bytes: per 32 values an f16 scale (max |x| / 127) then 32 int8."""
    blocks = array.reshape(-1, 32)
    scale = np.abs(blocks).max(axis=1, keepdims=True) / 127.0
    with np.errstate(divide="ignore", invalid="ignore"):
        quants = np.where(scale > 0, blocks / scale, 0.0)
    quants = np.round(quants).astype(np.int8)
    packed = np.empty((blocks.shape[0], 34), dtype=np.uint8)
    packed[:, :2] = scale.astype(np.float16).view(np.uint8)
    packed[:, 2:] = quants.view(np.uint8)
    return packed.reshape(-1)


