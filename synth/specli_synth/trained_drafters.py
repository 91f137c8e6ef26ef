"""A Qwen3-shaped target and the trained drafters people download for such targets, written as the files
llama.cpp's converter writes: an EAGLE-3 head, a DFlash block drafter, a DSpark one (DFlash with a
Markov head and a confidence head) and a DFlash2 one (DFlash with convolutions and a candidate
selector), each structured (it predicts what the target will predict) and
random (a useless head, for rollback and exactness tests).

    python -m specli_synth trained-drafters DIR [--size tiny|bench]

No registry ships a real head for a synthetic target, so the heads are built by hand from the target's
own token statistics (:class:`~specli_synth.ngram_stats.NgramFactors`: logits ~ bigram(current) +
skip-bigram(previous) + unigram, less a repetition penalty the drafters do not know). The layouts are
those of ``convert_hf_to_gguf.py`` (``conversion/llama.py``'s EAGLE-3 branch, ``conversion/qwen.py``'s
DFlashModel and DSparkModel) and ``src/models/eagle3.cpp`` / ``dflash.cpp``:

* **target** (``qwen3``): the llama fixture's weights (:func:`~specli_synth.ngram_model.ngram_llama_weights`:
  layer 0 copies the previous token's skip-bigram factors, layer 1 the context's average token code,
  the rest small random blocks) with q/k rows moved to NeoX's RoPE layout and per-head q/k norms that
  leave the hand-built head as designed.
* **eagle3**: one decoder layer over ``[norm(embed(x_{p+1})), norm(g_p)]``, ``g_p = fc(target features
  at p)`` (the features of ``{arch}.target_layers``; fc passes the first one through, which is
  ``embed(x_p)`` plus the previous token's skip factors). Its attention looks at the position itself
  and writes ``embed(x_{p+1}) - g_p`` plus x_p's skip factors into the skip slot, so its pre-norm
  state is the target's residual one position on (bigram of x_{p+1} + skip-bigram of x_p), and the
  next draft step, which reads that state as its g, sees the same layout. Its own output head covers a
  reduced vocabulary (``d2t``: the most frequent tokens), the token embedding is the target's.
* **dflash**: a block ``[x_{n-1}, <mask> x (B-1)]`` decoded at once over the target's features
  injected into its KV cache. Its own token embedding holds, per token a, the chain of the target's
  greedy bigram continuation of a (slot j: the factors of the j-th token after a); head j looks j
  positions back, so the mask at offset j reads slot j of the anchor; a head two positions back reads
  the skip factors from the injected features (offset 1) or nothing.
* **dspark**: anchor-first blocks (``dflash.sample_from_anchor``): the backbone gives the skip-bigram
  (a previous-token head over the injected features and the anchor), the Markov head the bigram of
  the previous position's argmax (``markov_w2 . markov_w1[prev]`` is exactly the bigram factorization),
  the confidence head sigmoid(how sure the bigram of the previous token is, less a step where the
  previous position is a mask).
* **dflash2** (DFlash2: ``{arch}.conv_kernel_size``, ``conv_group_size``, ``selector_rank``,
  ``selector_top_k``): DFlash's layers with a convolution around each attention and feed-forward
  sublayer (``blk.N.{attn,ffn}_conv_base`` and ``_conv_proj``) and a candidate selector
  (``selector_predecessor``, ``selector_successor``, ``selector_hidden``) that walks the best path
  through each position's top candidates. Structured: the convolutions the identity and the selector's
  codebooks zero, so its path is DFlash's greedy draft; llama.cpp's DFlash2 reads the target's whole
  vocabulary (no ``d2t``).

Noise (random feed-forward terms, a random layer, the drafters' ignorance of the repetition penalty and
of the sampled tokens inside a block) keeps acceptance realistic.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from specli_synth.fixtures import FIXTURE_TARGET, fixture_vocab
from specli_synth.gguf_writer import (
    StoredDType,
    WeightDType,
    add_attention_keys,
    add_spm_vocab,
    open_writer,
    write_tensors,
)
from specli_synth.model_config import SynthModelConfig
from specli_synth.ngram_model import factor_scales, ngram_llama_weights, random_matrix
from specli_synth.ngram_stats import NgramFactors
from specli_synth.rope_heads import peak_weights, peaked_query_key, qk_norm_weight, to_neox
from specli_synth.vocab import Vocab, piece_vocab

Weights = dict[str, Callable[[], np.ndarray]]
# The heads' context (their context_length): their hand-built attention looks where it should over it.
HEAD_CONTEXT = 4096


@dataclass(frozen=True)
class DrafterSizes:
    """How big each drafter of a set is, and how noisy (the knobs that set acceptance)."""

    eagle3_layers: tuple[int, int, int]  # the target layers whose inputs EAGLE-3 reads (llama.cpp's ids)
    dflash_layers: tuple[int, ...]  # DFlash's (llama.cpp's ids: the converter's target_layer_ids + 1)
    draft_vocab: int  # the reduced vocabulary of the EAGLE-3 and DSpark heads (d2t)
    dflash_block: int = 8  # block size: DFlash drafts block - 1 tokens, DSpark (anchor-first) block
    dspark_block: int = 7
    eagle3_noise: float = 0.15  # rms the feed-forward block adds to the head's residual
    fc_noise: float = 0.05  # rms of the other target layers' share in fc
    dflash_noise: float = 0.15  # rms of the DFlash/DSpark backbone's random second layer
    n_ff: int = 128
    # A large vocabulary: DFlash's output head covers the reduced vocabulary too (llama.cpp takes a
    # d2t there as well), and the heads' precomputed chains look only at it.
    reduced: bool = False
    dtype: WeightDType = "f32"
    # DFlash2: its convolution's taps and channel group, its selector's rank and candidates a position
    selector_top_k: int = 8
    selector_rank: int = 8
    conv_kernel: int = 2
    conv_group: int = 16


def qwen3_shapes(config: SynthModelConfig, n_vocab: int) -> dict[str, tuple[int, ...]]:
    """The target's tensors (numpy shapes): the llama fixture's plus per-head q/k norms."""
    spec = config.spec(n_vocab)
    shapes = spec.tensor_shapes()
    for i in range(spec.n_layer):
        shapes[f"blk.{i}.attn_q_norm.weight"] = (spec.head_dim,)
        shapes[f"blk.{i}.attn_k_norm.weight"] = (spec.head_dim,)
    return shapes


def _layout(config: SynthModelConfig) -> dict[str, int]:
    """Where ngram_llama_weights puts things in the residual stream (see SynthModelConfig)."""
    skip_start = config.rank
    skip_slot = skip_start + config.skip_rank
    code_start = skip_slot + config.skip_rank
    seen_slot = code_start + config.seen_dims
    const_dim = seen_slot + config.seen_dims
    return {"skip_start": skip_start, "skip_slot": skip_slot, "const": const_dim, "pad": const_dim + 1}


def qwen3_weights(config: SynthModelConfig, factors: NgramFactors, n_vocab: int, bos_id: int) -> Weights:
    """The llama fixture's weights as a Qwen3 model: NeoX q/k rows, and q/k norms that give back the
    previous-token head's designed vectors (its q and k are constant vectors read from the constant
    dim; a per-head RMS norm with their rms as weight returns them whatever that dim's scale)."""
    if config.induction:
        raise ValueError("the Qwen3 target has no induction heads (their queries vary per token)")
    spec = config.spec(n_vocab)
    hd = spec.head_dim
    llama = ngram_llama_weights(spec, factors, config, bos_id=bos_id)
    const_dim = _layout(config)["const"]
    weights: Weights = dict(llama)
    for i in range(spec.n_layer):
        for kind in ("attn_q", "attn_k"):
            name = f"blk.{i}.{kind}.weight"
            weights[name] = lambda source=llama[name]: to_neox(source(), hd)
        # Layer 0 is the previous-token head when there are skip factors: its rows read the constant
        # dim only. Other layers are random (or zero): unit norms.
        structured = i == 0 and config.skip_rank > 0

        def norm(source: Callable[[], np.ndarray] = llama[f"blk.{i}.attn_q.weight"], on: bool = structured
                 ) -> np.ndarray:
            return qk_norm_weight(source()[:hd, const_dim]) if on else np.ones(hd, np.float32)

        weights[f"blk.{i}.attn_q_norm.weight"] = norm
        weights[f"blk.{i}.attn_k_norm.weight"] = norm
    return weights


