"""Logits -> processed distribution, sampling, and the exact accept/reject rule of speculative sampling.

The filters follow llama.cpp's default sampler order (top-k, top-p, min-p on the untempered
distribution, then temperature), so `specli --no-draft` samples what `llama-cli` would. The same
`process_logits` is applied to draft rows and target rows: exactness only needs the target's rows to
be processed exactly as plain decoding would process them, and any proposal distribution q works.

Everything is vectorized numpy: no Python loop over the vocabulary, one softmax per row, and sorting
only the few candidates that can matter.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Candidates examined before falling back to a full sort for top-p; enough for almost every row.
_TOP_P_CANDIDATES = 256


class SamplingError(ValueError):
    """Logits or settings that cannot give a distribution (NaN/inf logits, nothing left to sample)."""


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.8
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1.0: off
    min_p: float = 0.0  # 0.0: off
    banned: tuple[int, ...] = ()  # ids that are never sampled (--ignore-eos bans end-of-generation)

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top-k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top-p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min-p must be in [0, 1], got {self.min_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def _check_finite(logits: np.ndarray) -> None:
    # One reduction instead of isfinite over the row: max/min are NaN or inf exactly when needed.
    lo, hi = float(logits.min()), float(logits.max())
    if not (np.isfinite(lo) or lo == -np.inf) or not np.isfinite(hi):
        raise SamplingError("the model produced NaN or infinite logits; refusing to sample from them")


def _without_banned(logits: np.ndarray, banned: tuple[int, ...]) -> np.ndarray:
    if not banned:
        return logits
    row = logits.copy()
    row[[t for t in banned if t < row.shape[0]]] = -np.inf
    return row


def greedy_token(logits: np.ndarray, banned: tuple[int, ...] = ()) -> int:
    """argmax of one row (ties go to the lowest id, as llama.cpp's greedy sampler)."""
    logits = _without_banned(logits, banned)
    _check_finite(logits)
    return int(np.argmax(logits))


def _top_candidates(logits: np.ndarray, width: int) -> np.ndarray:
    """The `width` largest logits' ids, best first; ties broken towards the lowest id (deterministic,
    and the greedy token always among them)."""
    n = logits.shape[0]
    if width >= n:
        cand = np.arange(n)
    else:
        threshold = logits[np.argpartition(logits, n - width)[n - width]]
        above = np.flatnonzero(logits > threshold)
        ties = np.flatnonzero(logits == threshold)[: width - above.shape[0]]
        cand = np.concatenate([above, ties])
    return cand[np.lexsort((cand, -logits[cand]))]


def _kept_candidates(logits: np.ndarray, params: SamplingParams) -> np.ndarray | None:
    """Token ids surviving top-k/top-p/min-p, or None when no filter is active (keep all)."""
    n = logits.shape[0]
    top_k = params.top_k if 0 < params.top_k < n else 0
    top_p = params.top_p if params.top_p < 1.0 else 0.0
    min_p = params.min_p
    if not (top_k or top_p or min_p):
        return None
    m = float(logits.max())
    if min_p and not (top_k or top_p):
        # min-p alone: keep p >= min_p * p_max  <=>  logit >= max + log(min_p). No sort needed.
        return np.flatnonzero(logits >= m + np.log(min_p))

    # Sort only a candidate set that must contain everything the filters can keep.
    width = top_k if top_k else min(_TOP_P_CANDIDATES, n)
    while True:
        cand = _top_candidates(logits, width)
        if not top_p or top_k or width == n:
            break
        # The candidates hold enough mass for top-p unless their cumulative share is below top_p.
        z = np.exp(logits[cand] - m)
        total = float(np.sum(np.exp(logits - m)))
        if z.sum() / total >= top_p:
            break
        width = min(n, width * 8)
    keep = cand
    if top_p:
        # Softmax over the full row (the untempered distribution), restricted to the candidates.
        # float64: the cut must not move with rounding when the mass sits right at top_p.
        z = np.exp(logits[keep].astype(np.float64) - m)
        total = float(z.sum()) if top_k else float(np.sum(np.exp(logits.astype(np.float64) - m)))
        cum = np.cumsum(z) / total
        # Keep the smallest prefix whose mass reaches top_p (at least one token), as llama.cpp does.
        cut = int(np.searchsorted(cum, top_p, side="left")) + 1
        keep = keep[: max(1, min(cut, keep.shape[0]))]
    if min_p:
        keep = keep[logits[keep] >= m + np.log(min_p)]
    return keep


def process_logits(logits: np.ndarray, params: SamplingParams, *, out_width: int | None = None) -> np.ndarray:
    """One logits row -> the processed probability row (float32, sums to 1) sampling draws from.

    `out_width` pads the row with zeros (a draft whose vocabulary is shorter than the target's) or
    cuts it (ids the target does not have are never proposed).
    """
    if params.greedy:
        raise ValueError("greedy decoding uses greedy_token, not a distribution")
    row = logits if out_width is None or out_width >= logits.shape[0] else logits[:out_width]
    row = _without_banned(row, params.banned)
    _check_finite(row)
    width = out_width or row.shape[0]
    inv_t = np.float32(1.0 / params.temperature)
    keep = _kept_candidates(row, params)
    probs = np.zeros(width, dtype=np.float32)
    if keep is None:
        z = row * inv_t
        z -= z.max()
        np.exp(z, out=z)
        probs[: row.shape[0]] = z / z.sum()
    else:
        z = row[keep] * inv_t
        z -= z.max()
        np.exp(z, out=z)
        probs[keep] = z / z.sum()
    return probs


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one token from a probability row (inverse CDF: one cumsum + one binary search)."""
    cdf = np.cumsum(probs, dtype=np.float64)
    total = cdf[-1]
    if not total > 0:
        raise SamplingError("nothing left to sample: the distribution has no mass")
    idx = int(np.searchsorted(cdf, rng.random() * total, side="right"))
    idx = min(idx, probs.shape[0] - 1)
    # Guard against landing on a zero-mass id through float rounding at the very end of the CDF.
    while probs[idx] == 0 and idx > 0:
        idx -= 1
    return idx


def accept_prefix(p_draft: np.ndarray, q_draft: np.ndarray, u: np.ndarray) -> int:
    """How many draft tokens the target accepts: the first i with u_i >= p_i(d_i) / q_i(d_i) (or k).

    p_draft, q_draft: target and draft probabilities of the drafted tokens; u: uniforms in [0, 1).
    Written as u*q < p so that q = 0 (impossible for a sampled token, but cheap to survive) rejects.
    """
    accepted = u * q_draft < p_draft
    return int(accepted.argmin()) if not accepted.all() else int(accepted.shape[0])


def residual_distribution(p: np.ndarray, q: np.ndarray | None, rejected_token: int) -> np.ndarray:
    """norm(max(p - q, 0)): what to sample after a rejection so the output still follows p.

    q=None is a point-mass proposal (n-gram lookup): the residual is p with the rejected token removed.
    """
    if q is None:
        r = p.copy()
        r[rejected_token] = 0.0
    else:
        r = np.maximum(p - q, 0.0)
    total = float(r.sum())
    if not total > 0:
        # Only reachable through float rounding when p == q; then p itself is the right answer.
        return p
    return r / np.float32(total)


def acceptance_probability(
    target_logits: np.ndarray, token: int, q: np.ndarray | None, params: SamplingParams
) -> float:
    """How likely the exact rule accepts a proposal at a position whose target logits are given:
    greedy, 1 if `token` is the argmax; sampling, sum_x min(p(x), q(x)) for a proposal drawn from q
    (its expectation over the draw, a steadier estimate than one outcome), p(token) for a point mass
    (q None)."""
    if params.greedy:
        return float(token == greedy_token(target_logits, params.banned))
    p = process_logits(target_logits, params)
    if q is None:
        return float(p[token])
    return float(np.minimum(p, q[: p.shape[0]]).sum())
