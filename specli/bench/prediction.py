"""The verify-cost curve T_v(m) that bench measures, and the speedup it predicts with costs.py's model
(two acceptance rates, one rule for sizes not measured): the model `-k auto` chooses k with and the
stats panel predicts with. specli.bench.measure measures the curve; this module only computes with it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specli import costs
from specli.costs import verify_curve
from specli.stats import expected_tokens_per_round


@dataclass
class VerifyPoint:
    m: int  # batch size: the pending token + m - 1 drafts
    ms: float  # median wall time of one target decode of m tokens with logits for all of them
    min_ms: float
    max_ms: float
    samples: int


@dataclass
class VerifyCurve:
    points: list[VerifyPoint]
    prefix_tokens: int  # tokens in the cache when measured (positions the batch attends to)
    draft_ms_per_token: float | None  # the draft model's single-token decode (None: no draft model)

    def ms(self, m: int) -> float:
        """T_v(m) in ms: as measured, or by costs.verify_curve's rule for sizes not measured."""
        for p in self.points:
            if p.m == m:
                return p.ms
        return self.seconds(m)[m - 1] * 1000

    def seconds(self, m_max: int) -> list[float]:
        """T_v(1..m_max) in seconds as `-k auto` sees it (costs.verify_curve: non-decreasing in m)."""
        curve = verify_curve({p.m: p.ms / 1000 for p in self.points}, max(m_max, 1))
        if curve is None:  # never: bench always measures m = 1
            raise ValueError("the verify curve has no single-token point")
        return curve

    def ratio(self, m: int) -> float:
        return self.ms(m) / self.ms(1)

    def break_even_alpha(self, k: int, c_draft_ms: float, c_pass_ms: float | None = None) -> float | None:
        """The acceptance alpha at which drafting k tokens per round just matches plain decoding
        (None: no alpha below 1 is enough, because the round costs more than k + 1 plain tokens).
        Drafting costs k c_draft, or one pass c_pass for a block drafter."""
        drafting = k * c_draft_ms if c_pass_ms is None else c_pass_ms
        t1, cost = self.ms(1), drafting + self.ms(k + 1)
        if (k + 1) * t1 <= cost:
            return None
        lo, hi = 0.0, 1.0
        for _ in range(50):
            mid = (lo + hi) / 2
            if expected_tokens_per_round(mid, k) * t1 < cost:
                lo = mid
            else:
                hi = mid
        return hi


def predicted_speedup(curve: VerifyCurve, a1: float | None, a2: float | None, c_draft_s: float | None,
                      k_per_round: Sequence[int]) -> float | None:
    """costs.predicted_speedup over the measured curve: sum_rounds E(k) * T_v(1) / sum_rounds
    (k c_draft + T_v(k + 1)), E(k) = 1 + a1 (1 - a2^k) / (1 - a2); a round with k = 0 yields one token
    for T_v(1). None when there are no rounds, or drafts but no acceptance measurement."""
    verify = curve.seconds(max(k_per_round, default=0) + 1)
    return costs.predicted_speedup(verify, a1, a2, c_draft_s, k_per_round)