def write_gguf(path: str | Path, arch: str, name: str, vocab: Vocab, keys: Callable[[Any, str], None],
               shapes: Mapping[str, tuple[int, ...]], weights: Mapping[str, Callable[[], np.ndarray]],
               dtype: WeightDType, *, mask_token: int | None = None) -> Path:
    """A GGUF file of architecture *arch*: general keys, *keys(writer, arch)*, the vocabulary (with a
    mask token for DFlash), then the tensors: 1-D ones as F32, ``d2t`` as I64, matrices as *dtype*."""
    path = Path(path)
    writer, partial = open_writer(path, arch, name, len(vocab), dtype)
    keys(writer, arch)
    add_spm_vocab(writer, vocab)
    if mask_token is not None:
        writer.add_uint32("tokenizer.ggml.mask_token_id", mask_token)
    stored: dict[str, StoredDType] = {}
    for tensor, shape in shapes.items():
        # (DFlash2's convolution taps are added to F32 coefficients in llama.cpp's graph: kept F32)
        quantizable = len(shape) == 2 and (dtype != "q8_0" or shape[-1] % 32 == 0)
        stored[tensor] = "i64" if tensor == "d2t" else (dtype if quantizable else "f32")
    return write_tensors(writer, path, partial, shapes, stored, weights)


def write_qwen3_target(path: str | Path, config: SynthModelConfig, factors: NgramFactors, vocab: Vocab,
                       dtype: WeightDType = "f32") -> Path:
    spec = config.spec(len(vocab))

    def keys(writer: Any, arch: str) -> None:
        add_attention_keys(writer, spec.n_ctx_train, spec.n_embd, spec.n_layer, spec.n_ff, spec.n_head,
                           spec.n_head_kv, spec.head_dim, spec.rope_theta, spec.rms_eps, key_length=True)

    return write_gguf(path, "qwen3", config.name, vocab, keys, qwen3_shapes(config, len(vocab)),
                      qwen3_weights(config, factors, len(vocab), vocab.bos_id), dtype)


# -- the drafters' common parts ------------------------------------------------------------------------


def frequent_tokens(factors: NgramFactors, n: int) -> np.ndarray:
    """The n most likely tokens by the unigram bias, ascending: a reduced draft vocabulary (d2t)."""
    n = min(n, len(factors.bias))
    return np.sort(np.argsort(-factors.bias, kind="stable")[:n]).astype(np.int64)


