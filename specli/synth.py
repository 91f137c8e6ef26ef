"""Synthetic llama-architecture GGUF models, written from numpy weights.

Three levels, from general to specific:

* :func:`write_llama_gguf` writes any ``llama``-architecture GGUF file from a :class:`LlamaSpec`
  (hyperparameters), a :class:`Vocab` (SentencePiece-style ``tokenizer.ggml.model = "llama"``
  vocabulary with the 256 byte-fallback tokens) and a mapping of tensor name to numpy array, or to a
  zero-argument callable returning one (big models are then generated and written one tensor at a time).
* :func:`train_vocab` learns such a vocabulary (BPE merges, scored by merge rank) from text;
  :func:`ngram_factors` factors the text's token bigram and skip-bigram statistics with a truncated SVD;
  :func:`ngram_llama_weights` / :func:`write_ngram_model` turn the factors into a llama model whose
  logits are ``bigram(current) + skip_bigram(previous) + unigram - repetition_penalty(context)``:
  the embedding/output matrices carry the factors (exactly, through llama.cpp's RMS norms), a layer-0
  RoPE previous-token head and a layer-1 uniform-attention head supply the context terms, and every
  other block has small random weights (realistic compute, a little noise).
* :func:`build_fixture_models` / :func:`build_fixture_pair`: tiny models for the test suite (a target,
  a partly-agreeing draft with the same vocabulary, a model with a different vocabulary, a target with
  a chat template), all built in well under a second. :func:`build_demo_pair`: a Qwen2-0.5B-shaped
  target (~25 ms/token on 2 CPU cores) and a ~12x cheaper draft for ``specli demo-models``, learned
  from the Python standard library's docstrings and comments in about 30 seconds.

Everything is deterministic for a given seed (and, for the demo pair, a given Python standard library,
which is its corpus).
"""

from __future__ import annotations

import heapq
import inspect
import re
import sysconfig
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Literal

import numpy as np

ProgressCallback = Callable[[str, float], None]
"""``progress(stage, fraction)``: *stage* is a short human-readable label, *fraction* in [0, 1]."""

WeightDType = Literal["f32", "f16", "q8_0"]

# Token types as llama.cpp reads them from ``tokenizer.ggml.token_type`` (same values as gguf.TokenType).
TOKEN_TYPE_NORMAL = 1
TOKEN_TYPE_UNKNOWN = 2
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_BYTE = 6

SPACE_MARK = "\u2581"  # "▁": SentencePiece's visible space; llama.cpp maps " " to it before tokenizing

# -----------------------------------------------------------------------------------------------------
# Specs and GGUF writing
# -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Vocab:
    """A SentencePiece-style vocabulary as stored in GGUF (``tokenizer.ggml.*``)."""

    tokens: tuple[str | bytes, ...]
    scores: tuple[float, ...]
    token_types: tuple[int, ...]
    unk_id: int = 0
    bos_id: int = 1
    eos_id: int = 2

    def __post_init__(self) -> None:
        n = len(self.tokens)
        if len(self.scores) != n or len(self.token_types) != n:
            raise ValueError("tokens, scores and token_types must have the same length")
        if len(set(self.tokens)) != n:
            raise ValueError("duplicate token text in vocabulary")
        for special in (self.unk_id, self.bos_id, self.eos_id):
            if not 0 <= special < n:
                raise ValueError(f"special token id {special} outside vocabulary of {n}")

    def __len__(self) -> int:
        return len(self.tokens)

    def token_id(self, text: str) -> int:
        """Id of the token whose text is exactly *text* (KeyError if absent)."""
        return self.tokens.index(text)


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


def _file_type(dtype: WeightDType) -> int:
    return {"f32": 0, "f16": 1, "q8_0": 7}[dtype]  # llama_ftype values (general.file_type)


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
    import gguf  # imported lazily: only needed when writing

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
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")  # renamed into place when complete
    writer = gguf.GGUFWriter(partial, "llama")
    writer.add_name(spec.name)
    writer.add_file_type(_file_type(dtype))
    if dtype == "q8_0":
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_vocab_size(spec.n_vocab)
    writer.add_context_length(spec.n_ctx_train)
    writer.add_embedding_length(spec.n_embd)
    writer.add_block_count(spec.n_layer)
    writer.add_feed_forward_length(spec.n_ff)
    writer.add_head_count(spec.n_head)
    writer.add_head_count_kv(spec.n_head_kv)
    writer.add_rope_dimension_count(spec.head_dim)
    writer.add_rope_freq_base(spec.rope_theta)
    writer.add_layer_norm_rms_eps(spec.rms_eps)

    writer.add_tokenizer_model("llama")
    writer.add_token_list(list(vocab.tokens))
    writer.add_token_scores([float(s) for s in vocab.scores])
    writer.add_token_types([int(t) for t in vocab.token_types])
    writer.add_unk_token_id(vocab.unk_id)
    writer.add_bos_token_id(vocab.bos_id)
    writer.add_eos_token_id(vocab.eos_id)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    if chat_template is not None:
        writer.add_chat_template(chat_template)

    stored_dtype = {name: ("f32" if len(shape) == 1 else dtype) for name, shape in shapes.items()}
    for name, shape in shapes.items():
        _add_tensor_info(writer, name, shape, stored_dtype[name])

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
            if not np.all(np.isfinite(array)):
                raise ValueError(f"{name}: non-finite values")
            writer.write_tensor_data(_encode_tensor(array, stored_dtype[name]))
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


def _add_tensor_info(writer: object, name: str, shape: tuple[int, ...], dtype: WeightDType) -> None:
    import gguf

    n = int(np.prod(shape))
    if dtype == "f32":
        writer.add_tensor_info(name, shape, np.dtype(np.float32), n * 4)  # type: ignore[attr-defined]
    elif dtype == "f16":
        writer.add_tensor_info(name, shape, np.dtype(np.float16), n * 2)  # type: ignore[attr-defined]
    else:
        if shape[-1] % 32:
            raise ValueError(f"{name}: q8_0 needs a row length that is a multiple of 32, got {shape}")
        nbytes = n // 32 * 34  # per block of 32: one f16 scale + 32 int8
        writer.add_tensor_info(  # type: ignore[attr-defined]
            name, shape, np.dtype(np.float32), nbytes, raw_dtype=gguf.GGMLQuantizationType.Q8_0
        )


def _encode_tensor(array: np.ndarray, dtype: WeightDType) -> np.ndarray:
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


# -----------------------------------------------------------------------------------------------------
# SentencePiece-style vocabulary learned with BPE merges
# -----------------------------------------------------------------------------------------------------

BYTE_TOKENS = tuple(f"<0x{b:02X}>" for b in range(256))
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")

