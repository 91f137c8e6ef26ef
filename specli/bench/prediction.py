"""The verify-cost curve T_v(m) and the speedup it predicts (Leviathan et al. 2023, with the
measured curve in place of a constant cost ratio). specli.bench.measure measures the curve; this
module only computes with it.

This is bench's own prediction; AutoK's cost model (specli.policy) and stats.predicted_speedup are
the others, and they are due to become one (issue #11)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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
        """T_v(m) in ms; linear extrapolation past the measured sizes."""
        by_m = {p.m: p.ms for p in self.points}
        if m in by_m:
            return by_m[m]
        top = max(by_m)
        if m < 1 or len(by_m) < 2:
            return by_m[top] if m > top else by_m[min(by_m)]
        slope = max(0.0, by_m[top] - by_m.get(top - 1, by_m[top]))
        return by_m[top] + slope * (m - top)

    def ratio(self, m: int) -> float:
        return self.ms(m) / self.ms(1)

    def break_even_alpha(self, k: int, c_draft_ms: float) -> float | None:
        """The acceptance alpha at which drafting k tokens per round just matches plain decoding
        (None: no alpha below 1 is enough, because the round costs more than k + 1 plain tokens)."""
        t1, cost = self.ms(1), k * c_draft_ms + self.ms(k + 1)
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


def predicted_speedup(curve: VerifyCurve, alpha: float | None, c_draft_s: float | None,
                      k_per_round: Sequence[int]) -> float | None:
    """Leviathan et al.'s prediction with the measured verify-cost curve:
    sum_rounds E(alpha, k) * T_v(1) / sum_rounds (k c_draft + T_v(k + 1)); a round with k = 0 yields
    one token for T_v(1). None when there are no rounds, or drafts but no acceptance measurement."""
    if not k_per_round:
        return None
    t1 = curve.ms(1) / 1000
    expected = cost = 0.0
    for k in k_per_round:
        if k == 0:
            expected += 1.0
            cost += t1
            continue
        if alpha is None or c_draft_s is None:
            return None
        expected += expected_tokens_per_round(alpha, k)
        cost += k * c_draft_s + curve.ms(k + 1) / 1000
    return expected * t1 / cost if cost > 0 else None
