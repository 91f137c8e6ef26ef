"""The round's decision: which drafted tokens the target accepts, and the token it adds.

Given the target's k + 1 rows of logits for [pending, d1..dk], `verify` accepts a prefix d1..dn by an
exact rule and appends one token drawn by the target (a correction after a rejection, a bonus after
full acceptance). The output follows the target's distribution whatever was drafted (Leviathan et
al. 2023, Chen et al. 2023); with a seed and `same_as_plain` it is plain decoding's very tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specli.drafters.base import Draft
from specli.llama import FilteredRows
from specli.sampling import (
    ACCEPT,
    RESIDUAL,
    Dist,
    Sampler,
    Survivors,
    checked_token,
    distribution,
    greedy_token,
    masked_for,
    plain_token,
    proposal_acceptance,
)


@dataclass
class Verdict:
    """What the target made of a round: the tokens to commit (accepted drafts, then its own token),
    how many drafts it accepted, and its processed rows as far as it needed them (None when greedy, and
    under same-as-plain but for the last row when a position was held there), so nothing processes a
    row twice."""

    tokens: list[int]
    n_accepted: int
    dists: list[Dist | None]


def verify(target_rows: np.ndarray | FilteredRows, draft: Draft, sampler: Sampler, position: int) -> Verdict:
    """One round's decision from the target's k + 1 logits rows; row i predicts sequence `position + i`.
    FilteredRows: rows llama.cpp's graph filtered with the sampler's settings (backend sampling), whose
    survivors are tempered and drawn from exactly as the host's own filters' would be.

    Greedy, and sampling with `same_as_plain`: the target draws its own token at each position (argmax,
    or the Gumbel-max draw with the position's noise, which plain decoding draws too) and accepts
    drafts while they equal it, so the output is plain decoding's whatever was drafted.
    Otherwise the rejection rule: accept d_i while u_i < p_i(d_i) / q_i(d_i); at the first rejection
    draw from norm(max(p - q, 0)); after k acceptances draw a bonus token from p_(k+1).
    """
    d = draft.tokens
    k = len(d)
    params, noise = sampler.params, sampler.noise
    if not k and type(target_rows) is np.ndarray:
        if params.greedy:  # a plain greedy round: its argmax
            return Verdict([greedy_token(target_rows[0], params.banned)], 0, [None])
        if draft.held is None:  # a plain sampled round whose row nothing else reads: its draw alone
            return Verdict([plain_token(target_rows, params, noise, position)], 0, [None])
    if isinstance(target_rows, FilteredRows):
        filtered, width = target_rows, target_rows.width
        params = params.unbanned  # the graph left banned ids out

        def row_dist(i: int) -> Dist:
            return distribution(Survivors(*filtered.survivors(i)), params, width=width)

        def row_best(i: int) -> int:
            return checked_token(*filtered.token(i))

        def row_draw(i: int) -> int:
            return row_dist(i).draw(noise, position + i)
    else:
        rows = target_rows
        params = masked_for(rows, params)

        def row_dist(i: int) -> Dist:
            return distribution(rows[i], params)

        def row_best(i: int) -> int:
            return greedy_token(rows[i], params.banned)

        def row_draw(i: int) -> int:
            return plain_token(rows[i : i + 1], params, noise, position + i)

    dists: list[Dist | None] = []
    if params.greedy or sampler.same_as_plain:
        # Only the last row's distribution is read again (a held position scored against it): the
        # others draw their token alone, in one call where the host filters them.
        kept = k if draft.held is not None else k + 1
        for i in range(k + 1):
            if params.greedy:
                own, p = row_best(i), None
            elif i < kept:
                own, p = row_draw(i), None
            else:
                p = row_dist(i)
                own = p.draw(noise, position + i)
            dists.append(p)
            if i == k or own != d[i]:
                return Verdict([*d[:i], own], i, dists)
    qs = draft.probs
    for i in range(k):
        p = row_dist(i)
        dists.append(p)
        q = qs[i] if qs is not None else None
        q_d = q.prob(d[i]) if q is not None else 1.0
        if not noise.uniform(position + i, ACCEPT) * q_d < p.prob(d[i]):
            return Verdict([*d[:i], p.residual(q, d[i]).draw(noise, position + i, RESIDUAL)], i, dists)
    p = row_dist(k)
    dists.append(p)
    return Verdict([*d, p.draw(noise, position + k)], k, dists)


def acceptance_of(verdict: Verdict, i: int, token: int, q: Dist | None, same_as_plain: bool) -> float:
    """How likely the target would have accepted `token` as a draft at row i, a row it reached with
    every draft before it accepted (so verdict.tokens[i] is its own draw there). Greedy, or
    same-as-plain with a draft model (whose `token` is the draft's own keyed draw): whether the two
    draws agree, the rule itself. Otherwise the expectation over the draw: sum min(p, q), or p(token)
    for a point mass (as it is under same-as-plain too)."""
    p = verdict.dists[i]
    if p is None or (same_as_plain and q is not None):
        return float(token == verdict.tokens[i])
    return proposal_acceptance(p, token, q)
