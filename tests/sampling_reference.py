"""Dense reference versions of the sampler's pieces, for the tests only: a processed row as a full
probability vector, inverse-CDF sampling, the acceptance prefix and the residual on dense rows, the
acceptance probability of a proposal given as a dense row, and one verify step on dense draft rows.
The runtime works on sparse `Dist`s (specli.sampling, specli.verify); these spell the same rules out
plainly, so the tests can hold the two against each other and against exact laws."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from specli.drafters.base import Draft
from specli.sampling import (
    Dist,
    Noise,
    Sampler,
    SamplingError,
    SamplingParams,
    distribution,
    greedy_token,
    proposal_acceptance,
)
from specli.verify import verify


def process_logits(logits: np.ndarray, params: SamplingParams, *, out_width: int | None = None) -> np.ndarray:
    """One logits row -> the processed probability row (float32, sums to 1) over `out_width` ids."""
    return distribution(logits, params, width=out_width).dense()


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
    """norm(max(p - q, 0)) on dense rows (see Dist.residual)."""
    if q is None:
        r = p.copy()
        r[rejected_token] = 0.0
    else:
        r = np.maximum(p - q, 0.0)
    total = float(r.sum())
    if not total > 0:
        return p
    return r / np.float32(total)


def acceptance_probability(
    target_logits: np.ndarray, token: int, q: np.ndarray | Dist | None, params: SamplingParams
) -> float:
    """How likely the exact rule accepts a proposal at a position whose target logits are given:
    greedy, 1 if `token` is the argmax; sampling, sum_x min(p(x), q(x)) for a proposal drawn from q
    (its expectation over the draw, a steadier estimate than one outcome), p(token) for a point mass
    (q None)."""
    if params.greedy:
        return float(token == greedy_token(target_logits, params.banned))
    p = distribution(target_logits, params)
    if isinstance(q, np.ndarray):
        q = Dist.from_probs(None, q[: p.width].astype(np.float64), p.width)
    return proposal_acceptance(p, token, q)


def speculative_step(
    target_rows: np.ndarray,
    draft: Draft,
    sampling: SamplingParams,
    rng: np.random.Generator | Noise,
    position: int = 0,
    *,
    same_as_plain: bool = False,
) -> tuple[list[int], int]:
    """verify() as (tokens to commit, n accepted); a numpy Generator stands for fresh noise, and a
    draft's probs may be dense rows (k, vocab)."""
    noise = rng if isinstance(rng, Noise) else Noise(int(rng.integers(2**62)))
    if isinstance(draft.probs, np.ndarray):
        width = draft.probs.shape[1]
        rows = [Dist.from_probs(None, row.astype(np.float64), width) for row in draft.probs]
        draft = replace(draft, probs=rows)
    verdict = verify(target_rows, draft, Sampler(sampling, noise, same_as_plain), position)
    return verdict.tokens, verdict.n_accepted
