"""Attention heads built by hand: weights of one layer's q/k/v/output projections that make llama.cpp's
attention do one job (copy a previous token's dims, attend uniformly, match the last two tokens).

Used by :func:`specli_synth.ngram_model.ngram_llama_weights`, whose docstring says which layer does what.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from specli_synth.gguf_writer import LlamaSpec
from specli_synth.model_config import SynthModelConfig
from specli_synth.rope_heads import peak_weights


def copy_head(
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


def induction_head(
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


def previous_token_query_key(spec: LlamaSpec, const_dim: int) -> tuple[np.ndarray, np.ndarray]:
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
    """Per-RoPE-pair score weights making distance 1 beat every other distance by *margin* nats."""
    return peak_weights(head_dim, rope_theta, n_ctx, [1], margin=margin)