def target_output(config: SynthModelConfig, factors: NgramFactors, n_vocab: int, bos_id: int) -> np.ndarray:
    """The target's output matrix (its rows read a residual laid out as the target's)."""
    return ngram_llama_weights(config.spec(n_vocab), factors, config, bos_id=bos_id)["output.weight"]()


def greedy_chain(factors: NgramFactors, length: int, candidates: np.ndarray | None = None,
                 chunk: int = 1024) -> np.ndarray:
    """(n_vocab, length + 1): column 0 is the token a itself, column j the j-th token of the target's
    greedy continuation of a by bigram + skip-bigram + unigram (the token before a unknown: no skip
    term for the first step). With *candidates* (a large vocabulary: the reduced draft vocabulary),
    each step's argmax is over them, and steps after the first follow each candidate's own greedy
    successor (bigram + unigram: a table, where pairs would cost a pass over the vocabulary a step).
    Computed in chunks of anchors."""
    n = len(factors.bias)
    cand = np.arange(n) if candidates is None else candidates
    chain = np.zeros((n, length + 1), dtype=np.int64)
    chain[:, 0] = np.arange(n)
    cols, skip_cols, bias = factors.next_col[cand].T, factors.skip_col[cand].T, factors.bias[cand]
    for start in range(0, n, chunk):
        rows = slice(start, min(start + chunk, n))
        for j in range(1, length + 1 if candidates is None else 2):
            logits = factors.next_row[chain[rows, j - 1]] @ cols + bias
            if j >= 2 and factors.skip_row.shape[1]:
                logits += factors.skip_row[chain[rows, j - 2]] @ skip_cols
            chain[rows, j] = cand[np.argmax(logits, axis=1)]
    if candidates is not None and length >= 2:
        successor = np.zeros(n, dtype=np.int64)
        successor[cand] = greedy_chain(factors, 1, cand, chunk)[cand, 1]
        for j in range(2, length + 1):
            chain[:, j] = successor[chain[:, j - 1]]
    return chain


