"""A Gemma 4 target and its Gemma 4 assistant (the drafter Google ships beside each Gemma 4 model), written
as llama.cpp's converter writes them (``conversion/gemma.py``: Gemma4Model, Gemma4AssistantModel) and as
``src/models/gemma4.cpp`` / ``gemma4-assistant.cpp`` load them.

    write_gemma4_set(DIR)  ->  DIR/gemma4-target.gguf, gemma4-assistant.gguf, gemma4-assistant-random.gguf

llama.cpp runs the assistant as an MTP context over the target's (``--spec-type draft-mtp``,
``common_speculative_impl_draft_mtp``): it writes no KV of its own; its sliding-window layers read the
target's layer ``n_layer - 2`` K/V cache and its full-attention layers the target's layer ``n_layer - 1``
(the ``share`` callback of ``llama_model::create_memory``), so those two target layers must be a
sliding-window and a full-attention one with the assistant's head sizes and KV-head counts. It decodes
the last accepted token x_p at position p with the target's post-final-norm hidden state h_{p-1} (the one
that predicted x_p) and predicts x_{p+1}; each further draft step decodes the drafted token at the *same*
position p with the assistant's own h (``nextn.post_projection`` . its final state).

Statistics: the fixture story's (:func:`~specli_synth.fixtures.fixture_vocab`, FIXTURE_TARGET's ranks):
logits ~ bigram(current) + skip-bigram(previous) + unigram - repetition penalty
(:class:`~specli_synth.ngram_stats.NgramFactors`).

* **target** (``gemma4``): 128 wide, 4 layers ``[swa, swa, swa, full]`` (window 64), 4 query heads of 32
  over 2 KV heads, no per-layer embeddings, no MoE, no shared-KV layers, an untied ``output.weight``,
  ``rope_freqs`` (the converter's proportional RoPE: a quarter of the full layers' pairs rotate),
  final logit softcapping 30 (monotonic: the greedy token is the uncapped one's). Residual layout
  (``_Layout``): the bigram factors first (``a * next_row``), then the token's own skip-bigram factors,
  the skip slot, a random token code, the seen slot, a value pad, a norm pad, two junk dims and a constant
  dim (starting a Q8_0 block of its own where the width allows); llama.cpp scales the embedding by
  sqrt(n_embd), so the file stores the rows divided by it. Gemma 4 RMS-normalizes every V head without a
  weight and every block's output (the post-norms), so a block's contribution is whatever its post-norm
  weights say: the hand-built heads therefore read values of constant norm (the value pad tops the skip
  factors up to one norm; the codes have one norm and ride beside a constant) and their post-norm weights
  are zero outside the dims they write.
  Layers 0 and 1: random attention and feed-forward blocks whose post-norm weights (0.015) make them
  small noise. Layer 2 (sliding): a previous-token head (constant q and k from the constant dim, RoPE
  phases peaked at distance 1, attention scale 1 folded into the q norm) copying the previous token's
  skip factors into the skip slot. Layer 3 (full): q = k = 0, uniform attention, the context's average
  token code into the seen slot (the output rows subtract seen_penalty times the share of the
  context that is token j). Output row j: ``[next_col_j / a, skip_col_j / b, -penalty z_j / |z|^2,
  bias_j]`` over the bigram dims, skip slot, seen slot and constant dim, times the residual's rms.
* **assistant** (``gemma4-assistant``, 96 wide, 2 layers ``[swa, full]``, ``embedding_length_out`` =
  128, ``nextn_predict_layers`` = block count). *structured* (it predicts what the target will predict
  at x_{p+1}): ``nextn.pre_projection`` copies the target embedding of x_p (the graph's
  ``token_embd_target(x) * sqrt(128)``) dim for dim, so its bigram dims are the target's, and adds
  (1 - kv_share) of h's skip-factor dims (h_{p-1} carries x_{p-1}'s own skip factors) into the skip
  slot; its sliding layer is the target's previous-token query over the target's layer-2 cache (the
  cell at p - 1: x_{p-1}'s skip factors again) adding the other kv_share; its full layer attends
  uniformly over the target's layer-3 cache and fills the seen slot. Its head (``token_embd``, the
  whole vocabulary) reads the bigram dims (its first ``assistant_rank`` factors only), the skip and
  seen slots and the constant dim as the target's does; ``nextn.post_projection`` maps its state back
  to the target's layout, so the h it hands itself carries the drafted token's skip factors. What it
  does not know (the target's noise blocks, the bigram factors past its rank, the current and drafted
  tokens in the repetition penalty, and, at later steps, the stale cell p - 1 behind kv_share of the
  skip term, since all steps sit at position p) keeps acceptance realistic; a wrong h or a wrong KV
  cache moves its logits (llama-speculative-simple at temperature 0, draft max 3: ~55-65 % accepted,
  F32 or Q8_0). *random*: every matrix random (a useless head for rollback and exactness tests), the
  same shapes and KV layout.

``write_gemma4_set(DIR, size="bench")`` (GEMMA4_BENCH_SIZES, Q8_0, for measuring speed): Gemma's
262,144-token vocabulary (:func:`~specli_synth.vocab.piece_vocab`, random statistics from
:func:`~specli_synth.trained_drafters.random_factors` with BENCH_TARGET's ranks: 64 bigram factors, 16
skip-bigram ones, 8 seen dims), a target 640 wide with 8 layers (7 sliding-window of window 512, the
last full), 4 query heads of 128 over 1 KV head, feed-forward 2048 (~10 ms a token on 2 CPU cores, its
output head most of it), and assistants 256 wide with 4 layers ``[swa, swa, swa, full]``: the first
sliding layer is the previous-token head, the others random attention (small noise, as the
feed-forward blocks), the full one the uniform head. The random factors are all alike in weight, so
the structured assistant's head knows 63 of the 64 (llama-speculative-simple at temperature 0, draft
max 3: ~50-60 % accepted).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from specli_synth.fixtures import FIXTURE_TARGET, fixture_vocab
from specli_synth.gguf_writer import WeightDType, add_attention_keys
from specli_synth.ngram_model import config_factors, factor_scales, random_matrix
from specli_synth.ngram_stats import NgramFactors
from specli_synth.rope_heads import peak_weights, peaked_query_key, qk_norm_weight, to_neox
from specli_synth.trained_drafters import BENCH_TARGET, random_factors, write_gguf
from specli_synth.vocab import Vocab, piece_vocab

Weights = dict[str, Callable[[], np.ndarray]]


@dataclass(frozen=True)
class Gemma4Sizes:
    """The shapes of a target and its assistant, and the knobs that set acceptance."""

    n_embd: int = 128
    n_layer: int = 4  # the last full attention, the others sliding-window
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 32  # sliding and full layers alike (the assistant views the target's caches)
    n_ff: int = 128
    sliding_window: int = 64
    n_ctx_train: int = 4096
    rope_base: float = 1_000_000.0  # full-attention layers
    rope_base_swa: float = 10_000.0
    partial_rotary: float = 0.25  # the full layers' proportional RoPE (rope_freqs)
    softcap: float = 30.0
    noise_gain: float = 0.015  # rms each random block adds to the residual (its post-norm weight)
    assistant_embd: int = 96  # must differ from n_embd (llama.cpp requires it)
    assistant_swa: tuple[bool, ...] = (True, False)  # the assistant's layers: sliding-window or full
    assistant_ff: int = 128
    assistant_rank: int = 24  # the bigram factors the structured assistant's head knows
    kv_share: float = 0.3  # the share of the skip-bigram term it reads from the shared KV, not h
    seen_pad: float = 2.0  # the constant beside the token codes in the seen values (times |z|)
    # None: the fixture vocabulary (600 tokens) and its story's statistics; a size: piece_vocab(n_vocab)
    # and random statistics (random_factors with BENCH_TARGET's ranks, seen dims and penalty)
    n_vocab: int | None = None

    def __post_init__(self) -> None:
        if self.n_layer < 2:
            raise ValueError("the target needs n_layer >= 2 (the assistant reads its last two layers)")
        if self.assistant_embd == self.n_embd:
            raise ValueError("llama.cpp requires the assistant's width to differ from the target's")
        if self.n_head % self.n_head_kv:
            raise ValueError("n_head must be a multiple of n_head_kv")
        if all(self.assistant_swa) or not any(self.assistant_swa):
            raise ValueError("the assistant needs a sliding-window layer and a full-attention one")

    def assistant_roles(self) -> list[str]:
        """Each assistant layer's attention: ``previous`` (its first sliding layer: the previous-token
        head), ``seen`` (its last full layer: the uniform one), ``noise`` (any other: random)."""
        first_swa = self.assistant_swa.index(True)
        last_full = len(self.assistant_swa) - 1 - self.assistant_swa[::-1].index(False)
        return ["previous" if i == first_swa else "seen" if i == last_full else "noise"
                for i in range(len(self.assistant_swa))]


GEMMA4_SIZES = Gemma4Sizes()

# A target shaped like a small real Gemma (Gemma 3 270M's width, vocabulary and feed-forward, fewer
# layers and narrower heads) whose one-token decode costs ~10 ms on 2 CPU cores in Q8_0 (its
# 262,144-token output head most of it), and an assistant a quarter as wide, as Google's are beside
# their targets: four layers [swa, swa, swa, full], its own head over the whole vocabulary.
GEMMA4_BENCH_SIZES = Gemma4Sizes(
    n_embd=640,
    n_layer=8,
    n_head=4,
    n_head_kv=1,
    head_dim=128,
    n_ff=2048,
    sliding_window=512,
    n_ctx_train=32768,
    noise_gain=0.01,
    assistant_embd=256,
    assistant_swa=(True, True, True, False),
    assistant_ff=1024,
    assistant_rank=63,  # of 64 random factors, each as strong as any other: ~50-60 % accepted
    n_vocab=262_144,
)


@dataclass(frozen=True)
class _Layout:
    """Where things live in the target's residual (the assistant uses the same dims for them)."""

    rank: int
    skip: int
    seen: int
    const: int  # the constant dim: after the others, alone in its Q8_0 block when the width allows

    @property
    def skip_src(self) -> int:  # the token's own skip-bigram factors
        return self.rank

    @property
    def skip_slot(self) -> int:  # the previous token's, filled by the previous-token head
        return self.rank + self.skip

    @property
    def code(self) -> int:
        return self.rank + 2 * self.skip

    @property
    def seen_slot(self) -> int:
        return self.code + self.seen

    @property
    def vpad(self) -> int:  # tops the skip factors up to one norm (a V head is RMS-normalized)
        return self.seen_slot + self.seen

    @property
    def pad(self) -> int:  # tops the embedding row up to norm sqrt(n_embd)
        return self.vpad + 1

    @property
    def junk_skip(self) -> int:  # where the previous-token head's value pad lands
        return self.vpad + 2

    @property
    def junk_seen(self) -> int:  # where the uniform head's constant lands
        return self.vpad + 3

    @property
    def used(self) -> int:
        return self.const + 1

    @staticmethod
    def of(rank: int, skip: int, seen: int, width: int) -> _Layout:
        """The layout of these ranks in a residual of *width* (the narrower of target and assistant):
        the constant dim (the unigram bias's, the largest output column) starts a 32-wide block of its
        own where there is room, so that Q8_0 rows keep the other columns' precision."""
        after = rank + 2 * skip + 2 * seen + 4
        aligned = -(-after // 32) * 32
        return _Layout(rank, skip, seen, aligned if aligned < width else after)

    def embedding_dims(self) -> np.ndarray:
        """The dims a token's embedding row fills (the slots and junk dims are zero there)."""
        return np.concatenate([np.arange(self.skip_slot), np.arange(self.code, self.seen_slot),
                               [self.vpad, self.pad, self.const]])


@dataclass(frozen=True)
class Gemma4Design:
    """Everything both files are built from: deterministic for (sizes, seed)."""

    sizes: Gemma4Sizes
    vocab: Vocab
    factors: NgramFactors
    layout: _Layout
    seed: int
    next_scale: float  # a: the bigram rows' scale in the embedding
    skip_scale: float  # b
    skip_norm: float  # N_s: |[b skip_row, vpad]| for every token
    code_norm: float
    codes: np.ndarray  # (n_vocab, seen) random token codes of norm code_norm
    seen_penalty: float
    q_vec: np.ndarray  # the previous-token head's query and key (one head, normal RoPE layout)
    k_vec: np.ndarray

    @property
    def seen_const(self) -> float:
        return self.sizes.seen_pad * self.code_norm

    def skip_energy(self) -> float:
        return float(np.mean(np.square(self.factors.skip_row * self.skip_scale).sum(axis=1)))

    def target_rms(self) -> float:
        """The expected rms of the target's last residual (the final norm divides by it)."""
        s = self.sizes
        n_noise = 2 * (s.n_layer - 2) + 2  # the random attention blocks and every feed-forward one
        energy = s.n_embd + self.skip_norm**2 + self.seen_const**2 + n_noise * s.noise_gain**2 * s.n_embd
        return float(np.sqrt(energy / s.n_embd))

    def assistant_rms(self) -> float:
        s = self.sizes
        skip = self.skip_energy()
        n_noise = len(s.assistant_swa) + s.assistant_roles().count("noise")  # feed-forward, attention
        energy = (s.n_embd + skip + s.kv_share**2 * (self.skip_norm**2 - skip) + self.seen_const**2
                  + n_noise * s.noise_gain**2 * s.assistant_embd)
        return float(np.sqrt(energy / s.assistant_embd))


def gemma4_design(seed: int = 0, sizes: Gemma4Sizes = GEMMA4_SIZES) -> Gemma4Design:
    """The fixture story's statistics (FIXTURE_TARGET's ranks) laid out for a target of *sizes*; with
    ``sizes.n_vocab``, random statistics over a piece vocabulary of that size (BENCH_TARGET's ranks)."""
    if sizes.n_vocab is None:
        trained = fixture_vocab()
        config = replace(FIXTURE_TARGET, n_embd=sizes.n_embd, n_layer=sizes.n_layer, n_head=sizes.n_head,
                         n_head_kv=sizes.n_head_kv, n_ff=sizes.n_ff, seed=FIXTURE_TARGET.seed + 1000 * seed,
                         name="specli-gemma4-target")
        vocab, factors = trained.vocab, config_factors(trained, config)
        seen_dims, seen_penalty, stats_seed = config.seen_dims, config.seen_penalty, config.seed
    else:
        stats_seed = BENCH_TARGET.seed + 1000 * seed
        vocab, factors = _random_statistics(sizes.n_vocab, stats_seed)
        seen_dims, seen_penalty = BENCH_TARGET.seen_dims, BENCH_TARGET.seen_penalty
    layout = _Layout.of(factors.next_row.shape[1], factors.skip_row.shape[1], seen_dims,
                        min(sizes.n_embd, sizes.assistant_embd))
    if layout.used > sizes.assistant_embd or layout.used > sizes.n_embd:
        raise ValueError(f"the layout needs {layout.used} dims; the widths are too small")
    if layout.skip + 1 > sizes.head_dim or layout.seen + 1 > sizes.head_dim:
        raise ValueError("a head must hold the skip factors (or the codes) and a pad")
    a, b = factor_scales(factors, sizes.n_embd)
    skip_norm = float(np.linalg.norm(factors.skip_row * b, axis=1).max()) * 1.0001
    code_norm = float(np.sqrt(0.05 * sizes.n_embd))
    codes = np.random.default_rng([stats_seed, 0xC0DE]).standard_normal(
        (len(vocab), layout.seen), dtype=np.float32)
    codes *= np.float32(code_norm) / np.maximum(np.linalg.norm(codes, axis=1, keepdims=True), 1e-6)
    w = peak_weights(sizes.head_dim, sizes.rope_base_swa, sizes.sliding_window, [1], margin=8.0)
    q_vec, k_vec = peaked_query_key(sizes.head_dim, w, 1, sizes.rope_base_swa)
    return Gemma4Design(sizes, vocab, factors, layout, seed, a, b, skip_norm, code_norm, codes,
                        seen_penalty, q_vec, k_vec)


@lru_cache(maxsize=1)
def _random_statistics(n_vocab: int, seed: int) -> tuple[Vocab, NgramFactors]:
    """A piece vocabulary of *n_vocab* tokens and random statistics over it (BENCH_TARGET's ranks);
    cached, since the target and both assistants of a set are built from the same ones."""
    return piece_vocab(n_vocab), random_factors(n_vocab, BENCH_TARGET.rank, BENCH_TARGET.skip_rank, seed)


# -- shapes ---------------------------------------------------------------------------------------------


def _layer_shapes(i: int, d: int, n_head: int, n_head_kv: int, hd: int, n_ff: int, *, kv: bool
                  ) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {
        f"blk.{i}.attn_norm.weight": (d,),
        f"blk.{i}.attn_q.weight": (n_head * hd, d),
    }
    if kv:
        shapes |= {f"blk.{i}.attn_k.weight": (n_head_kv * hd, d),
                   f"blk.{i}.attn_v.weight": (n_head_kv * hd, d)}
    shapes |= {
        f"blk.{i}.attn_output.weight": (d, n_head * hd),
        f"blk.{i}.attn_q_norm.weight": (hd,),
    }
    if kv:
        shapes[f"blk.{i}.attn_k_norm.weight"] = (hd,)
    return shapes | {
        f"blk.{i}.post_attention_norm.weight": (d,),
        f"blk.{i}.layer_output_scale.weight": (1,),
        f"blk.{i}.ffn_norm.weight": (d,),
        f"blk.{i}.ffn_gate.weight": (n_ff, d),
        f"blk.{i}.ffn_up.weight": (n_ff, d),
        f"blk.{i}.ffn_down.weight": (d, n_ff),
        f"blk.{i}.post_ffw_norm.weight": (d,),
    }


def gemma4_target_shapes(sizes: Gemma4Sizes, n_vocab: int) -> dict[str, tuple[int, ...]]:
    """The target's tensors (numpy shapes (out, in); GGUF stores them reversed)."""
    s = sizes
    shapes: dict[str, tuple[int, ...]] = {
        "token_embd.weight": (n_vocab, s.n_embd),
        "output_norm.weight": (s.n_embd,),
        "output.weight": (n_vocab, s.n_embd),
        "rope_freqs.weight": (s.head_dim // 2,),
    }
    for i in range(s.n_layer):
        shapes |= _layer_shapes(i, s.n_embd, s.n_head, s.n_head_kv, s.head_dim, s.n_ff, kv=True)
    return shapes


def gemma4_assistant_shapes(sizes: Gemma4Sizes, n_vocab: int) -> dict[str, tuple[int, ...]]:
    """The assistant's tensors: its head (``token_embd``), the projections in and out, its layers (no
    K/V projections: it reads the target's caches)."""
    s, d = sizes, sizes.assistant_embd
    shapes: dict[str, tuple[int, ...]] = {
        "token_embd.weight": (n_vocab, d),
        "output_norm.weight": (d,),
        "nextn.pre_projection.weight": (d, 2 * s.n_embd),
        "nextn.post_projection.weight": (s.n_embd, d),
    }
    if not all(s.assistant_swa):
        shapes["rope_freqs.weight"] = (s.head_dim // 2,)
    for i in range(len(s.assistant_swa)):
        shapes |= _layer_shapes(i, d, s.n_head, s.n_head_kv, s.head_dim, s.assistant_ff, kv=False)
    return shapes


# -- weights --------------------------------------------------------------------------------------------


def _ones(n: int, value: float = 1.0) -> Callable[[], np.ndarray]:
    return lambda: np.full(n, value, np.float32)


def _rope_freqs(sizes: Gemma4Sizes) -> Callable[[], np.ndarray]:
    """The converter's proportional RoPE for full layers: the first pairs rotate, the rest do not."""
    n_pairs = sizes.head_dim // 2
    n_rot = int(sizes.head_dim * sizes.partial_rotary / 2)
    return lambda: np.array([1.0] * n_rot + [1e30] * (n_pairs - n_rot), np.float32)


def _noise_block(weights: Weights, shapes: dict[str, tuple[int, ...]], i: int, seed: int, gain: float,
                 *, attention: bool) -> None:
    """Random matrices for layer i's feed-forward block (and attention, with *attention*): the post-norm
    weight *gain* sets their contribution's rms; q norms of 1 / sqrt(head_dim) keep the scores ~1."""
    kinds = ["ffn_gate", "ffn_up", "ffn_down"] + (["attn_q", "attn_k", "attn_v", "attn_output"]
                                                  if attention else [])
    for kind in kinds:
        name = f"blk.{i}.{kind}.weight"
        if name in shapes:
            shape = shapes[name]
            weights[name] = random_matrix(shape, 1.0 / np.sqrt(shape[1]), seed, name)
    d = shapes[f"blk.{i}.ffn_norm.weight"][0]
    hd = shapes[f"blk.{i}.attn_q_norm.weight"][0]
    weights[f"blk.{i}.post_ffw_norm.weight"] = _ones(d, gain)
    if attention:
        weights[f"blk.{i}.post_attention_norm.weight"] = _ones(d, gain)
        weights[f"blk.{i}.attn_q_norm.weight"] = _ones(hd, 1.0 / np.sqrt(hd))


def _head_rows(vector: np.ndarray, n_rows: int, d: int, column: int, hd: int) -> Callable[[], np.ndarray]:
    """A q or k projection whose head 0 is *vector* (normal RoPE layout) times input dim *column*, every
    other head zero; rows moved to NeoX's layout (Gemma's RoPE)."""
    def make() -> np.ndarray:
        m = np.zeros((n_rows, d), np.float32)
        m[:hd, column] = vector
        return to_neox(m, hd)
    return make


def _copy_matrix(shape: tuple[int, int], dst: np.ndarray, src: np.ndarray, value: float = 1.0
                 ) -> Callable[[], np.ndarray]:
    def make() -> np.ndarray:
        m = np.zeros(shape, np.float32)
        m[dst, src] = value
        return m
    return make


def _slot_norm(d: int, dims: np.ndarray, value: float) -> Callable[[], np.ndarray]:
    """A post-norm weight that is *value* on *dims* and zero elsewhere: the block writes only there."""
    def make() -> np.ndarray:
        w = np.zeros(d, np.float32)
        w[dims] = value
        return w
    return make


def _output_rows(design: Gemma4Design, d: int, rank: int, gain: float) -> Callable[[], np.ndarray]:
    """An output head over a residual of width *d* laid out as the target's: the first *rank* bigram
    factors, the skip-bigram slot, the repetition penalty on the seen slot, the unigram bias."""
    lay, f = design.layout, design.factors

    def make() -> np.ndarray:
        out = np.zeros((len(f.bias), d), np.float32)
        out[:, :rank] = f.next_col[:, :rank] / design.next_scale
        out[:, lay.skip_slot : lay.skip_slot + lay.skip] = f.skip_col / design.skip_scale
        out[:, lay.seen_slot : lay.seen_slot + lay.seen] = design.codes * np.float32(
            -design.seen_penalty / design.code_norm**2)
        out[:, lay.const] = f.bias
        return out * np.float32(gain)
    return make


def gemma4_target_weights(design: Gemma4Design) -> Weights:
    """The target (see the module's docstring)."""
    s, lay, f = design.sizes, design.layout, design.factors
    d, hd, n_vocab = s.n_embd, s.head_dim, len(f.bias)
    shapes = gemma4_target_shapes(s, n_vocab)

    def token_embd() -> np.ndarray:
        emb = np.zeros((n_vocab, d), np.float32)
        emb[:, : lay.rank] = f.next_row * design.next_scale
        skip = f.skip_row * design.skip_scale
        emb[:, lay.skip_src : lay.skip_src + lay.skip] = skip
        emb[:, lay.vpad] = np.sqrt(np.maximum(design.skip_norm**2 - np.square(skip).sum(axis=1), 0.0))
        emb[:, lay.code : lay.code + lay.seen] = design.codes
        emb[:, lay.const] = 1.0
        emb[:, lay.pad] = np.sqrt(np.maximum(d - np.square(emb).sum(axis=1), 0.0))
        return emb / np.float32(np.sqrt(d))  # llama.cpp multiplies by sqrt(n_embd)

    weights: Weights = {
        "token_embd.weight": token_embd,
        "output_norm.weight": _ones(d),
        "output.weight": _output_rows(design, d, lay.rank, design.target_rms()),
        "rope_freqs.weight": _rope_freqs(s),
    }
    for name, shape in shapes.items():
        if len(shape) == 1 and name not in weights:
            weights[name] = _ones(shape[0])
    seed = design.seed * 1000 + 77
    prev, last = s.n_layer - 2, s.n_layer - 1
    for i in range(s.n_layer):
        _noise_block(weights, shapes, i, seed, s.noise_gain, attention=i < prev)
    width_q, width_kv = s.n_head * hd, s.n_head_kv * hd
    head = np.arange(lay.skip + 1)
    skip_dims = np.concatenate([lay.skip_slot + np.arange(lay.skip), [lay.junk_skip]])
    code_dims = np.concatenate([lay.code + np.arange(lay.seen), [lay.const]])
    seen_dims = np.concatenate([lay.seen_slot + np.arange(lay.seen), [lay.junk_seen]])
    weights |= {
        # layer n-2 (sliding): the previous-token head; its value, [b skip_row, vpad], has norm N_s for
        # every token, so V's RMS norm scales it by a constant the post-norm weight undoes.
        f"blk.{prev}.attn_q.weight": _head_rows(design.q_vec, width_q, d, lay.const, hd),
        f"blk.{prev}.attn_k.weight": _head_rows(design.k_vec, width_kv, d, lay.const, hd),
        f"blk.{prev}.attn_q_norm.weight": _ones(hd, qk_norm_weight(design.q_vec)[0] / np.sqrt(hd)),
        f"blk.{prev}.attn_k_norm.weight": _ones(hd, qk_norm_weight(design.k_vec)[0]),
        f"blk.{prev}.attn_v.weight": _copy_matrix(
            (width_kv, d), head, np.concatenate([lay.skip_src + np.arange(lay.skip), [lay.vpad]])),
        f"blk.{prev}.attn_output.weight": _copy_matrix((d, width_q), skip_dims, head),
        f"blk.{prev}.post_attention_norm.weight": _slot_norm(d, skip_dims, design.skip_norm / np.sqrt(d)),
        # layer n-1 (full): q = k = 0, uniform attention; the value [z, c] (one norm for every token)
        f"blk.{last}.attn_q.weight": lambda: np.zeros((width_q, d), np.float32),
        f"blk.{last}.attn_k.weight": lambda: np.zeros((width_kv, d), np.float32),
        f"blk.{last}.attn_v.weight": _seen_value(design, width_kv, d, code_dims),
        f"blk.{last}.attn_output.weight": _copy_matrix((d, width_q), seen_dims, np.arange(lay.seen + 1)),
        f"blk.{last}.post_attention_norm.weight": _slot_norm(d, seen_dims, design.seen_const / np.sqrt(d)),
    }
    return weights


def _seen_value(design: Gemma4Design, rows: int, d: int, code_dims: np.ndarray) -> Callable[[], np.ndarray]:
    lay = design.layout

    def make() -> np.ndarray:
        m = np.zeros((rows, d), np.float32)
        m[np.arange(lay.seen), code_dims[:-1]] = 1.0
        m[lay.seen, lay.const] = design.seen_const
        return m
    return make


def gemma4_assistant_weights(design: Gemma4Design, *, structured: bool = True, seed: int = 5) -> Weights:
    """The assistant (see the module's docstring); *structured* False: random weights."""
    s, lay = design.sizes, design.layout
    d, dt, hd, n_vocab = s.assistant_embd, s.n_embd, s.head_dim, len(design.factors.bias)
    shapes = gemma4_assistant_shapes(s, n_vocab)
    weights: Weights = {}
    for name, shape in shapes.items():
        if len(shape) == 1:
            weights[name] = _ones(shape[0])
        else:
            weights[name] = random_matrix(shape, 0.5 / np.sqrt(shape[1]), seed, name)
    if "rope_freqs.weight" in shapes:
        weights["rope_freqs.weight"] = _rope_freqs(s)
    if not structured:
        for i in range(len(s.assistant_swa)):
            weights[f"blk.{i}.attn_q_norm.weight"] = _ones(hd, 1.0 / np.sqrt(hd))
        return weights
    rms_t, rms_a = design.target_rms(), design.assistant_rms()
    emb = lay.embedding_dims()
    skip_src = lay.skip_src + np.arange(lay.skip)
    skip_slot = lay.skip_slot + np.arange(lay.skip)

    def pre_projection() -> np.ndarray:
        m = np.zeros((d, 2 * dt), np.float32)
        m[emb, emb] = 1.0  # the target embedding of x_p, as the target's residual holds it
        m[skip_slot, dt + skip_src] = (1.0 - s.kv_share) * rms_t  # h_{p-1}'s own skip factors
        return m

    def post_projection() -> np.ndarray:
        m = np.zeros((dt, d), np.float32)
        m[np.arange(lay.used), np.arange(lay.used)] = rms_a / rms_t  # back to a target-like h
        return m

    width_q = s.n_head * hd
    skip_dims = np.concatenate([skip_slot, [lay.junk_skip]])
    seen_dims = np.concatenate([lay.seen_slot + np.arange(lay.seen), [lay.junk_seen]])
    weights |= {
        "token_embd.weight": _output_rows(design, d, min(s.assistant_rank, lay.rank), rms_a),
        "nextn.pre_projection.weight": pre_projection,
        "nextn.post_projection.weight": post_projection,
    }
    for i, role in enumerate(s.assistant_roles()):
        _noise_block(weights, shapes, i, seed, s.noise_gain, attention=role == "noise")
        if role == "previous":  # the previous-token query over the target's layer n-2 cache: kv_share
            weights |= {
                f"blk.{i}.attn_q.weight": _head_rows(design.q_vec, width_q, d, lay.const, hd),
                f"blk.{i}.attn_q_norm.weight": _ones(hd, qk_norm_weight(design.q_vec)[0] / np.sqrt(hd)),
                f"blk.{i}.attn_output.weight": _copy_matrix((d, width_q), skip_dims, np.arange(lay.skip + 1)),
                f"blk.{i}.post_attention_norm.weight": _slot_norm(
                    d, skip_dims, s.kv_share * design.skip_norm / np.sqrt(d)),
            }
        elif role == "seen":  # uniform over the target's layer n-1 cache (its keys are zero): the seen slot
            weights |= {
                f"blk.{i}.attn_q.weight": lambda: np.zeros((width_q, d), np.float32),
                f"blk.{i}.attn_output.weight": _copy_matrix((d, width_q), seen_dims, np.arange(lay.seen + 1)),
                f"blk.{i}.post_attention_norm.weight": _slot_norm(
                    d, seen_dims, design.seen_const / np.sqrt(d)),
            }
    return weights


# -- files ----------------------------------------------------------------------------------------------


def _common_keys(writer: Any, arch: str, s: Gemma4Sizes, n_embd: int, n_layer: int, n_ff: int,
                 swa: list[bool]) -> None:
    add_attention_keys(writer, s.n_ctx_train, n_embd, n_layer, n_ff, s.n_head, s.n_head_kv, s.head_dim,
                       s.rope_base, 1e-6, key_length=True)
    writer.add_key_length_swa(s.head_dim)
    writer.add_value_length_swa(s.head_dim)
    writer.add_rope_dimension_count_swa(s.head_dim)
    writer.add_rope_freq_base_swa(s.rope_base_swa)
    writer.add_sliding_window(s.sliding_window)
    writer.add_sliding_window_pattern(swa)
    writer.add_shared_kv_layers(0)
    writer.add_embedding_length_per_layer_input(0)


def write_gemma4_target(path: str | Path, *, seed: int = 0, dtype: WeightDType = "f32",
                        sizes: Gemma4Sizes = GEMMA4_SIZES) -> Path:
    """A ``gemma4`` GGUF: the fixture vocabulary, bigram-statistics logits (module docstring)."""
    design = gemma4_design(seed, sizes)
    swa = [i < sizes.n_layer - 1 for i in range(sizes.n_layer)]

    def keys(writer: Any, arch: str) -> None:
        _common_keys(writer, arch, sizes, sizes.n_embd, sizes.n_layer, sizes.n_ff, swa)
        if sizes.softcap:
            writer.add_final_logit_softcapping(sizes.softcap)

    shapes = gemma4_target_shapes(sizes, len(design.vocab))
    return write_gguf(path, "gemma4", "specli-gemma4-target", design.vocab, keys, shapes,
                      gemma4_target_weights(design), dtype)


def write_gemma4_assistant(path: str | Path, *, seed: int = 0, structured: bool = True,
                           dtype: WeightDType = "f32", sizes: Gemma4Sizes = GEMMA4_SIZES,
                           head_seed: int = 5) -> Path:
    """A ``gemma4-assistant`` GGUF for the target :func:`write_gemma4_target` writes with the same *seed*
    and *sizes*; *structured* False: random weights (seeded by *head_seed*)."""
    design = gemma4_design(seed, sizes)
    n_layer = len(sizes.assistant_swa)

    def keys(writer: Any, arch: str) -> None:
        _common_keys(writer, arch, sizes, sizes.assistant_embd, n_layer, sizes.assistant_ff,
                     list(sizes.assistant_swa))
        writer.add_embedding_length_out(sizes.n_embd)  # the target's hidden size (h's width)
        writer.add_nextn_predict_layers(n_layer)  # every block is an assistant layer

    name = f"specli-gemma4-assistant-{'structured' if structured else 'random'}"
    shapes = gemma4_assistant_shapes(sizes, len(design.vocab))
    return write_gguf(path, "gemma4-assistant", name, design.vocab, keys, shapes,
                      gemma4_assistant_weights(design, structured=structured, seed=head_seed + 1000 * seed),
                      dtype)


@dataclass(frozen=True)
class Gemma4Files:
    """A Gemma 4 target, its structured assistant and a random one."""

    target: Path
    assistant: Path
    assistant_random: Path


def write_gemma4_set(directory: str | Path, *, size: str = "tiny", seed: int = 0,
                     dtype: WeightDType | None = None, sizes: Gemma4Sizes | None = None) -> Gemma4Files:
    """Write ``gemma4-target.gguf``, ``gemma4-assistant.gguf`` and ``gemma4-assistant-random.gguf`` into
    *directory*. *size* ``tiny``: GEMMA4_SIZES over the fixture vocabulary, F32 by default (well under a
    second each); ``bench``: GEMMA4_BENCH_SIZES (262,144 tokens, random statistics), Q8_0 by default
    (~0.5 GB in all, under a minute), for measuring speed. *sizes*: other shapes (instead of the
    size's); *dtype*: the matrices' (``f32``, ``f16`` or ``q8_0``)."""
    if size not in _SET_SIZES:
        raise ValueError(f"unknown size {size!r}: {' or '.join(_SET_SIZES)}")
    default_sizes, default_dtype = _SET_SIZES[size]
    sizes = sizes or default_sizes
    dtype = dtype or default_dtype
    directory = Path(directory)
    return Gemma4Files(
        target=write_gemma4_target(directory / "gemma4-target.gguf", seed=seed, dtype=dtype, sizes=sizes),
        assistant=write_gemma4_assistant(directory / "gemma4-assistant.gguf", seed=seed, dtype=dtype,
                                         sizes=sizes),
        assistant_random=write_gemma4_assistant(directory / "gemma4-assistant-random.gguf", seed=seed,
                                                structured=False, dtype=dtype, sizes=sizes),
    )


_SET_SIZES: dict[str, tuple[Gemma4Sizes, WeightDType]] = {
    "tiny": (GEMMA4_SIZES, "f32"),
    "bench": (GEMMA4_BENCH_SIZES, "q8_0"),
}