# Pre-tokenization of space-escaped text into the chunks merges may not cross: a word with its leading
# "▁", a single digit, a run of punctuation, a run of spaces (leaving the last one for the next word),
# or one other whitespace character (these become byte tokens, like "\n" in LLaMA's vocabulary).
_CHUNK_RE = re.compile(
    rf"{SPACE_MARK}?[^\W\d_]+"
    rf"|{SPACE_MARK}?\d"
    rf"|{SPACE_MARK}?(?:[^\w\s{SPACE_MARK}]|_)+"
    rf"|{SPACE_MARK}+(?={SPACE_MARK}[^\s{SPACE_MARK}])"
    rf"|{SPACE_MARK}+"
    r"|\s"
)


def _chunks(document: str) -> list[str]:
    """Split a document as llama.cpp sees it (leading space added, spaces escaped) into merge chunks."""
    return _CHUNK_RE.findall(SPACE_MARK + document.replace(" ", SPACE_MARK))


@dataclass(frozen=True)
class TrainedVocab:
    """A learned vocabulary plus its training documents as token ids (for counting statistics)."""

    vocab: Vocab
    documents: tuple[np.ndarray, ...]


def train_vocab(documents: Sequence[str], n_vocab: int, *, min_char_count: int = 2) -> TrainedVocab:
    """Learn an SPM-style vocabulary of exactly *n_vocab* tokens from *documents* with BPE merges.

    Layout (like LLaMA's): ``<unk>``, ``<s>``, ``</s>``, the 256 byte tokens ``<0x00>``..``<0xFF>``,
    the merged pieces in merge order (score ``-rank``, so llama.cpp's highest-score-first SPM merging
    replays them), then the single characters seen at least *min_char_count* times (whitespace other
    than the space is left to byte fallback). Characters outside the vocabulary become byte tokens.
    Raises ValueError when the text has too few distinct pairs to reach *n_vocab*.
    """
    chunk_counts: Counter[str] = Counter()
    char_counts: Counter[str] = Counter()
    doc_chunks = [_chunks(doc) for doc in documents]
    for chunks in doc_chunks:
        chunk_counts.update(chunks)
    for chunk, count in chunk_counts.items():
        for char in chunk:
            char_counts[char] += count
    base_chars = sorted(
        c for c, n in char_counts.items() if n >= min_char_count and (c == SPACE_MARK or not c.isspace())
    )
    n_merges = n_vocab - len(SPECIAL_TOKENS) - len(BYTE_TOKENS) - len(base_chars)
    if n_merges < 0:
        raise ValueError(f"n_vocab {n_vocab} too small for {len(base_chars)} base characters")

    # Symbols are ints: first the byte tokens, then base characters, then merged pieces.
    symbol_text: list[str] = list(BYTE_TOKENS) + base_chars
    char_symbol = {c: 256 + i for i, c in enumerate(base_chars)}
    words = list(chunk_counts)
    word_counts = [chunk_counts[w] for w in words]
    word_symbols: list[list[int]] = []
    for word in words:
        symbols: list[int] = []
        for char in word:
            if char in char_symbol:
                symbols.append(char_symbol[char])
            else:
                symbols.extend(char.encode("utf-8"))  # byte-fallback symbols 0..255 never merge
        word_symbols.append(symbols)

    merged_pieces = _learn_merges(word_symbols, word_counts, symbol_text, n_merges)
    if len(merged_pieces) < n_merges:
        raise ValueError(f"corpus only supports {len(merged_pieces)} merges, {n_merges} needed for {n_vocab}")

    tokens = list(SPECIAL_TOKENS) + list(BYTE_TOKENS) + merged_pieces + base_chars
    scores = [0.0] * (len(SPECIAL_TOKENS) + 256) + [
        -float(i) for i in range(len(merged_pieces) + len(base_chars))
    ]
    types = (
        [TOKEN_TYPE_UNKNOWN, TOKEN_TYPE_CONTROL, TOKEN_TYPE_CONTROL]
        + [TOKEN_TYPE_BYTE] * 256
        + [TOKEN_TYPE_NORMAL] * (len(merged_pieces) + len(base_chars))
    )
    vocab = Vocab(tuple(tokens), tuple(scores), tuple(types))

    token_of_text = {text: i for i, text in enumerate(tokens)}
    symbol_token = np.array([token_of_text[text] for text in symbol_text], dtype=np.int32)
    word_tokens = {word: symbol_token[symbols] for word, symbols in zip(words, word_symbols, strict=True)}
    encoded = tuple(
        np.concatenate([word_tokens[c] for c in chunks]) if chunks else np.zeros(0, np.int32)
        for chunks in doc_chunks
    )
    return TrainedVocab(vocab, encoded)


def _learn_merges(
    word_symbols: list[list[int]], word_counts: list[int], symbol_text: list[str], n_merges: int
) -> list[str]:
    """BPE on the words in place (word_symbols is rewritten); returns the merged pieces in merge order.

    Pair counts are updated incrementally and the best pair found with a lazily invalidated heap, so
    each merge costs time proportional to the words it touches. Ties break on the symbol ids, which
    makes the result deterministic.
    """
    pair_counts: dict[tuple[int, int], int] = {}
    pair_words: dict[tuple[int, int], set[int]] = {}

    def mergeable(a: int, b: int) -> bool:
        return a >= 256 and b >= 256

    for w, symbols in enumerate(word_symbols):
        count = word_counts[w]
        for pair in zip(symbols, symbols[1:], strict=False):
            if mergeable(*pair):
                pair_counts[pair] = pair_counts.get(pair, 0) + count
                pair_words.setdefault(pair, set()).add(w)
    heap = [(-count, pair) for pair, count in pair_counts.items()]
    heapq.heapify(heap)
    pieces: list[str] = []
    symbol_of_text = {text: i for i, text in enumerate(symbol_text)}
    while len(pieces) < n_merges and heap:
        neg_count, pair = heapq.heappop(heap)
        if pair_counts.get(pair, 0) != -neg_count:
            continue  # stale heap entry
        a, b = pair
        text = symbol_text[a] + symbol_text[b]
        new = symbol_of_text.get(text, -1)
        if new < 0:  # ("ab", "c") and ("a", "bc") both make "abc": one token, two merge paths
            new = len(symbol_text)
            symbol_text.append(text)
            symbol_of_text[text] = new
            pieces.append(text)
        changed: set[tuple[int, int]] = set()
        for w in sorted(pair_words.pop(pair, ())):
            old = word_symbols[w]
            merged: list[int] = []
            i = 0
            while i < len(old):
                if i + 1 < len(old) and old[i] == a and old[i + 1] == b:
                    merged.append(new)
                    i += 2
                else:
                    merged.append(old[i])
                    i += 1
            count = word_counts[w]
            old_pairs = [p for p in zip(old, old[1:], strict=False) if mergeable(*p)]
            new_pairs = [p for p in zip(merged, merged[1:], strict=False) if mergeable(*p)]
            for p in old_pairs:
                pair_counts[p] -= count
                changed.add(p)
            for p in new_pairs:
                pair_counts[p] = pair_counts.get(p, 0) + count
                changed.add(p)
            for p in set(old_pairs) - set(new_pairs):
                if p != pair:
                    pair_words[p].discard(w)
            for p in new_pairs:
                pair_words.setdefault(p, set()).add(w)
            word_symbols[w] = merged
        pair_counts.pop(pair, None)
        for p in sorted(changed):
            count = pair_counts.get(p, 0)
            if count > 0:
                heapq.heappush(heap, (-count, p))
            else:
                pair_counts.pop(p, None)
                pair_words.pop(p, None)
    return pieces


