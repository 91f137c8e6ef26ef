"""How many tokens to draft each round: a fixed k, or `auto`, which maximizes predicted tokens/second.

auto keeps, per drafter, a decayed estimate of the per-position acceptance alpha and of the draft
cost per token, and a linear model of the target's verify cost T_v(m) = a + b (m - 1) fitted to the
verify times it has measured. Each round it picks

    k* = argmax_k  E(alpha, k) / (k c_d + T_v(k + 1)),   E(alpha, k) = (1 - alpha^(k+1)) / (1 - alpha)

where k = 0 (plain decoding, rate 1 / T_v(1)) is a valid answer. When it settles on k = 0 it still
probes with a short draft now and then, so a text that becomes predictable is noticed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specli.stats import expected_tokens_per_round


class DraftPolicy:
    def choose_k(self, source: str | None, round_index: int) -> int:
        raise NotImplementedError

    def observe(self, source: str | None, k: int, accepted: int, draft_s: float, verify_s: float) -> None:
        """Feedback after a round: k proposed, accepted of those, and what the round cost."""


class FixedK(DraftPolicy):
    """Always k drafts, except round 1, which is plain: it measures T_v(1) for the predicted speedup
    (round 1 rather than 0, so the measurement is not the cold first decode)."""

    def __init__(self, k: int) -> None:
        self.k = k

    def choose_k(self, source: str | None, round_index: int) -> int:
        return 0 if round_index == 1 else self.k


@dataclass
class _SourceEstimate:
    accepted: float = 1.2  # decayed counts; the prior says alpha = 0.6 over ~2 positions
    examined: float = 2.0
    draft_seconds: float = 0.0
    drafted: float = 0.0

    @property
    def alpha(self) -> float:
        return min(self.accepted / self.examined, 0.999)


@dataclass
class AutoK(DraftPolicy):
    k_max: int = 12
    decay: float = 0.9  # per round: the estimate follows changes in the text within ~10 rounds
    probe_every: int = 12  # rounds at k = 0 before the first probe
    sources: dict[str, _SourceEstimate] = field(default_factory=dict)
    # verify cost by batch size m: [decayed count, decayed seconds]
    verify: dict[int, list[float]] = field(default_factory=dict)
    rounds_at_zero: int = 0
    probe_interval: int = 12  # grows while probes keep finding that k = 0 is best

    def _verify_model(self) -> tuple[float, float] | None:
        """(a, b) of T_v(m) = a + b (m - 1), weighted least squares over measured batch sizes."""
        pts = [(m, s / c, c) for m, (c, s) in self.verify.items() if c > 0]
        if not pts:
            return None
        if len(pts) == 1:
            m, t, _ = pts[0]
            # One point: assume the CPU-like prior that each extra token costs a quarter of one.
            a = t / (1 + 0.25 * (m - 1))
            return a, 0.25 * a
        w = sum(c for _, _, c in pts)
        mx = sum(c * (m - 1) for m, _, c in pts) / w
        my = sum(c * t for _, t, c in pts) / w
        sxx = sum(c * (m - 1 - mx) ** 2 for m, _, c in pts)
        sxy = sum(c * (m - 1 - mx) * (t - my) for m, t, c in pts)
        b = max(sxy / sxx, 0.0) if sxx > 0 else 0.0
        a = max(my - b * mx, 1e-9)
        return a, b

    def predicted_rates(self, source: str | None) -> list[float] | None:
        """Predicted tokens/second for k = 0..k_max (None until a verify time has been measured)."""
        model = self._verify_model()
        if model is None:
            return None
        a, b = model
        est = self.sources.get(source or "", _SourceEstimate())
        c_draft = est.draft_seconds / est.drafted if est.drafted else 0.1 * a
        rates = [1.0 / a]
        for k in range(1, self.k_max + 1):
            rates.append(expected_tokens_per_round(est.alpha, k) / (k * c_draft + a + b * k))
        return rates

    def choose_k(self, source: str | None, round_index: int) -> int:
        rates = self.predicted_rates(source) if source is not None else None
        if rates is None:
            k = 0  # the first round measures T_v(1)
        else:
            k = max(range(len(rates)), key=rates.__getitem__)  # ties: the smallest k
            if k == 0:
                self.rounds_at_zero += 1
                if self.rounds_at_zero >= self.probe_interval:
                    # Probe; if speculation still does not pay, wait twice as long before the next.
                    self.rounds_at_zero = 0
                    self.probe_interval = min(2 * self.probe_interval, 256)
                    k = 2
            else:
                self.rounds_at_zero = 0
                self.probe_interval = self.probe_every
        return k

    def observe(self, source: str | None, k: int, accepted: int, draft_s: float, verify_s: float) -> None:
        for slot in self.verify.values():
            slot[0] *= self.decay**0.25  # cost changes slowly (machine load); acceptance quickly
            slot[1] *= self.decay**0.25
        slot = self.verify.setdefault(k + 1, [0.0, 0.0])
        slot[0] += 1.0
        slot[1] += verify_s
        if k == 0 or source is None:
            return
        est = self.sources.setdefault(source, _SourceEstimate())
        est.accepted = self.decay * est.accepted + accepted
        est.examined = self.decay * est.examined + accepted + (1 if accepted < k else 0)
        est.draft_seconds = self.decay * est.draft_seconds + draft_s
        est.drafted = self.decay * est.drafted + k
