"""Attention heads that look a fixed distance back, for any RoPE layout and with per-head q/k norms.

:func:`specli_synth.heads.previous_token_query_key` builds the previous-token head of the llama
fixtures (normal RoPE, no q/k norms). The trained drafters of :mod:`specli_synth.trained_drafters`
need the same idea at other distances (0: the position itself; j: the anchor of a block j positions
back), in NeoX's RoPE layout (Qwen3, DFlash) and behind llama.cpp's per-head RMS norms of q and k:
:func:`peaked_query_key` gives the query and key rows, :func:`qk_norm_weight` the norm weight that
leaves them as designed, :func:`to_neox` moves rows from the normal layout to NeoX's.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def peak_weights(head_dim: int, rope_theta: float, n_ctx: int, peaks: Sequence[int], *, before: int = 0,
                 margin: float = 8.0) -> np.ndarray:
    """Per-RoPE-pair score weights w_p such that, for each peak j of *peaks*, the score at distance t,
    sum_p w_p cos((t - j) theta_p), beats every other distance in [-before, n_ctx) by *margin* nats
    (t > 0: a key t positions before the query; t < 0, for non-causal attention: after it). One set of
    weights for all peaks, so that every head of a layer has the same norm (qk_norm_weight). Fast pairs
    separate neighbours; the weights are scaled by the worst competitor."""
    theta = rope_theta ** (-2.0 * np.arange(head_dim // 2) / head_dim)
    distances = np.arange(-before, n_ctx, dtype=np.float64)[:, None]
    best: tuple[float, np.ndarray] | None = None
    for min_theta in (0.02, 0.05, 0.1, 0.3):
        for power in (0.0, 0.5, 1.0):
            w = np.where(theta >= min_theta, theta**power, 0.0)
            if not w.any():
                continue
            w /= w.sum()
            gaps = []
            for j in peaks:
                score = (w * np.cos((distances - j) * theta)).sum(axis=1)
                gaps.append(score[j + before] - np.delete(score, j + before).max())
            gap = min(gaps)
            if best is None or gap > best[0]:
                best = (gap, w)
    assert best is not None
    return (best[1] * margin / best[0]).astype(np.float32)


def peaked_query_key(head_dim: int, weights: np.ndarray, peak: int, rope_theta: float,
                     ) -> tuple[np.ndarray, np.ndarray]:
    """One head's query and key (each a head_dim vector, normal RoPE layout: pair p = dims 2p, 2p+1)
    for a constant input of 1: q's pair p = (A_p, 0), k's = A_p (cos(peak theta_p), sin(peak theta_p)),
    so that q_m . k_n / sqrt(head_dim) = sum_p w_p cos((m - n - peak) theta_p) with A_p^2 = w_p
    sqrt(head_dim). Both have the same norm (qk_norm_weight)."""
    theta = rope_theta ** (-2.0 * np.arange(head_dim // 2) / head_dim)
    amplitude = np.sqrt(weights * np.sqrt(head_dim)).astype(np.float32)
    q = np.zeros(head_dim, np.float32)
    k = np.zeros(head_dim, np.float32)
    q[0::2] = amplitude
    k[0::2] = amplitude * np.cos(peak * theta)
    k[1::2] = amplitude * np.sin(peak * theta)
    return q, k


def qk_norm_weight(q: np.ndarray) -> np.ndarray:
    """The attn_q_norm / attn_k_norm weight (one value per head dim) that gives back a designed q or
    k after llama.cpp's per-head RMS norm: its rms, for every dim."""
    return np.full(len(q), np.sqrt(np.mean(np.square(q))), np.float32)


def to_neox(rows: np.ndarray, head_dim: int) -> np.ndarray:
    """Rows of a q or k projection (n_heads * head_dim, n_in) in the normal RoPE layout (pair p = dims
    2p, 2p+1), reordered per head for NeoX's (pair p = dims p, p + head_dim / 2)."""
    n = rows.shape[0] // head_dim
    order = np.concatenate([np.arange(0, head_dim, 2), np.arange(1, head_dim, 2)])
    index = (np.arange(n)[:, None] * head_dim + order[None, :]).reshape(-1)
    return rows[index]