# -----------------------------------------------------------------------------------------------------
# Token statistics -> llama weights
# -----------------------------------------------------------------------------------------------------


def pair_counts(documents: Iterable[np.ndarray], n_vocab: int, bos_id: int, distance: int = 1) -> np.ndarray:
    """Dense (n_vocab, n_vocab) float32 counts of token pairs *distance* apart (row = earlier token).

    Each document is preceded by BOS, so the BOS row holds what documents start with.
    """
    codes = []
    for doc in documents:
        seq = np.concatenate([[bos_id], doc]).astype(np.int64)
        if len(seq) > distance:
            codes.append(seq[:-distance] * n_vocab + seq[distance:])
    all_codes = np.concatenate(codes) if codes else np.zeros(0, np.int64)
    uniq, counts = np.unique(all_codes, return_counts=True)
    matrix = np.zeros((n_vocab, n_vocab), dtype=np.float32)
    matrix.reshape(-1)[uniq] = counts
    return matrix


@dataclass(frozen=True)
class NgramFactors:
    """Low-rank next-token logits: ``logits[next] ~= next_row[cur] @ next_col[next]
    + skip_row[prev] @ skip_col[next] + bias[next]`` (cur = current token, prev = the one before)."""

    next_row: np.ndarray  # (n_vocab, rank) float32
    next_col: np.ndarray
    skip_row: np.ndarray  # (n_vocab, skip_rank) float32, skip_rank may be 0
    skip_col: np.ndarray
    bias: np.ndarray  # (n_vocab,) float32

    def truncated(self, rank: int, skip_rank: int) -> NgramFactors:
        """The leading components only: a cheaper model that approximates this one (SVD order)."""
        return NgramFactors(
            self.next_row[:, :rank],
            self.next_col[:, :rank],
            self.skip_row[:, :skip_rank],
            self.skip_col[:, :skip_rank],
            self.bias,
        )


def ngram_factors(
    documents: Sequence[np.ndarray],
    n_vocab: int,
    bos_id: int,
    *,
    rank: int,
    skip_rank: int = 0,
    skip_weight: float = 0.6,
    sharpness: float = 1.0,
    smoothing: float = 0.5,
    seed: int = 0,
) -> NgramFactors:
    """Factor bigram (and skip-bigram) statistics of *documents* into :class:`NgramFactors`.

    For each distance, ``log P(next | earlier) - log P(next)`` with ``P(next | earlier) =
    (count + smoothing * P(next)) / (n(earlier) + smoothing)``, minus its row mean (softmax ignores
    per-row shifts), is approximated by a randomized truncated SVD. The unigram log-probability is the
    bias. The skip-bigram term is weighted by *skip_weight* (adding both would overcount evidence);
    *sharpness* multiplies all logits (>1 lowers the entropy). Peak memory: two (n_vocab, n_vocab)
    float32 matrices.
    """
    counts = pair_counts(documents, n_vocab, bos_id, 1)
    unigram = counts.sum(axis=0, dtype=np.float64) + 0.1
    unigram /= unigram.sum()
    log_unigram = np.log(unigram).astype(np.float32)
    next_row, next_col = _factor_log_ratio(counts, unigram, rank, smoothing, sharpness, seed)
    if skip_rank > 0:
        counts = pair_counts(documents, n_vocab, bos_id, 2)
        skip_row, skip_col = _factor_log_ratio(
            counts, unigram, skip_rank, smoothing, sharpness * skip_weight, seed + 1
        )
    else:
        skip_row = skip_col = np.zeros((n_vocab, 0), dtype=np.float32)
    return NgramFactors(next_row, next_col, skip_row, skip_col, log_unigram * np.float32(sharpness))


