"""Token statistics as low-rank factors: bigram and skip-bigram log-ratios by a truncated SVD.

:func:`ngram_factors` turns documents of token ids into :class:`NgramFactors`, the next-token logits
that :mod:`specli_synth.ngram_model` builds into a llama model's embedding and output matrices.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np


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


