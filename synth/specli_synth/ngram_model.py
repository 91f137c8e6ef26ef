"""Llama models whose logits are n-gram statistics: ``bigram(current) + skip_bigram(previous) + unigram
- repetition_penalty(context)``, optionally switching to copying from the context (an induction head).

:class:`SynthModelConfig` says how big a model is and how the statistics and the noise go into it;
:func:`ngram_llama_weights` builds the weights (embedding/output matrices carry the factors exactly,
through llama.cpp's RMS norms; hand-built heads from :mod:`specli_synth.heads` supply the context terms;
every other block has small random weights: realistic compute, a little noise);
:func:`write_ngram_model` counts, factors and writes one model of a learned vocabulary.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from specli_synth.gguf_writer import LlamaSpec, ProgressCallback, WeightDType, write_llama_gguf
from specli_synth.heads import copy_head, induction_head, previous_token_query_key
from specli_synth.model_config import SynthModelConfig
from specli_synth.ngram_stats import NgramFactors, ngram_factors
from specli_synth.vocab import TrainedVocab


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
    next_scale, skip_scale = factor_scales(factors, d)
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
        q, k = previous_token_query_key(spec, const_dim)
        weights |= copy_head(spec, 0, skip_start, skip_slot, skip_rank, q, k)
    if seen:
        zero_q = np.zeros((spec.n_head * spec.head_dim, d), dtype=np.float32)
        zero_k = np.zeros((spec.n_head_kv * spec.head_dim, d), dtype=np.float32)
        weights |= copy_head(spec, 1, code_start, seen_slot, seen, zero_q, zero_k)
    if width:
        prev_slot, prev2_slot = match_start + width, match_start + 2 * width
        q, k = previous_token_query_key(spec, const_dim)
        weights |= copy_head(spec, 2, match_start, prev_slot, width, q, k, every_group=True)
        weights |= copy_head(spec, 3, prev_slot, prev2_slot, width, q, k, every_group=True)
        weights |= induction_head(
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
            weights[name] = random_matrix(shape, gains[kind] / np.sqrt(fan_in), config.seed, name)
    return weights


def factor_scales(factors: NgramFactors, n_embd: int) -> tuple[float, float]:
    """The scales of the bigram and skip-bigram rows in the embedding (next_row * a, skip_row * b): a
    share of the residual's squared norm each."""
    skip_rank = factors.skip_row.shape[1]
    return (_budget_scale(factors.next_row, (0.55 if skip_rank else 0.75) * n_embd),
            _budget_scale(factors.skip_row, 0.2 * n_embd))


def _budget_scale(rows: np.ndarray, budget: float) -> float:
    """Scale giving the largest row a squared norm of *budget*.

    One scale for all rows (the output matrix divides by it); frequent tokens tend to have the largest
    rows, so shrinking outliers instead would distort exactly the tokens that matter most.
    """
    if rows.shape[1] == 0:
        return 1.0
    return float(np.sqrt(budget) / (np.linalg.norm(rows, axis=1).max() or 1.0))


def random_matrix(shape: tuple[int, ...], std: float, seed: int, name: str) -> Callable[[], np.ndarray]:
    """A lazy random matrix of standard deviation *std*, seeded by *seed* and the tensor's *name* (so
    that changing one tensor leaves every other one as it was)."""

    def make() -> np.ndarray:
        rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
        matrix = rng.standard_normal(shape, dtype=np.float32)
        matrix *= np.float32(std)
        return matrix

    return make


def config_factors(trained: TrainedVocab, config: SynthModelConfig) -> NgramFactors:
    """The statistics *config* describes: counted in its *data_fraction* share of *trained*'s
    documents, factored and truncated to its ranks."""
    documents = document_subset(trained.documents, config.data_fraction, config.seed)
    return counted_factors(documents, trained, config).truncated(config.rank, config.skip_rank)


def counted_factors(
    documents: Sequence[np.ndarray], trained: TrainedVocab, config: SynthModelConfig
) -> NgramFactors:
    """The n-gram statistics of *documents* over *trained*'s vocabulary, factored with *config*'s
    ranks, skip weight, sharpness and seed."""
    return ngram_factors(
        documents,
        len(trained.vocab),
        trained.vocab.bos_id,
        rank=config.rank,
        skip_rank=config.skip_rank,
        skip_weight=config.skip_weight,
        sharpness=config.sharpness,
        seed=config.seed,
    )


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
    factors = config_factors(trained, config) if factors is None else factors.truncated(
        config.rank, config.skip_rank
    )
    spec = config.spec(len(trained.vocab), n_ctx_train)
    weights = ngram_llama_weights(spec, factors, config, bos_id=trained.vocab.bos_id)
    return write_llama_gguf(
        path, spec, trained.vocab, weights, dtype=dtype, chat_template=chat_template, progress=progress
    )


def document_subset(documents: Sequence[np.ndarray], fraction: float, seed: int) -> list[np.ndarray]:
    """A seeded random *fraction* of the documents (all of them at 1.0): what a draft gets to count."""
    if fraction >= 1.0:
        return list(documents)
    keep = np.random.default_rng([seed, 0x5EED]).random(len(documents)) < fraction
    return [doc for doc, k in zip(documents, keep, strict=True) if k]