def _factor_log_ratio(
    counts: np.ndarray, unigram: np.ndarray, rank: int, smoothing: float, scale: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    row_totals = counts.sum(axis=1, dtype=np.float64).astype(np.float32)
    matrix = counts  # reused in place: the caller's counts are consumed
    matrix += (smoothing * unigram).astype(np.float32)[None, :]
    np.log(matrix, out=matrix)
    matrix -= np.log(row_totals + np.float32(smoothing))[:, None]
    matrix -= np.log(unigram).astype(np.float32)[None, :]
    matrix -= matrix.mean(axis=1, keepdims=True)
    u, s, vt = _randomized_svd(matrix, min(rank, min(matrix.shape)), seed=seed)
    root = np.sqrt(s * np.float32(scale))
    return u * root, vt.T * root


def _randomized_svd(
    matrix: np.ndarray, rank: int, *, seed: int, oversample: int = 16, power_iters: int = 2
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Truncated SVD by random range finding with power iterations (float32)."""
    rng = np.random.default_rng(seed)
    k = min(rank + oversample, min(matrix.shape))
    q, _ = np.linalg.qr(matrix @ rng.standard_normal((matrix.shape[1], k), dtype=np.float32))
    for _ in range(power_iters):
        q, _ = np.linalg.qr(matrix.T @ q)
        q, _ = np.linalg.qr(matrix @ q)
    u_small, s, vt = np.linalg.svd(q.T @ matrix, full_matrices=False)
    u = q @ u_small
    return u[:, :rank].astype(np.float32), s[:rank].astype(np.float32), vt[:rank].astype(np.float32)


@dataclass(frozen=True)
class SynthModelConfig:
    """One synthetic model: llama shape plus how the token statistics and the noise go into it.

    Residual-stream layout of the embedding (width n_embd): ``rank`` dims of bigram factors,
    ``skip_rank`` dims of skip-bigram factors and as many that layer 0's previous-token attention
    fills, ``seen_dims`` dims of random token codes and as many that layer 1's uniform attention
    fills with the context's average code, one constant dim (carries the unigram bias), one
    norm-padding dim, then (with ``induction``) ``induction_dims`` dims of random match codes, as
    many that layer 2 fills with the previous token's match code, as many that layer 3 fills with
    the one before it, and a dim that is 1 only at BOS (the induction head's attention sink); zeros.
    """

    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    rank: int  # bigram SVD rank
    skip_rank: int = 0  # skip-bigram rank read through a previous-token head; <= n_head_kv * head_dim
    skip_weight: float = 0.6
    seen_dims: int = 0  # width of the token codes behind the repetition penalty; <= n_head_kv * head_dim
    seen_penalty: float = 0.0  # logit penalty of a token that makes up the whole context so far
    sharpness: float = 1.0  # logit multiplier: >1 lowers the next-token entropy
    noise_gain: float = 0.05  # rms of each random block's residual contribution (the residual has rms ~1)
    data_fraction: float = 1.0  # share of the training documents counted (a draft sees less data)
    # Copying from the context, as real LMs do (layers 2-4, see ngram_llama_weights): when the last
    # two tokens occurred before, the model switches to copy mode: a copy vector `induction` times
    # the residual's norm takes over the final RMS norm, shrinking the n-gram logits about
    # sqrt(1 + induction^2)-fold, and the token that followed gets ~seen_penalty sqrt(n_embd) / |z|
    # nats. When only the current token occurred before, its successor gets `induction_single` nats.
    induction: float = 0.0
    induction_single: float = 0.0
    induction_dims: int = 16  # match-code width per token (2 * induction_dims + 4 <= head_dim)
    rope_theta: float = 10000.0
    seed: int = 0
    name: str = "specli-synth"

    def __post_init__(self) -> None:
        head_dim = self.n_embd // self.n_head
        kv_width = self.n_head_kv * head_dim
        used = self.rank + 2 * self.skip_rank + 2 * self.seen_dims + 2
        if self.induction:
            used += 3 * self.induction_dims + 1
        if used > self.n_embd:
            raise ValueError(
                "rank + 2 * skip_rank + 2 * seen_dims + 2 (+ 3 * induction_dims + 1 with induction) "
                f"must be <= n_embd ({self.n_embd})"
            )
        if self.skip_rank > kv_width or self.seen_dims > kv_width:
            raise ValueError(f"skip_rank and seen_dims must be <= n_head_kv * head_dim ({kv_width})")
        if self.seen_dims and self.n_layer < 2:
            raise ValueError("seen_dims needs n_layer >= 2 (the uniform head lives in layer 1)")
        if self.induction:
            if self.n_layer < 5 or self.n_head_kv < 2 or not 2 <= self.seen_dims <= head_dim:
                raise ValueError("induction needs n_layer >= 5, n_head_kv >= 2, 2 <= seen_dims <= head_dim")
            if 2 * self.induction_dims + 4 > head_dim:
                raise ValueError(f"induction_dims must be <= head_dim / 2 - 2 ({head_dim // 2 - 2})")

    def spec(self, n_vocab: int, n_ctx_train: int = 4096) -> LlamaSpec:
        return LlamaSpec(
            n_vocab=n_vocab,
            n_embd=self.n_embd,
            n_layer=self.n_layer,
            n_head=self.n_head,
            n_head_kv=self.n_head_kv,
            n_ff=self.n_ff,
            n_ctx_train=n_ctx_train,
            rope_theta=self.rope_theta,
            name=self.name,
        )


def ngram_llama_weights(
    spec: LlamaSpec, factors: NgramFactors, config: SynthModelConfig, *, bos_id: int = 1
) -> dict[str, Callable[[], np.ndarray]]:
    """Lazy weights whose logits reproduce *factors* (up to the small random blocks' perturbation).

    * Embedding row of token i: ``[a * next_row_i, b * skip_row_i, 0.., z_i, 0.., 1, pad_i, 0..]``
      with ``pad_i`` making every row's norm ``sqrt(n_embd)``: rms 1, so every RMS norm that sees a
      clean row is the identity and the final one a near-constant scale. ``z_i`` is a random code.
    * Layer 0 attention (when skip_rank > 0) is a previous-token head: queries and keys are constant
      vectors read from the constant dim whose RoPE phases make ``q . k`` peak at distance 1; values
      copy the attended token's skip dims, the output projection writes them into the skip slot.
    * Layer 1 attention (when seen_dims > 0) has zero queries and keys, i.e. attends uniformly, and
      writes the context's average code into the seen slot.
    * Output row of token j: ``[next_col_j / a, 0.., skip_col_j / b, 0.., -penalty * z_j / |z|^2,
      bias_j, 0..]``: bigram + skip-bigram + unigram logits, minus ``seen_penalty`` times (roughly)
      the share of the context that already is token j.
    * With ``induction`` (copying): layers 2 and 3 are previous-token heads that write the random
      match code u of the previous token into the prev slot and of the one before into the prev2
      slot. Layer 4's queries carry u of the current and the previous token, its keys the prev and
      prev2 slots, in the slowest RoPE pairs (so scores hardly depend on distance): a position
      scores by how many of the two tokens before it equal the last two. A constant query against
      the BOS sink scores between one and two, so KV group 0 attends to the positions that
      *followed* an earlier occurrence of the last two tokens, or else to BOS. The value is the
      attended token's seen code (zero at BOS), which goes negated into the seen slot, where the
      output rows read it as a boost of the token to copy. Its norm is ``induction`` times the
      residual's, so the final RMS norm shrinks everything else: the model switches to copy mode.
      KV group 1's heads match the current token alone and add a plain ``induction_single`` nats.
      A recency lane in the faster RoPE pairs keeps the current position from matching itself, so
      that "x x x" does not copy itself forever.
    * All other blocks: random matrices scaled so each adds a residual contribution of rms noise_gain.
    """
    d, rank, skip_rank = spec.n_embd, factors.next_row.shape[1], factors.skip_row.shape[1]
    seen = config.seen_dims
    if rank > config.rank or skip_rank > config.skip_rank:
        raise ValueError("factors have a higher rank than the config allows")
    skip_start = rank
    skip_slot = skip_start + skip_rank
    code_start = skip_slot + skip_rank
    seen_slot = code_start + seen
    const_dim = seen_slot + seen
    pad_dim = const_dim + 1
    next_scale = _budget_scale(factors.next_row, (0.55 if skip_rank else 0.75) * d)
    skip_scale = _budget_scale(factors.skip_row, 0.2 * d)
    code_norm = np.sqrt(0.05 * d)
    codes = np.random.default_rng([config.seed, 0xC0DE]).standard_normal(
        (spec.n_vocab, seen), dtype=np.float32
    )
    codes *= np.float32(code_norm) / np.maximum(np.linalg.norm(codes, axis=1, keepdims=True), 1e-6)
    width = config.induction_dims if config.induction else 0
    match_start = pad_dim + 1
    sink_dim = match_start + 3 * width
    match_norm = np.sqrt(0.05 * d)
    if width:
        codes[bos_id] = 0.0  # BOS is the induction head's "no match" sink: it must copy nothing
        match_codes = np.random.default_rng([config.seed, 0x1D0C]).standard_normal(
            (spec.n_vocab, width), dtype=np.float32
        )
        match_codes *= np.float32(match_norm) / np.linalg.norm(match_codes, axis=1, keepdims=True)
    # the filled slots raise the residual norm, so the final RMS norm shrinks all logits a little
    slot_energy = float(np.mean(np.square(factors.skip_row * skip_scale).sum(axis=1)))
    logit_gain = np.float32(np.sqrt(1.0 + slot_energy / d))

    def token_embd() -> np.ndarray:
        emb = np.zeros((spec.n_vocab, d), dtype=np.float32)
        emb[:, :rank] = factors.next_row * next_scale
        emb[:, skip_start:skip_slot] = factors.skip_row * skip_scale
        emb[:, code_start:seen_slot] = codes
        emb[:, const_dim] = 1.0
        if width:
            emb[:, match_start : match_start + width] = match_codes
            emb[bos_id, sink_dim] = 1.0
        used = np.square(emb).sum(axis=1)
        emb[:, pad_dim] = np.sqrt(np.maximum(d - used, 0.0))
        return emb

    def output() -> np.ndarray:
        out = np.zeros((spec.n_vocab, d), dtype=np.float32)
        out[:, :rank] = factors.next_col / next_scale
        out[:, skip_slot:code_start] = factors.skip_col / skip_scale
        out[:, seen_slot:const_dim] = codes * np.float32(-config.seen_penalty / code_norm**2)
        out[:, const_dim] = factors.bias
        out *= logit_gain
        return out

    weights: dict[str, Callable[[], np.ndarray]] = {
        "token_embd.weight": token_embd,
        "output_norm.weight": lambda: np.ones(d, dtype=np.float32),
        "output.weight": output,
    }
    if skip_rank:
        q, k = _previous_token_query_key(spec, const_dim)
        weights |= _copy_head(spec, 0, skip_start, skip_slot, skip_rank, q, k)
    if seen:
        zero_q = np.zeros((spec.n_head * spec.head_dim, d), dtype=np.float32)
        zero_k = np.zeros((spec.n_head_kv * spec.head_dim, d), dtype=np.float32)
        weights |= _copy_head(spec, 1, code_start, seen_slot, seen, zero_q, zero_k)
    if width:
        prev_slot, prev2_slot = match_start + width, match_start + 2 * width
        q, k = _previous_token_query_key(spec, const_dim)
        weights |= _copy_head(spec, 2, match_start, prev_slot, width, q, k, every_group=True)
        weights |= _copy_head(spec, 3, prev_slot, prev2_slot, width, q, k, every_group=True)
        weights |= _induction_head(
            spec, 4, config, slots=(match_start, prev_slot, prev2_slot), match_norm=match_norm,
            const_dim=const_dim, sink_dim=sink_dim, value=(code_start, seen_slot, code_norm),
        )
    q_width = spec.n_head * spec.head_dim
    gains = {
        "attn_q": 1.0,
        "attn_k": 1.0,
        "attn_v": 1.0,
        "attn_output": config.noise_gain,
        "ffn_gate": 1.0,
        "ffn_up": 1.0,
        "ffn_down": config.noise_gain / 0.6,
    }  # silu(g)*u has rms ~0.6
    for name, shape in spec.tensor_shapes().items():
        if name in weights:
            continue
        kind = name.split(".")[2]
        if len(shape) == 1:
            weights[name] = lambda d=d: np.ones(d, dtype=np.float32)
        else:
            fan_in = q_width if kind == "attn_output" else shape[1]
            weights[name] = _random_matrix(shape, gains[kind] / np.sqrt(fan_in), config.seed, name)
    return weights


def _budget_scale(rows: np.ndarray, budget: float) -> float:
    """Scale giving the largest row a squared norm of *budget*.

    One scale for all rows (the output matrix divides by it); frequent tokens tend to have the largest
    rows, so shrinking outliers instead would distort exactly the tokens that matter most.
    """
    if rows.shape[1] == 0:
        return 1.0
    return float(np.sqrt(budget) / (np.linalg.norm(rows, axis=1).max() or 1.0))


def _copy_head(
    spec: LlamaSpec,
    layer: int,
    src: int,
    dst: int,
    width: int,
    wq: np.ndarray,
    wk: np.ndarray,
    *,
    every_group: bool = False,
) -> dict[str, Callable[[], np.ndarray]]:
    """Attention of *layer* that copies residual dims [src, src+width) of the attended tokens into
    [dst, dst+width); KV head g carries dims g*head_dim.., and all query heads of a group (which share
    wq's pattern) split the output evenly. With *every_group*, every KV head carries all *width* <=
    head_dim dims and all query heads split the output evenly."""
    d, hd, group = spec.n_embd, spec.head_dim, spec.n_head // spec.n_head_kv

    def wv() -> np.ndarray:
        m = np.zeros((spec.n_head_kv * hd, d), dtype=np.float32)
        for g in range(spec.n_head_kv if every_group else 1):
            m[g * hd + np.arange(width), src + np.arange(width)] = 1.0
        return m

    def wo() -> np.ndarray:
        m = np.zeros((d, spec.n_head * hd), dtype=np.float32)
        for h in range(spec.n_head):
            if every_group:
                m[dst + np.arange(width), h * hd + np.arange(width)] = 1.0 / spec.n_head
                continue
            g = h // group
            dims = np.arange(g * hd, min((g + 1) * hd, width))
            m[dst + dims, h * hd + dims - g * hd] = 1.0 / group
        return m

    return {
        f"blk.{layer}.attn_q.weight": lambda: wq,
        f"blk.{layer}.attn_k.weight": lambda: wk,
        f"blk.{layer}.attn_v.weight": wv,
        f"blk.{layer}.attn_output.weight": wo,
    }


_MATCH_SCORE = 40.0  # attention score (nats) of a two-token match
_SINK_SHARE = (0.75, 0.4)  # BOS sink score / match score: group 0 (two tokens), group 1 (one token)
_RECENCY = 0.25  # score penalty / match score of the candidate at distance 0 (decaying with distance)


def _induction_head(
    spec: LlamaSpec,
    layer: int,
    config: SynthModelConfig,
    *,
    slots: tuple[int, int, int],
    match_norm: float,
    const_dim: int,
    sink_dim: int,
    value: tuple[int, int, float],
) -> dict[str, Callable[[], np.ndarray]]:
    """Layer *layer*'s attention: match on the last two tokens (KV group 0) or the current one
    (group 1), copy the seen code; see ngram_llama_weights. *slots*: the match codes of tokens m,
    m - 1 and m - 2; *value*: (code start, seen slot, code norm)."""
    d, hd, group = spec.n_embd, spec.head_dim, spec.n_head // spec.n_head_kv
    code_start, seen_slot, code_norm = value
    width = config.induction_dims
    # The slowest RoPE pairs carry the match lanes (the very last pair is the sink's). All faster
    # pairs carry the recency lane: a constant query and key whose score sum_p cos(t theta_p) is 1 at
    # distance t = 0 and averages out far away. It keeps the current position from matching itself
    # (in "x x x" the last two tokens did occur before, one step back), which would copy x forever.
    slow = np.arange(hd - 2 - 2 * width, hd - 2).reshape(2, width)
    recency = np.arange(0, hd - 2 - 2 * width, 2)  # first dim of each pair: q, k = (a, 0) -> a^2 cos
    recency_amplitude = np.sqrt(_RECENCY * _MATCH_SCORE * np.sqrt(hd) / len(recency))
    # llama.cpp scales scores by 1/sqrt(head_dim): amplitude^2 |u|^2 / sqrt(hd) = half a match
    amplitude = np.sqrt(_MATCH_SCORE * np.sqrt(hd) / 2) / match_norm
    sink_key = np.sqrt(_MATCH_SCORE * np.sqrt(hd))
    code = np.arange(config.seen_dims)
    # Group 0 writes a copy vector `induction` times the residual's norm; group 1 a boost of
    # `induction_single` nats (the output rows read the seen slot as -seen_penalty z / |z|^2).
    scale = (config.induction * np.sqrt(d) / code_norm, config.induction_single / config.seen_penalty)
    wq = np.zeros((spec.n_head * hd, d), dtype=np.float32)
    wk = np.zeros((spec.n_head_kv * hd, d), dtype=np.float32)
    wv = np.zeros((spec.n_head_kv * hd, d), dtype=np.float32)
    wo = np.zeros((d, spec.n_head * hd), dtype=np.float32)
    for h in range(spec.n_head):
        g = h // group
        if g > 1:
            continue  # extra KV groups stay idle (zero output)
        lanes = 2 if g == 0 else 1
        for lane, slot in zip(slow[:lanes], slots[:lanes], strict=True):
            wq[h * hd + lane, slot + np.arange(width)] = amplitude
        wq[h * hd + recency, const_dim] = recency_amplitude
        wq[h * hd + hd - 2, const_dim] = _SINK_SHARE[g] * sink_key
        wo[seen_slot + code, h * hd + code] = -scale[g] / group
    for g in range(spec.n_head_kv):
        for lane, slot in zip(slow, slots[1:], strict=True):
            wk[g * hd + lane, slot + np.arange(width)] = amplitude
        wk[g * hd + recency, const_dim] = -recency_amplitude
        wk[g * hd + hd - 2, sink_dim] = sink_key
        wv[g * hd + code, code_start + code] = 1.0
    return {
        f"blk.{layer}.attn_q.weight": lambda: wq,
        f"blk.{layer}.attn_k.weight": lambda: wk,
        f"blk.{layer}.attn_v.weight": lambda: wv,
        f"blk.{layer}.attn_output.weight": lambda: wo,
    }


def _previous_token_query_key(spec: LlamaSpec, const_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Constant query/key (read from the constant dim) whose RoPE scores peak at distance 1."""
    d, hd = spec.n_embd, spec.head_dim
    pair_weight = _previous_token_rope_weights(hd, spec.rope_theta, spec.n_ctx_train)
    theta = spec.rope_theta ** (-2.0 * np.arange(hd // 2) / hd)
    # RoPE (llama.cpp's "normal" mode) rotates pairs (2p, 2p+1) by position * theta_p. With q's pair p
    # = (A_p, 0) and k's = A_p (cos theta_p, sin theta_p), q_m . k_n / sqrt(hd) = sum_p w_p cos((m - n - 1)
    # theta_p) when A_p^2 = w_p sqrt(hd).
    amplitude = np.sqrt(pair_weight * np.sqrt(hd))
    wq = np.zeros((spec.n_head * hd, d), dtype=np.float32)
    for h in range(spec.n_head):
        wq[h * hd : (h + 1) * hd : 2, const_dim] = amplitude
    wk = np.zeros((spec.n_head_kv * hd, d), dtype=np.float32)
    for g in range(spec.n_head_kv):
        wk[g * hd : (g + 1) * hd : 2, const_dim] = amplitude * np.cos(theta)
        wk[g * hd + 1 : (g + 1) * hd : 2, const_dim] = amplitude * np.sin(theta)
    return wq, wk


def _previous_token_rope_weights(
    head_dim: int, rope_theta: float, n_ctx: int, margin: float = 8.0
) -> np.ndarray:
    """Per-RoPE-pair score weights making distance 1 beat every other distance by *margin* nats.

    The score at distance t is ``sum_p w_p cos((t - 1) theta_p)``: fast-rotating pairs separate
    neighbours, and the weights are scaled by the worst competitor over the whole context.
    """
    theta = rope_theta ** (-2.0 * np.arange(head_dim // 2) / head_dim)
    distances = np.arange(n_ctx, dtype=np.float64)[:, None]
    best: tuple[float, np.ndarray] | None = None
    for min_theta in (0.02, 0.05, 0.1, 0.3):
        for power in (0.0, 0.5, 1.0):
            w = np.where(theta >= min_theta, theta**power, 0.0)
            if not w.any():
                continue
            w /= w.sum()
            score = (w * np.cos((distances - 1) * theta)).sum(axis=1)
            gap = score[1] - np.delete(score, 1).max()
            if best is None or gap > best[0]:
                best = (gap, w)
    assert best is not None
    return (best[1] * margin / best[0]).astype(np.float32)


def _random_matrix(shape: tuple[int, ...], std: float, seed: int, name: str) -> Callable[[], np.ndarray]:
    def make() -> np.ndarray:
        rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
        matrix = rng.standard_normal(shape, dtype=np.float32)
        matrix *= np.float32(std)
        return matrix

    return make


def write_ngram_model(
    path: str | Path,
    trained: TrainedVocab,
    config: SynthModelConfig,
    *,
    factors: NgramFactors | None = None,
    dtype: WeightDType = "f16",
    chat_template: str | None = None,
    n_ctx_train: int = 4096,
    progress: ProgressCallback | None = None,
) -> Path:
    """Write one model of *trained*'s vocabulary.

    The statistics are *factors* truncated to the config's ranks when given (e.g. a draft distilled
    from its target's factors), otherwise counted in a *data_fraction* share of the documents.
    """
    if progress is not None:
        progress(f"counting and factoring {config.name}", 0.0)
    if factors is None:
        documents = _document_subset(trained.documents, config.data_fraction, config.seed)
        factors = ngram_factors(
            documents,
            len(trained.vocab),
            trained.vocab.bos_id,
            rank=config.rank,
            skip_rank=config.skip_rank,
            skip_weight=config.skip_weight,
            sharpness=config.sharpness,
            seed=config.seed,
        )
    factors = factors.truncated(config.rank, config.skip_rank)
    spec = config.spec(len(trained.vocab), n_ctx_train)
    weights = ngram_llama_weights(spec, factors, config, bos_id=trained.vocab.bos_id)
    return write_llama_gguf(
        path, spec, trained.vocab, weights, dtype=dtype, chat_template=chat_template, progress=progress
    )


def _document_subset(documents: Sequence[np.ndarray], fraction: float, seed: int) -> list[np.ndarray]:
    if fraction >= 1.0:
        return list(documents)
    keep = np.random.default_rng([seed, 0x5EED]).random(len(documents)) < fraction
    return [doc for doc, k in zip(documents, keep, strict=True) if k]


# -----------------------------------------------------------------------------------------------------
# Tiny fixture models for the test suite
# -----------------------------------------------------------------------------------------------------

# A small original story: the training text of the fixture vocabulary and bigram statistics.
FIXTURE_TEXT = """\
Once upon a time, there was a little fox named Pip. Pip lived in a small house at the edge of a big
green wood. Every morning Pip went out to look for berries. He liked the red berries best, but the blue
ones were good too.

One day Pip saw a bird sitting on a branch. The bird was sad because she had lost her song. "Why are
you sad?" asked Pip. "I can not find my song," said the bird. "It flew away in the wind."

Pip wanted to help the bird. He said, "Let us look for your song together." The bird was happy and
they went into the wood. They looked under the old tree. They looked behind the big rock. They looked
in the tall grass by the river.

At the river they met a turtle. The turtle was very old and very slow, but he was also very wise.
"Have you seen a song?" asked the bird. The turtle thought for a long time. Then he said, "I heard a
song near the hill."

So Pip and the bird walked to the hill. The sun was warm and the sky was blue. On the way they sang
and played. When they came to the hill, they heard a sweet sound. It was the song of the bird! It was
hiding in a flower.

The bird opened her mouth and the song came back to her. She sang and sang, and her song was the most
beautiful song in the wood. Pip was very happy. He said, "You have your song again!" The bird said,
"Thank you, Pip. You are a good friend." From that day on, the bird sang for Pip every morning. And
Pip always shared his berries with the bird.

Once upon a time, there was a little girl named Mia. Mia had a red ball and a big dog. Every day Mia
and the dog played in the park. They ran and jumped and laughed in the sun.

One day the ball rolled into the pond. The dog jumped into the water to get it. Mia laughed and
clapped her hands. The dog came back with the ball. He was wet and happy. Mia gave him a big hug and
they went home.

At home, mom made a warm soup. Mia ate the soup and told mom about the ball and the pond. Mom smiled
and said, "You have a good dog." Mia said, "He is the best dog in the world." That night Mia went to
bed early. She dreamed of the park, the pond, the ball and the sun.

The next morning it was raining. Mia could not go to the park, so she played with her toys in the
house. She built a tall tower with her blocks. The dog looked at the tower and wagged his tail. Then
the tower fell down. Mia was not sad. She laughed and built the tower again, and this time it was even
taller than before. When the rain stopped, Mia and the dog went out to play. The grass was wet and the
air smelled fresh and sweet.

Once upon a time, there was a small boat on a big sea. The boat was brave and liked to sail far away.
One day a storm came. The wind was strong and the waves were very high. The boat was scared, but it
did not stop. After the storm, the sea was calm again.

The boat saw an island with tall trees and a white beach. On the island lived a little crab. The crab
said, "Hello, boat! Do you want to be my friend?" The boat said yes, and every day after that the boat
and the crab talked about the sea, the wind and the stars. The end.
"""

FIXTURE_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)

FIXTURE_N_VOCAB = 600

FIXTURE_TARGET = SynthModelConfig(
    n_embd=64,
    n_layer=2,
    n_head=4,
    n_head_kv=2,
    n_ff=128,
    rank=28,
    skip_rank=10,
    seen_dims=6,
    seen_penalty=15.0,
    sharpness=1.2,
    noise_gain=0.05,
    seed=1,
    name="specli-fixture-target",
)
FIXTURE_DRAFT = SynthModelConfig(
    n_embd=48,
    n_layer=2,
    n_head=2,
    n_head_kv=1,
    n_ff=96,
    rank=30,
    skip_rank=4,
    seen_dims=4,
    seen_penalty=10.0,
    sharpness=1.2,
    noise_gain=0.1,
    data_fraction=0.8,
    seed=2,
    name="specli-fixture-draft",
)

# Same vocabulary size as the fixture target, but learned from the lowercased text: different tokens.
FIXTURE_OTHER_VOCAB = SynthModelConfig(
    n_embd=32,
    n_layer=1,
    n_head=2,
    n_head_kv=2,
    n_ff=64,
    rank=16,
    sharpness=1.5,
    seed=3,
    name="specli-fixture-other-vocab",
)


@dataclass(frozen=True)
class FixtureModels:
    """Paths of the tiny test models. target and draft share one vocabulary; other_vocab does not."""

    target: Path
    draft: Path
    other_vocab: Path  # same vocabulary size as target, different tokens
    target_with_template: Path  # target + tokenizer.chat_template (FIXTURE_CHAT_TEMPLATE)
    vocab: Vocab = field(repr=False)


def fixture_documents(lowercase: bool = False) -> list[str]:
    """The fixture training documents: the paragraphs of FIXTURE_TEXT, each unwrapped onto one line."""
    text = FIXTURE_TEXT.lower() if lowercase else FIXTURE_TEXT
    return [" ".join(paragraph.split("\n")) for paragraph in text.strip().split("\n\n")]


@lru_cache(maxsize=2)
def fixture_vocab(lowercase: bool = False) -> TrainedVocab:
    """The fixture vocabulary (FIXTURE_N_VOCAB tokens) learned from :func:`fixture_documents`.

    Cached: treat the result (and its documents' arrays) as read-only.
    """
    return train_vocab(fixture_documents(lowercase), FIXTURE_N_VOCAB)


def build_fixture_pair(
    directory: str | Path, *, seed: int = 0, chat_template: str | None = None, dtype: WeightDType = "f32"
) -> tuple[Path, Path]:
    """Write the tiny target and draft (one shared vocabulary) into *directory*; returns their paths.

    *seed* varies the random parts (same vocabulary for every seed); *chat_template* goes into the
    target only.
    """
    directory = Path(directory)
    trained = fixture_vocab()
    target = write_ngram_model(
        directory / "fixture-target.gguf",
        trained,
        _reseed(FIXTURE_TARGET, seed),
        dtype=dtype,
        chat_template=chat_template,
    )
    draft = write_ngram_model(
        directory / "fixture-draft.gguf", trained, _reseed(FIXTURE_DRAFT, seed), dtype=dtype
    )
    return target, draft


def build_fixture_models(directory: str | Path, *, seed: int = 0) -> FixtureModels:
    """Write every fixture model (target, draft, other-vocabulary model, target with chat template)."""
    directory = Path(directory)
    target, draft = build_fixture_pair(directory, seed=seed)
    templated = write_ngram_model(
        directory / "fixture-target-chat.gguf",
        fixture_vocab(),
        _reseed(FIXTURE_TARGET, seed),
        dtype="f32",
        chat_template=FIXTURE_CHAT_TEMPLATE,
    )
    other = write_ngram_model(
        directory / "fixture-other-vocab.gguf",
        fixture_vocab(lowercase=True),
        _reseed(FIXTURE_OTHER_VOCAB, seed),
        dtype="f32",
    )
    return FixtureModels(target, draft, other, templated, fixture_vocab().vocab)


def _reseed(config: SynthModelConfig, seed: int) -> SynthModelConfig:
    return replace(config, seed=config.seed + 1000 * seed)


# -----------------------------------------------------------------------------------------------------
# Demo pair: realistic size and speed, trained on the standard library's docstrings
# -----------------------------------------------------------------------------------------------------

_DOCSTRING_RE = re.compile(r'(?:^|[=(\s])[rRuU]?"""(.*?)"""', re.S)
_COMMENT_BLOCK_RE = re.compile(r"(?:^[ \t]*#[^\n]*\n)+", re.M)  # runs of whole-line comments
_CORPUS_SKIP_DIRS = frozenset(
    {"test", "tests", "idlelib", "site-packages", "lib2to3", "tkinter", "turtledemo"}
)


def stdlib_docstrings(max_chars: int | None = 2_000_000, min_chars: int = 40) -> list[str]:
    """Prose from the running Python's standard library docstrings, in a deterministic (sorted-path) order.

    Triple-double-quoted strings and runs of whole-line comments are found with regular expressions
    (10x faster than ``ast``); only prose paragraphs are kept (no doctests, tables or
    indented code), each unwrapped onto one line. Collection stops after *max_chars* characters.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        p for p in root.rglob("*.py") if not _CORPUS_SKIP_DIRS.intersection(p.relative_to(root).parts[:-1])
    )
    documents: list[str] = []
    total = 0
    for path in files:
        try:
            source = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        docstrings = (inspect.cleandoc(m.group(1)) for m in _DOCSTRING_RE.finditer(source))
        comments = (_comment_text(m.group(0)) for m in _COMMENT_BLOCK_RE.finditer(source))
        for text in (*docstrings, *comments):
            doc = "\n\n".join(_unwrap(p) for p in text.split("\n\n") if _is_prose(p))
            if len(doc) < min_chars:
                continue
            documents.append(doc)
            total += len(doc)
            if max_chars is not None and total >= max_chars:
                return documents
    return documents


def _is_prose(paragraph: str) -> bool:
    if (
        not paragraph.strip()
        or paragraph[0].isspace()
        or any(m in paragraph for m in (">>>", "|", "==", "--", "::"))
    ):
        return False
    letters = sum(c.isalpha() or c == " " for c in paragraph)
    return letters >= 0.85 * len(paragraph)


def _comment_text(block: str) -> str:
    return "\n".join(line.strip().lstrip("#").strip() for line in block.splitlines())


def _unwrap(paragraph: str) -> str:
    return " ".join(line.strip() for line in paragraph.splitlines())


@dataclass(frozen=True)
class DemoConfig:
    """Sizes of the demo pair.

    The default target has Qwen2-0.5B's transformer shape (896 wide, 24 layers, 14 query / 2 KV heads,
    FFN 4864; a smaller 8k vocabulary) and f16 weights: ~370M parameters, ~25 ms/token on 2 CPU cores.
    The draft (512 wide, 6 layers) is ~15x cheaper per token (~2 ms) and, by default, distilled: its
    factors are the target's truncated, so it agrees with the target only partly. Both copy from their
    context (an induction head, see SynthModelConfig.induction), the draft with narrower match codes.
    """

    n_vocab: int = 8192
    corpus_chars: int = 2_000_000
    n_ctx_train: int = 4096
    dtype: WeightDType = "f16"
    target: SynthModelConfig = SynthModelConfig(
        n_embd=896,
        n_layer=24,
        n_head=14,
        n_head_kv=2,
        n_ff=4864,
        rank=448,
        skip_rank=128,
        seen_dims=64,
        seen_penalty=10.0,
        sharpness=1.2,
        noise_gain=0.002,
        induction=4.0,
        induction_single=4.0,
        induction_dims=16,
        rope_theta=1e6,  # as Qwen2: the match lanes' RoPE pairs hardly rotate over the context
        seed=11,
        name="specli-demo-target",
    )
    draft: SynthModelConfig = SynthModelConfig(
        n_embd=512,
        n_layer=6,
        n_head=8,
        n_head_kv=2,
        n_ff=1408,
        rank=280,
        skip_rank=64,
        seen_dims=32,
        seen_penalty=7.0,
        sharpness=1.2,
        noise_gain=0.003,
        induction=4.0,
        induction_single=4.0,
        induction_dims=10,
        rope_theta=1e6,
        seed=12,
        name="specli-demo-draft",
    )
    distill_draft: bool = True  # draft = the target's factors truncated to the draft's ranks


DEMO_TARGET_FILE = "specli-demo-target.gguf"
DEMO_DRAFT_FILE = "specli-demo-draft.gguf"


def build_demo_pair(
    directory: str | Path, *, progress: ProgressCallback | None = None, config: DemoConfig | None = None
) -> tuple[Path, Path]:
    """Write the demo target and draft (one shared vocabulary) into *directory*; returns their paths.

    The vocabulary and the token statistics come from the standard library's docstrings and comments,
    so the models write docstring-flavoured English. With the default :class:`DemoConfig`: ~30 s and
    ~0.7 GB of RAM on 2 cores, files of ~750 MB (target) and ~50 MB (draft). *progress* receives
    ``(stage, overall fraction)`` with the fraction growing from 0 to 1. Files are written under a
    temporary name and renamed when complete, so an interrupted build leaves no truncated model.
    """
    config = config or DemoConfig()
    directory = Path(directory)

    def stage_reporter(start: float, end: float) -> ProgressCallback:
        def report(stage: str, fraction: float) -> None:
            if progress is not None:
                progress(stage, start + (end - start) * min(max(fraction, 0.0), 1.0))

        return report

    # rough shares of the build time on 2 cores, so that the reported fraction grows evenly
    stage_reporter(0.0, 0.05)("reading standard library docstrings", 0.0)
    documents = stdlib_docstrings(config.corpus_chars)
    if sum(map(len, documents)) < 50_000:
        stdlib = sysconfig.get_paths()["stdlib"]
        raise RuntimeError(f"too little text in the standard library under {stdlib} to build the demo")
    stage_reporter(0.05, 0.12)("learning the vocabulary", 0.0)
    trained = train_vocab(documents, config.n_vocab)
    target, draft = config.target, config.draft
    factors = None
    if config.distill_draft:
        stage_reporter(0.12, 0.45)(f"counting and factoring {target.name}", 0.0)
        factors = ngram_factors(
            trained.documents,
            len(trained.vocab),
            trained.vocab.bos_id,
            rank=target.rank,
            skip_rank=target.skip_rank,
            skip_weight=target.skip_weight,
            sharpness=target.sharpness,
            seed=target.seed,
        )
    paths = [
        write_ngram_model(
            directory / filename,
            trained,
            model,
            factors=factors,
            dtype=config.dtype,
            n_ctx_train=config.n_ctx_train,
            progress=stage_reporter(start, end),
        )
        for model, filename, start, end in (
            (target, DEMO_TARGET_FILE, 0.45, 0.95),
            (draft, DEMO_DRAFT_FILE, 0.95, 1.0),
        )
    ]
    if progress is not None:
        progress("done", 1.0)
    return paths[0], paths[1]