def _head_count(width: int, head_dim: int) -> int:
    return -(-width // head_dim)


# -- EAGLE-3 -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Eagle3Shape:
    n_embd: int  # the target's hidden size (the head shares the target's token embedding)
    n_head: int
    head_dim: int
    n_ff: int
    n_embd_target: int
    n_draft_vocab: int

    def shapes(self) -> dict[str, tuple[int, ...]]:
        d, width = self.n_embd, self.n_head * self.head_dim
        return {
            "fc.weight": (d, 3 * self.n_embd_target),
            "blk.0.attn_norm.weight": (d,),
            "blk.0.attn_norm_2.weight": (d,),
            "blk.0.attn_q.weight": (width, 2 * d),
            "blk.0.attn_k.weight": (width, 2 * d),
            "blk.0.attn_v.weight": (width, 2 * d),
            "blk.0.attn_output.weight": (d, width),
            "blk.0.ffn_norm.weight": (d,),
            "blk.0.ffn_gate.weight": (self.n_ff, d),
            "blk.0.ffn_up.weight": (self.n_ff, d),
            "blk.0.ffn_down.weight": (d, self.n_ff),
            "output_norm.weight": (d,),
            "output.weight": (self.n_draft_vocab, d),
            "d2t": (self.n_draft_vocab,),
        }


def eagle3_weights(config: SynthModelConfig, factors: NgramFactors, sizes: DrafterSizes, vocab: Vocab,
                   *, structured: bool, seed: int) -> tuple[Eagle3Shape, Weights]:
    """The EAGLE-3 head (see the module's docstring); *structured* False: random weights."""
    d, n_vocab = config.n_embd, len(vocab)
    hd = d // config.n_head
    lay = _layout(config)
    skip, skip_start, skip_slot, const = config.skip_rank, lay["skip_start"], lay["skip_slot"], lay["const"]
    used = lay["pad"] + 1  # the dims the target's layout uses (the rest of its residual is ~0)
    n_head = _head_count(2 * used + skip, hd)  # V carries embed(x), g and x_p's skip factors
    d2t = frequent_tokens(factors, sizes.draft_vocab)
    shape = Eagle3Shape(d, n_head, hd, sizes.n_ff, d, len(d2t))
    weights = _random_weights(shape.shapes(), seed, gain=0.5)
    weights["d2t"] = lambda: d2t
    out = target_output(config, factors, n_vocab, vocab.bos_id)
    weights["output.weight"] = lambda: out[d2t]
    if not structured:
        return shape, weights
    width = n_head * hd
    # Mostly the position itself, a little of the recent ones (as trained heads attend): a row a
    # rollback left behind moves the logits.
    w = peak_weights(hd, config.rope_theta, HEAD_CONTEXT, [0], margin=5.0)
    q, k = peaked_query_key(hd, w, 0, config.rope_theta)

    def fc() -> np.ndarray:
        m = random_matrix((d, 3 * d), sizes.fc_noise / np.sqrt(3 * d), seed, "fc")()
        m[:, :d] += np.eye(d, dtype=np.float32)
        return m

    def query_key(vector: np.ndarray) -> Callable[[], np.ndarray]:
        def make() -> np.ndarray:
            m = np.zeros((width, 2 * d), np.float32)
            for h in range(n_head):
                m[h * hd : (h + 1) * hd, const] = vector
            return m
        return make

    def value() -> np.ndarray:
        m = np.zeros((width, 2 * d), np.float32)
        m[np.arange(used), np.arange(used)] = 1.0  # embed(x_{p+1})
        m[used + np.arange(used), d + np.arange(used)] = 1.0  # g_p
        m[2 * used + np.arange(skip), d + skip_start + np.arange(skip)] = 1.0  # x_p's skip factors
        return m

    def output_projection() -> np.ndarray:
        m = np.zeros((d, width), np.float32)
        m[np.arange(used), np.arange(used)] = 1.0
        m[np.arange(used), used + np.arange(used)] = -1.0  # g leaves the residual (it came in raw)...
        m[skip_slot + np.arange(skip), 2 * used + np.arange(skip)] = 1.0  # ...but for x_p's skip factors
        return m

    weights |= {
        "fc.weight": fc,
        "blk.0.attn_q.weight": query_key(q),
        "blk.0.attn_k.weight": query_key(k),
        "blk.0.attn_v.weight": value,
        "blk.0.attn_output.weight": output_projection,
        "blk.0.ffn_down.weight": random_matrix(
            (d, sizes.n_ff), sizes.eagle3_noise / 0.6 / np.sqrt(sizes.n_ff), seed, "ffn_down"),
    }
    for norm in ("attn_norm", "attn_norm_2", "ffn_norm"):
        weights[f"blk.0.{norm}.weight"] = lambda: np.ones(d, np.float32)
    weights["output_norm.weight"] = lambda: np.ones(d, np.float32)
    return shape, weights


def write_eagle3(path: str | Path, config: SynthModelConfig, factors: NgramFactors, sizes: DrafterSizes,
                 vocab: Vocab, *, structured: bool = True, seed: int = 3) -> Path:
    shape, weights = eagle3_weights(config, factors, sizes, vocab, structured=structured, seed=seed)

    def keys(writer: Any, arch: str) -> None:
        add_attention_keys(writer, HEAD_CONTEXT, shape.n_embd, 1, shape.n_ff, shape.n_head, shape.n_head,
                           shape.head_dim, config.rope_theta, 1e-6, key_length=True)
        writer.add_array(f"{arch}.target_layers", [int(i) for i in sizes.eagle3_layers])
        writer.add_uint32(f"{arch}.target_hidden_size", shape.n_embd_target)
        writer.add_bool(f"{arch}.norm_before_residual", False)
        writer.add_bool(f"{arch}.norm_before_fc", False)

    kind = "structured" if structured else "random"
    return write_gguf(path, "eagle3", f"specli-synth-eagle3-{kind}", vocab, keys, shape.shapes(), weights,
                      sizes.dtype)


# -- DFlash and DSpark ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class BlockShape:
    """A DFlash (or DSpark) drafter's tensors: own token embedding and output head, two layers."""

    n_embd: int
    n_head: int
    head_dim: int
    n_ff: int
    n_layer: int
    n_vocab: int
    n_out: int  # rows of the output head: the vocabulary, or the reduced one (DSpark's d2t)
    n_embd_inp: int  # the fused target features: len(target_layers) x the target's hidden size
    markov_rank: int = 0  # DSpark: the Markov head's rank (0: DFlash)
    selector_rank: int = 0  # DFlash2: the candidate selector's rank (0: none)
    conv_kernel: int = 0  # DFlash2: its convolution's taps
    conv_group: int = 0  # DFlash2: channels sharing one dynamic coefficient

    def shapes(self) -> dict[str, tuple[int, ...]]:
        d, width = self.n_embd, self.n_head * self.head_dim
        shapes: dict[str, tuple[int, ...]] = {
            "token_embd.weight": (self.n_vocab, d),
            "fc.weight": (d, self.n_embd_inp),
            "enc.output_norm.weight": (d,),
            "output_norm.weight": (d,),
            "output.weight": (self.n_out, d),
        }
        for i in range(self.n_layer):
            shapes |= {
                f"blk.{i}.attn_norm.weight": (d,),
                f"blk.{i}.attn_q.weight": (width, d),
                f"blk.{i}.attn_k.weight": (width, d),
                f"blk.{i}.attn_v.weight": (width, d),
                f"blk.{i}.attn_output.weight": (d, width),
                f"blk.{i}.attn_q_norm.weight": (self.head_dim,),
                f"blk.{i}.attn_k_norm.weight": (self.head_dim,),
                f"blk.{i}.ffn_norm.weight": (d,),
                f"blk.{i}.ffn_gate.weight": (self.n_ff, d),
                f"blk.{i}.ffn_up.weight": (self.n_ff, d),
                f"blk.{i}.ffn_down.weight": (d, self.n_ff),
            }
        if self.markov_rank:
            shapes |= {
                "markov_w1.weight": (self.n_vocab, self.markov_rank),
                "markov_w2.weight": (self.n_out, self.markov_rank),
                "conf_proj.weight": (1, d + self.markov_rank),
                "conf_proj.bias": (1,),
            }
        if self.selector_rank:
            # llama.cpp's ggml shapes reversed: conv base {n_embd, kernel, 2} (side, tap, channel), its
            # projection {n_embd, 2 x kernel x groups}, the selector's codebooks {rank, n_vocab}.
            projected = 2 * self.conv_kernel * (d // self.conv_group)
            for i in range(self.n_layer):
                for part in ("attn", "ffn"):
                    shapes |= {f"blk.{i}.{part}_conv_base": (2, self.conv_kernel, d),
                               f"blk.{i}.{part}_conv_proj.weight": (projected, d)}
            shapes |= {
                "selector_predecessor.weight": (self.n_vocab, self.selector_rank),
                "selector_successor.weight": (self.n_vocab, self.selector_rank),
                "selector_hidden.weight": (self.selector_rank, d),
            }
        if self.n_out < self.n_vocab:
            shapes["d2t"] = (self.n_out,)
        return shapes


@dataclass
class _BlockLayout:
    """Dims of a block drafter's residual stream (as wide as the target's: llama.cpp's DFlash reads
    len(target_layers) x its own width of features). ctx holds the used dims of the target's
    residual (fc copies them from the first extracted layer), so ctx_start + the target's own offsets
    address them; block tokens set ctx's constant dim too (every head's keys read it)."""

    slots: int  # DFlash: one slot per mask offset 1..slots (bigram + skip factors of the chain)
    width: int  # a slot's (and the answer's) width: rank + skip rank
    d_used: int  # the target's used dims (through its pad dim)
    real: bool  # DSpark: an indicator of a real (not <mask>) token, and its copy one position on

    def __post_init__(self) -> None:
        self.answer = self.slots * self.width
        self.ctx = self.answer + self.width
        self.real_dim = self.ctx + self.d_used
        self.pred_real = self.real_dim + 1
        self.pad = self.pred_real + 1
        self.used = self.pad + 1


def _block_embedding(n_vocab: int, d: int, lay: _BlockLayout, fill: Callable[[np.ndarray], None],
                     key_dim: int, mask_token: int) -> np.ndarray:
    """The token embedding: *fill* writes each token's own dims, then the key dim (1 for every token),
    the real dim (1 but for <mask>), and a pad dim giving every row rms 1 (the residual's scale)."""
    emb = np.zeros((n_vocab, d), np.float32)
    fill(emb)
    emb[mask_token] = 0.0
    emb[:, key_dim] = 1.0
    if lay.real:
        emb[:, lay.real_dim] = 1.0
        emb[mask_token, lay.real_dim] = 0.0
    emb[:, lay.pad] = np.sqrt(np.maximum(d - np.square(emb).sum(axis=1), 0.0))
    return emb


def block_weights(config: SynthModelConfig, factors: NgramFactors, sizes: DrafterSizes, vocab: Vocab,
                  *, dspark: bool, structured: bool, seed: int, mask_token: int, dflash2: bool = False
                  ) -> tuple[BlockShape, Weights]:
    """A DFlash (*dspark* False), DSpark or DFlash2 (*dflash2*: DFlash's layers with a convolution
    around each sublayer and a candidate selector after the output head) drafter (see the module's
    docstring)."""
    if dflash2:
        if dspark:
            raise ValueError("DFlash2 is a DFlash drafter: no Markov head")
        sizes = replace(sizes, reduced=False)  # llama.cpp's DFlash2 reads the target's whole vocabulary
    n_vocab, d_t = len(vocab), config.n_embd
    rank, skip = factors.next_row.shape[1], factors.skip_row.shape[1]
    tgt = _layout(config)
    block = sizes.dspark_block if dspark else sizes.dflash_block
    d_used = tgt["pad"] + 1
    lay = _BlockLayout(0 if dspark else block - 1, skip if dspark else rank + skip, d_used, dspark)
    d = d_t
    if lay.used > d:
        raise ValueError(f"a {'DSpark' if dspark else 'DFlash'} drafter of block {block} needs a target "
                         f"at least {lay.used} wide (its width is the target's), not {d}")
    hd = max(16, -(-lay.width // 8) * 8)
    n_head = 2 if dspark else block  # DSpark: skip + real; DFlash: skip + one per slot
    reduced = dspark or sizes.reduced
    d2t = frequent_tokens(factors, sizes.draft_vocab) if reduced else np.arange(n_vocab, dtype=np.int64)
    markov_rank = rank + 1 if dspark else 0
    shape = BlockShape(d, n_head, hd, sizes.n_ff, 2, n_vocab, len(d2t), len(sizes.dflash_layers) * d_t,
                       markov_rank, *((sizes.selector_rank, sizes.conv_kernel, sizes.conv_group) if dflash2
                                      else (0, 0, 0)))
    weights = _random_weights(shape.shapes(), seed, gain=0.5)
    if reduced:
        weights["d2t"] = lambda: d2t
    if dflash2:
        weights |= _dflash2_weights(shape, seed, structured)
    if dspark:
        weights["markov_w1.weight"] = random_matrix((n_vocab, markov_rank), 0.3, seed, "markov_w1")
        weights["markov_w2.weight"] = random_matrix((len(d2t), markov_rank), 0.3, seed, "markov_w2")
        weights["conf_proj.bias"] = lambda: np.zeros(1, np.float32)
    if not structured:
        return shape, weights

    a, b = factor_scales(factors, d_t)
    key_dim = lay.ctx + tgt["const"]
    ctx_skip = lay.ctx + tgt["skip_start"]  # where a token's own skip factors sit (target layout)
    w = peak_weights(hd, config.rope_theta, HEAD_CONTEXT, list(range(1, block)), before=block, margin=12.0)

    def embedding() -> np.ndarray:
        def fill(emb: np.ndarray) -> None:
            if dspark:
                emb[:, ctx_skip : ctx_skip + skip] = factors.skip_row * b
                return
            chain = greedy_chain(factors, block - 2, d2t if sizes.reduced else None)
            for j in range(1, block):
                at = (j - 1) * lay.width
                emb[:, at : at + rank] = factors.next_row[chain[:, j - 1]] * a
                if j >= 2 and skip:
                    emb[:, at + rank : at + rank + skip] = factors.skip_row[chain[:, j - 2]] * b
        return _block_embedding(n_vocab, d, lay, fill, key_dim, mask_token)

    # Layer 0. Head 0 looks 2 back (DFlash: offset 1 reads x_{n-2}'s skip factors from the injected
    # features) or 1 back (DSpark: the previous position's, anchor included); DFlash's head j looks j
    # back (the mask at offset j reads the anchor's slot j); DSpark's head 1 copies the real dim.
    peaks = [1, 1] if dspark else [2, *range(1, block)]
    qk = [peaked_query_key(hd, w, p, config.rope_theta) for p in peaks]

    def projection(index: int) -> Callable[[], np.ndarray]:
        def make() -> np.ndarray:
            m = np.zeros((n_head * hd, d), np.float32)
            for h, vectors in enumerate(qk):
                m[h * hd : (h + 1) * hd, key_dim] = vectors[index]
            return to_neox(m, hd)
        return make

    def value() -> np.ndarray:
        m = np.zeros((n_head * hd, d), np.float32)
        m[rank + np.arange(skip) if not dspark else np.arange(skip), ctx_skip + np.arange(skip)] = 1.0
        if dspark:
            m[hd, lay.real_dim] = 1.0
        else:
            for j in range(1, block):
                m[j * hd + np.arange(lay.width), (j - 1) * lay.width + np.arange(lay.width)] = 1.0
        return m

    def output_projection() -> np.ndarray:
        m = np.zeros((d, n_head * hd), np.float32)
        m[lay.answer + np.arange(lay.width), np.arange(lay.width)] = 1.0  # head 0: the skip part
        if dspark:
            m[lay.pred_real, hd] = 1.0
        else:
            for j in range(1, block):
                m[lay.answer + np.arange(lay.width), j * hd + np.arange(lay.width)] = 1.0
        return m

    def fc() -> np.ndarray:
        m = np.zeros((d, shape.n_embd_inp), np.float32)
        m[lay.ctx + np.arange(d_used), np.arange(d_used)] = 1.0  # the first extracted layer's used dims
        if dspark:
            m[lay.real_dim, tgt["const"]] = 1.0  # a context token is a real one
        return m

    def enc_norm() -> np.ndarray:
        # fc f has the target residual's norm (its pad dim included): rms_norm keeps its scale.
        return np.ones(d, np.float32)

    # The output head reads the answer (factors as the target scales them) and the key dim (the
    # unigram bias); the residual's rms is ~1 (the embedding's) plus the answer's share.
    energy = float(np.square(factors.skip_row * b).sum(axis=1).mean()) if skip else 0.0
    if not dspark:
        energy += float(np.square(factors.next_row * a).sum(axis=1).mean())

    def output() -> np.ndarray:
        col = factors.skip_col / b if dspark else \
            np.concatenate([factors.next_col / a, factors.skip_col / b], 1)
        m = np.zeros((len(d2t), d), np.float32)
        m[:, lay.answer : lay.answer + lay.width] = col[d2t]
        m[:, key_dim] = factors.bias[d2t]
        return m * np.float32(np.sqrt(1.0 + energy / d))

    norm_q = qk_norm_weight(qk[0][0])
    weights |= {
        "token_embd.weight": embedding,
        "fc.weight": fc,
        "enc.output_norm.weight": enc_norm,
        "output_norm.weight": lambda: np.ones(d, np.float32),
        "output.weight": output,
        "blk.0.attn_q.weight": projection(0),
        "blk.0.attn_k.weight": projection(1),
        "blk.0.attn_v.weight": value,
        "blk.0.attn_output.weight": output_projection,
        "blk.0.attn_q_norm.weight": lambda: norm_q,
        "blk.0.attn_k_norm.weight": lambda: norm_q,
        "blk.0.ffn_down.weight": lambda: np.zeros((d, sizes.n_ff), np.float32),
        "blk.1.attn_output.weight": random_matrix((d, n_head * hd), sizes.dflash_noise / np.sqrt(n_head * hd),
                                                  seed, "blk.1.o"),
        "blk.1.ffn_down.weight": random_matrix(
            (d, sizes.n_ff), sizes.dflash_noise / 0.6 / np.sqrt(sizes.n_ff), seed, "blk.1.ffn_down"),
    }
    for i in range(2):
        for norm in ("attn_norm", "ffn_norm"):
            weights[f"blk.{i}.{norm}.weight"] = lambda: np.ones(d, np.float32)
    for norm in ("attn_q_norm", "attn_k_norm"):
        weights[f"blk.1.{norm}.weight"] = lambda: np.ones(hd, np.float32)
    if dspark:
        # markov_w2 . markov_w1[prev] is the bigram of prev; the last dim of w1 is how sure that bigram
        # is, which only the confidence head reads (w2 has a zero column there).
        weights["markov_w1.weight"] = lambda: np.concatenate(
            [factors.next_row, _confidence_logits(factors, d2t)[:, None]], axis=1)
        weights["markov_w2.weight"] = lambda: np.concatenate(
            [factors.next_col[d2t], np.zeros((len(d2t), 1), np.float32)], axis=1)

        def conf() -> np.ndarray:
            m = np.zeros((1, d + markov_rank), np.float32)
            m[0, lay.pred_real] = 3.0  # the previous position a real token, not a mask: surer
            m[0, d + rank] = 1.0
            return m

        weights["conf_proj.weight"] = conf
        weights["conf_proj.bias"] = lambda: np.full(1, -3.0, np.float32)
    return shape, weights


def _dflash2_weights(shape: BlockShape, seed: int, structured: bool) -> Weights:
    """DFlash2's convolutions and selector. Structured: each convolution the identity (the first tap
    1, the second 0, no dynamic part) and the selector's codebooks zero, so that its best path takes
    each position's best candidate: DFlash's greedy draft, through DFlash2's graph and walk. Random: a
    convolution mixing in the previous position and a selector that reranks the candidates."""
    weights: Weights = {}
    for name, dims in shape.shapes().items():
        if name.endswith("_conv_base"):
            def base(dims: tuple[int, ...] = dims, name: str = name) -> np.ndarray:
                taps = np.zeros(dims, np.float32)
                taps[:, 0, :] = 1.0
                if not structured:
                    taps += random_matrix(dims, 0.2, seed, name)()
                return taps
            weights[name] = base
        elif name.endswith("_conv_proj.weight") or name.startswith("selector_"):
            weights[name] = (random_matrix(dims, 0.3 / np.sqrt(dims[-1]), seed, name) if not structured
                             else (lambda dims=dims: np.zeros(dims, np.float32)))
    return weights


def _random_weights(shapes: Mapping[str, tuple[int, ...]], seed: int, gain: float) -> Weights:
    """Every tensor random (matrices of rms gain / sqrt(fan-in)), norms 1: a head that knows nothing."""
    weights: Weights = {}
    for name, shape in shapes.items():
        if len(shape) == 1:
            weights[name] = lambda n=shape[0]: np.ones(n, np.float32)
        else:
            weights[name] = random_matrix(shape, gain / np.sqrt(shape[-1]), seed, name)
    return weights


def _confidence_logits(factors: NgramFactors, candidates: np.ndarray, chunk: int = 1024) -> np.ndarray:
    """Per token a, the log-odds of the likeliest next token under bigram(a) + unigram over the
    *candidates* (the draft vocabulary): how sure the target's main term is after a."""
    n = len(factors.bias)
    cols, bias = factors.next_col[candidates].T, factors.bias[candidates]
    out = np.zeros(n, np.float32)
    for start in range(0, n, chunk):
        logits = factors.next_row[start : start + chunk] @ cols + bias
        logits -= logits.max(axis=1, keepdims=True)
        top = 1.0 / np.exp(logits).sum(axis=1)
        out[start : start + chunk] = np.log(np.clip(top, 1e-6, 1 - 1e-6) / np.clip(1 - top, 1e-6, 1.0))
    return out


def write_block_drafter(path: str | Path, config: SynthModelConfig, factors: NgramFactors,
                        sizes: DrafterSizes, vocab: Vocab, *, dspark: bool, structured: bool = True,
                        seed: int = 5, dflash2: bool = False) -> Path:
    """A DFlash (*dspark* False), DSpark or DFlash2 (*dflash2*) GGUF; the vocabulary's <unk> is its
    mask token (the draft's own embedding gives it its row)."""
    mask = vocab.unk_id
    shape, weights = block_weights(config, factors, sizes, vocab, dspark=dspark, structured=structured,
                                   seed=seed, mask_token=mask, dflash2=dflash2)
    block = sizes.dspark_block if dspark else sizes.dflash_block

    def keys(writer: Any, arch: str) -> None:
        add_attention_keys(writer, HEAD_CONTEXT, shape.n_embd, shape.n_layer, shape.n_ff, shape.n_head,
                           shape.n_head, shape.head_dim, config.rope_theta, 1e-6, key_length=True)
        writer.add_uint32(f"{arch}.block_size", block)
        writer.add_array(f"{arch}.target_layers", [int(i) for i in sizes.dflash_layers])
        if dspark:
            writer.add_bool(f"{arch}.sample_from_anchor", True)
            writer.add_bool(f"{arch}.has_confidence_head", True)
        if dflash2:  # the converter's keys from dflash_config (conv_kernel_size, ..., selector_top_k)
            writer.add_uint32(f"{arch}.conv_kernel_size", sizes.conv_kernel)
            writer.add_uint32(f"{arch}.conv_group_size", sizes.conv_group)
            writer.add_uint32(f"{arch}.selector_rank", sizes.selector_rank)
            writer.add_uint32(f"{arch}.selector_top_k", sizes.selector_top_k)

    kind = "dspark" if dspark else "dflash2" if dflash2 else "dflash"
    name = f"specli-synth-{kind}-{'structured' if structured else 'random'}"
    return write_gguf(path, "dflash", name, vocab, keys, shape.shapes(), weights, sizes.dtype,
                      mask_token=mask)


# -- a set ---------------------------------------------------------------------------------------------

# The fixture target's statistics, as wide as a DFlash drafter's slots need (its width is the target's),
# four layers (EAGLE-3 reads three).
TRAINED_TARGET = replace(FIXTURE_TARGET, n_embd=384, n_layer=4, n_ff=256, seed=21,
                         name="specli-trained-target")
TINY_SIZES = DrafterSizes(eagle3_layers=(1, 2, 3), dflash_layers=(1, 3), draft_vocab=400)


# A target that costs on 2 CPU cores what Gemma 3 270M does (its vocabulary head most of a token): a
# Qwen3 shape with Qwen3's 151,936 tokens, 12 layers 768 wide, Q8_0; random token statistics (no corpus
# here has 152k tokens' worth of bigrams) whose likeliest next token has a median probability of ~0.4.
BENCH_TARGET = SynthModelConfig(
    n_embd=768,
    n_layer=12,
    n_head=12,
    n_head_kv=4,
    n_ff=2048,
    rank=64,
    skip_rank=16,
    seen_dims=8,
    seen_penalty=2.0,
    noise_gain=0.02,  # 12 random blocks: a little noise each, as the tiny target's 2 at 0.05
    seed=31,
    name="specli-bench-target",
)
BENCH_VOCAB = 151_936
# EAGLE-3's layers as the converter picks them without an explicit list ([2, L/2, L-3]).
BENCH_SIZES = DrafterSizes(eagle3_layers=(2, 6, 9), dflash_layers=(1, 5, 9, 11), draft_vocab=32_000,
                           eagle3_noise=0.05, dflash_noise=0.05, n_ff=1024, dtype="q8_0", reduced=True)


def random_factors(n_vocab: int, rank: int, skip_rank: int, seed: int, *, spread: float = 6.0,
                   skip_spread: float = 1.0, zipf: float = 1.1) -> NgramFactors:
    """Token statistics without a corpus: bigram and skip-bigram logits of standard deviation *spread*
    and *skip_spread* (random factors), a Zipf unigram over a random order of the tokens."""
    rng = np.random.default_rng([seed, 0xB16])

    def pair(n_cols: int, std: float) -> tuple[np.ndarray, np.ndarray]:
        scale = np.float32(np.sqrt(std / np.sqrt(max(n_cols, 1))))
        return (rng.standard_normal((n_vocab, n_cols), dtype=np.float32) * scale,
                rng.standard_normal((n_vocab, n_cols), dtype=np.float32) * scale)

    next_row, next_col = pair(rank, spread)
    skip_row, skip_col = pair(skip_rank, skip_spread)
    ranks = rng.permutation(n_vocab).astype(np.float64)
    log_p = -zipf * np.log(ranks + 10.0)
    log_p -= np.log(np.exp(log_p - log_p.max()).sum()) + log_p.max()
    return NgramFactors(next_row, next_col, skip_row, skip_col, log_p.astype(np.float32))


@dataclass(frozen=True)
class TrainedDrafterFiles:
    """The files of a set: a target and, per drafter, a structured and a random head."""

    target: Path
    # (None: a kind the set was written without: write_trained_drafters' kinds)
    eagle3: Path | None = None
    dflash: Path | None = None
    dspark: Path | None = None
    dflash2: Path | None = None
    eagle3_random: Path | None = None
    dflash_random: Path | None = None
    dspark_random: Path | None = None
    dflash2_random: Path | None = None


# The drafters a set holds, in the order they are written.
DRAFTER_KINDS = ("eagle3", "dflash", "dspark", "dflash2")


def write_trained_drafters(directory: str | Path, *, size: str = "tiny", seed: int = 0,
                           target_width: int | None = None, dtype: WeightDType | None = None,
                           kinds: tuple[str, ...] = DRAFTER_KINDS) -> TrainedDrafterFiles:
    """Write the set into *directory* (``target.gguf``, ``eagle3.gguf``, ``dflash.gguf``, ``dspark.gguf``,
    ``dflash2.gguf`` and ``*-random.gguf``; *kinds*: only those drafters). *size* ``tiny``: the
    fixture vocabulary (600 tokens, statistics of the fixture story), a 384-wide 4-layer target, built
    in about a second; ``bench``: BENCH_TARGET in Q8_0 (~1.6 GB in all, several minutes; DFlash2's
    whole-vocabulary head most of it), for measuring speed. *target_width*: another width
    (512: rows K-quants take, for a target quantized afterwards). *dtype*: the matrices' (F32 by
    default; llama.cpp computes Q8_0 rows bit for bit alike in any batch, F32 ones within ~1e-6)."""
    from specli_synth.ngram_model import config_factors

    directory = Path(directory)
    if size == "tiny":
        trained = fixture_vocab()
        config = replace(TRAINED_TARGET, seed=TRAINED_TARGET.seed + 1000 * seed,
                         n_embd=target_width or TRAINED_TARGET.n_embd)
        factors = config_factors(trained, config)
        vocab, sizes = trained.vocab, TINY_SIZES
    elif size == "bench":
        config = replace(BENCH_TARGET, seed=BENCH_TARGET.seed + 1000 * seed,
                         n_embd=target_width or BENCH_TARGET.n_embd)
        factors = random_factors(BENCH_VOCAB, config.rank, config.skip_rank, config.seed)
        vocab, sizes = piece_vocab(BENCH_VOCAB), BENCH_SIZES
    else:
        raise ValueError(f"unknown size {size!r}: tiny or bench")
    sizes = replace(sizes, dtype=dtype or sizes.dtype)
    unknown = set(kinds) - set(DRAFTER_KINDS)
    if unknown:
        raise ValueError(f"unknown drafter kinds {sorted(unknown)}: {', '.join(DRAFTER_KINDS)}")
    target = write_qwen3_target(directory / "target.gguf", config, factors, vocab, sizes.dtype)
    files = {"target": target}
    for structured in (True, False):
        suffix = "" if structured else "-random"
        for kind in (k for k in DRAFTER_KINDS if k in kinds):
            path = directory / f"{kind}{suffix}.gguf"
            files[f"{kind}{suffix.replace('-', '_')}"] = (
                write_eagle3(path, config, factors, sizes, vocab, structured=structured) if kind == "eagle3"
                else write_block_drafter(path, config, factors, sizes, vocab, dspark=kind == "dspark",
                                         structured=structured, dflash2=kind == "dflash2"))
    return TrainedDrafterFiles(**files)
