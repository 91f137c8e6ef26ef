"""How many tokens to draft each round: a fixed k, or `auto`, which maximizes predicted tokens/second.

auto keeps, per proposal source, decayed estimates of the acceptance of a round's first draft token
(a1) and of each later one given the one before was accepted (a2), and uses the `CostModel` of what a
round costs (specli/costs.py, the model the stats panel and bench predict with too). Each round it
picks

    k* = argmax_k  E(k) / (k c_d + T_v(k + 1)),   E(k) = 1 + a1 (1 - a2^k) / (1 - a2)

where k = 0 (plain decoding, rate 1 / T_v(1)) is a valid answer. When it settles on k = 0 it still
probes now and then (with the k that would pay best if any did), so a text that becomes
predictable is noticed.

Batch sizes not measured yet are predicted optimistically (costs.verify_curve), so auto tries them
once and learns their real cost.

The cost model belongs to the engine and outlives a generation (it describes the machine and the
models), as does `Learned` (the pair). Acceptance describes the text, so each generation learns it
afresh, starting from the last generation's estimate halfway back to a neutral 0.5 (weighted as two
positions).

A drafter that knows its confidence (a draft model: its top probability at each position) gets
more than a k: a gate, asked before each position, that stops the round where drafting on no longer
pays. The acceptance that goes with a confidence is learned per source (`Calibration`, from every
verified position and from the positions the gate held back, scored against the target's row when
it reaches them). Drafting on from position i pays if, for some length j > i,

    S f (1 - f^(j-i)) / (1 - f)  >  r [T_v(j+1) - T_v(i+1) + (j-i-1) c_d]

S: the chance that positions 0..i-1 all pass; f: the calibrated acceptance at position i, which
the positions after it are assumed to share (confidence comes in runs; each is judged on its own
when it is drafted); r: the reference rate (the better of plain decoding and the recent rounds),
which prices time in tokens (a Dinkelbach step towards the best long-run rate). Whether to look at
position 0 at all (a draft step) is decided by the same value, averaged over the recent
first-position confidences or taken at the last one, whichever is higher. If even the draft's
surest band could not pay, auto stops shadows for the generation: each would have to catch the
draft up on every plain token. A fixed k drafts every position whatever the draft's doubts; a fixed
--draft-p-min (llama.cpp's) stops on doubt at a threshold the user must tune; the gate's threshold
follows from the measured costs and calibration, so it drafts 12 where the draft is sure (a copy)
and none where it is guessing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

import numpy as np

from specli.costs import CostModel, later_examined
from specli.drafters.base import DraftGate


class DraftPolicy:
    """Decides each round's draft length (and, for a drafter that reports confidence, a gate) from
    what the rounds before cost and yielded. The Proposer asks it and reports back to it."""

    def choose_k(self, source: str | None) -> int:
        raise NotImplementedError

    def observe(
        self,
        source: str | None,
        k: int,
        accepted: int,
        draft_s: float,
        verify_s: float,
        confidence: Sequence[float] = (),
        positions: int | None = None,
    ) -> None:
        """Feedback after a round: k proposed, accepted of those, and what the round cost.

        confidence: the drafter's top probability at each proposed position (if it has one);
        positions: how many positions it drafted (k, plus one where a gate stopped it)."""

    def gate(self, source: str, k: int, shadow: bool = False) -> DraftGate | None:
        """This round's gate over k positions, for a drafter that knows its confidence (None: draft
        all k). shadow: only look at the first position's confidence, propose nothing."""
        return None

    def wants_shadow(self, source: str) -> bool:
        """Whether this plain round should also ask `source` for an unverified proposal."""
        return False

    def observe_shadow(self, source: str, acceptance: float, draft_s: float) -> None:
        """A shadow proposal's acceptance probability, and what drafting it cost."""

    def observe_held(self, source: str, position: int, confidence: float, acceptance: float) -> None:
        """A position a gate stopped at, scored against the target's row: how likely it was to pass."""


class FixedK(DraftPolicy):
    """Always k drafts (fewer only where the output or the context ends)."""

    def __init__(self, k: int) -> None:
        self.k = k

    def choose_k(self, source: str | None) -> int:
        return self.k


# Confidence bins: finer near 1, where a draft that knows the text puts most of its tokens.
_CONFIDENCE_EDGES = np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98])
_CONFIDENCE_MIDS = np.convolve(np.concatenate(([0.0], _CONFIDENCE_EDGES, [1.0])), [0.5, 0.5], "valid")


@dataclass
class Calibration:
    """How often a drafter's token is accepted as a function of its top probability (confidence),
    and how its confidence at a round's first position is distributed.

    The acceptance per bin starts at the bin's own confidence (a calibrated draft), weighted as one
    observation; it describes the pair of models and changes slowly. The first-position histogram
    describes the text and follows it within ~10 rounds.
    """

    accepted: np.ndarray = field(default_factory=lambda: _CONFIDENCE_MIDS.copy())
    seen: np.ndarray = field(default_factory=lambda: np.ones(len(_CONFIDENCE_MIDS)))
    first: np.ndarray = field(default_factory=lambda: np.zeros(len(_CONFIDENCE_MIDS)))
    last_first: float = 0.0

    @staticmethod
    def bin(confidence: float) -> int:
        return int(np.searchsorted(_CONFIDENCE_EDGES, confidence, side="right"))

    def acceptance(self, confidence: float) -> float:
        b = self.bin(confidence)
        return float(self.accepted[b] / self.seen[b])

    def observe(self, confidence: float, acceptance: float, decay: float = 0.98) -> None:
        b = self.bin(confidence)
        self.accepted[b] = decay * self.accepted[b] + acceptance
        self.seen[b] = decay * self.seen[b] + 1.0

    def observe_first(self, confidence: float, decay: float = 0.9) -> None:
        self.first *= decay
        self.first[self.bin(confidence)] += 1.0
        self.last_first = confidence


@dataclass
class Learned:
    """What auto learned about this pair of models that the next generation starts from: each source's
    last (a1, a2) estimate, acceptance by confidence for the sources that report one, and the sources
    found hopeless (drafting would not pay even at their surest) with the generations since. (What
    the machine's decodes cost is the CostModel's.)"""

    acceptance: dict[str, tuple[float, float]] = field(default_factory=dict)
    calibration: dict[str, Calibration] = field(default_factory=dict)
    hopeless: dict[str, int] = field(default_factory=dict)


# A draft step cheaper than this share of a target token costs nothing worth weighing.
_FREE_LOOK = 0.01
# A source found hopeless stays plain without a look in later generations, but for one in this many,
# which looks again (one shadow re-measures the draft step; the machine's load may have changed).
_RECHECK_EVERY = 16

_RATE_TOKENS = 8.0  # decayed tokens of recent rounds before their rate is the reference

_PRIOR_ALPHA = 0.5  # for a source never seen: neither hopeless nor a sure thing
_PRIOR_WEIGHT = 2.0  # positions the prior counts for: the first rounds' evidence soon outweighs it


@dataclass
class _SourceEstimate:
    """Decayed counts of accepted / examined draft tokens: first of their round, and later ones."""

    first: list[float] = field(default_factory=lambda: [_PRIOR_ALPHA * _PRIOR_WEIGHT, _PRIOR_WEIGHT])
    later: list[float] = field(default_factory=lambda: [_PRIOR_ALPHA * _PRIOR_WEIGHT, _PRIOR_WEIGHT])

    @property
    def a1(self) -> float:
        return min(self.first[0] / self.first[1], 0.999)

    @property
    def a2(self) -> float:
        return min(self.later[0] / self.later[1], 0.999)

    @property
    def alpha(self) -> float:
        """Per-position acceptance over both kinds (what the stats call alpha)."""
        return min((self.first[0] + self.later[0]) / (self.first[1] + self.later[1]), 0.999)

    def observe(self, decay: float, first: tuple[float, float], later: tuple[float, float]) -> None:
        for slot, (accepted, examined) in ((self.first, first), (self.later, later)):
            slot[0] = decay * slot[0] + accepted
            slot[1] = decay * slot[1] + examined


@dataclass
class AutoK(DraftPolicy):
    costs: CostModel = field(default_factory=CostModel)
    learned: Learned = field(default_factory=Learned)
    # Sources that report their confidence (a draft model): they get a gate, and a calibration.
    confident: Collection[str] = ()
    k_max: int = 12
    decay: float = 0.9  # per round: the estimate follows changes in the text within ~10 rounds
    probe_every: int = 4  # rounds at k = 0 before the first probe
    sources: dict[str, _SourceEstimate] = field(default_factory=dict)
    rounds_at_zero: int = 0
    probe_interval: int = 4  # doubles (to 256) after each probe that a draft token failed
    probing: bool = False
    rate: list[float] = field(default_factory=lambda: [0.0, 0.0])  # decayed tokens, seconds of rounds
    hopeless: set[str] = field(default_factory=set)  # sources that would not pay even at their surest
    _silent: set[str] = field(default_factory=set, repr=False)  # hopeless since an earlier generation
    _worth_cache: tuple[str, int, np.ndarray] | None = field(default=None, repr=False)

    def _observe_acceptance(
        self, source: str, decay: float, first: tuple[float, float], later: tuple[float, float]
    ) -> None:
        """Update the source's (a1, a2) counts, and keep the estimate as the next generation's prior."""
        est = self._estimate(source)
        est.observe(decay, first, later)
        self.learned.acceptance[source] = (est.a1, est.a2)

    def _estimate(self, source: str) -> _SourceEstimate:
        if source not in self.sources:
            # The last generation's estimate, halfway back to the neutral prior: the next text may
            # be of another kind (a copy, then a chat), and overshooting k there is costly.
            last = self.learned.acceptance.get(source, (_PRIOR_ALPHA, _PRIOR_ALPHA))
            a1, a2 = ((a + _PRIOR_ALPHA) / 2 for a in last)
            self.sources[source] = _SourceEstimate(
                [a1 * _PRIOR_WEIGHT, _PRIOR_WEIGHT], [a2 * _PRIOR_WEIGHT, _PRIOR_WEIGHT]
            )
        return self.sources[source]

    def predicted_rates(self, source: str | None) -> list[float] | None:
        """Predicted tokens/second for k = 0..k_max (None until T_v(1) has been measured)."""
        verify = self.costs.verify_seconds(self.k_max + 1)
        if verify is None:
            return None
        est = self._estimate(source or "")
        c_draft = self.costs.draft_seconds_per_token(source)
        if c_draft is None:
            c_draft = 0.1 * verify[0]  # a draft model ~10x cheaper than the target, until measured
        # E(k) = 1 + a1 (1 - a2^k) / (1 - a2), accumulated term by term: this runs every round.
        a1, a2 = est.a1, est.a2
        rates, expected, run = [], 1.0, a1
        for k in range(self.k_max + 1):
            rates.append(expected / (k * c_draft + verify[k]))
            expected += run
            run *= a2
        return rates

    def __post_init__(self) -> None:
        for source in self.confident:
            self.learned.calibration.setdefault(source, Calibration())
        for source, since in self.learned.hopeless.items():
            self.learned.hopeless[source] = since + 1
            if (since + 1) % _RECHECK_EVERY:
                # Not even a shadow: on a draft as dear as the target, one costs a target token.
                self.hopeless.add(source)
                self._silent.add(source)

    def choose_k(self, source: str | None) -> int:
        if source is not None and source in self.confident:
            return self._choose_gated(source)
        rates = self.predicted_rates(source) if source is not None else None
        if rates is None:
            return 0  # the first round measures T_v(1)
        k = max(range(len(rates)), key=rates.__getitem__)  # ties: the smallest k
        self.probing = False
        if k > 0:
            self.rounds_at_zero = 0
            self.probe_interval = self.probe_every
            return k
        self.rounds_at_zero += 1
        if self.rounds_at_zero < self.probe_interval:
            return 0
        # Probe with the k that would pay best if any did: on a CPU staircase a longer probe costs
        # little more than a short one and tells more. At least 2: a one-token probe says nothing
        # about a2, so a low a2 would keep choosing one-token probes and never be corrected.
        self.rounds_at_zero = 0
        self.probing = True
        return max(range(min(2, self.k_max), len(rates)), key=rates.__getitem__)

    # -- drafters that report their confidence: a gate decides each position ----------------------

    def _gate_inputs(self, source: str) -> tuple[np.ndarray, float, float] | None:
        """(T_v(1..k_max+1), draft seconds per position, reference rate), once measured."""
        verify = self.costs.verify_seconds(self.k_max + 1)
        c_draft = self.costs.draft_seconds_per_token(source)
        if verify is None or c_draft is None:
            return None
        tokens, seconds = self.rate
        # The recent rounds' rate once they are a few tokens' worth: a rate from one or two rounds
        # is noise, and a high one makes every draft step look dear for the whole generation.
        rate = max(1.0 / verify[0], tokens / seconds if tokens >= _RATE_TOKENS else 0.0)
        return np.asarray(verify), c_draft, rate

    def _worth(self, source: str, inputs: tuple[np.ndarray, float, float]) -> np.ndarray:
        """Per confidence bin, the tokens (beyond their cost at the reference rate) a round gains
        whose first position has that confidence, the best length j chosen; 0 if none gains.
        Recomputed every 8 rounds: it moves with the calibration and costs, which change slowly,
        and on a model at half a millisecond per token this runs every round."""
        if self._worth_cache is not None and self._worth_cache[0] == source and self._worth_cache[1] < 8:
            self._worth_cache = (source, self._worth_cache[1] + 1, self._worth_cache[2])
            return self._worth_cache[2]
        verify, c_draft, rate = inputs
        cal = self.learned.calibration[source]
        j = np.arange(1, self.k_max + 1)
        f = np.minimum(cal.accepted / cal.seen, 0.999)[:, None]
        accepted = f * (1.0 - f**j) / (1.0 - f)  # E[accepted] of j drafts as sure as the first
        cost = rate * (verify[j] - verify[0] + (j - 1) * c_draft)  # in tokens forgone at `rate`
        worth = np.maximum(0.0, (accepted - cost).max(axis=1))
        self._worth_cache = (source, 0, worth)
        return worth

    def _choose_gated(self, source: str) -> int:
        """k_max if looking at the first position (one draft step) is worth its cost, given how the
        draft's confidence there has been distributed lately (or was the last time) and what each
        confidence is worth; else 0. The gate then stops the round where drafting on stops paying."""
        self.probing = False
        if source in self.hopeless or self.costs.verify_seconds(1) is None:
            # Hopeless: nothing new is learned without drafts or shadows, so it stays so. No T_v(1)
            # yet: a plain round measures it (and a shadow sees the draft's first confidence).
            self.rounds_at_zero += 1
            return 0
        inputs = self._gate_inputs(source)
        if inputs is None:
            # What a draft step costs is not known yet: shadows measure it (a draft step and no
            # verify batch) before any round pays for drafts that may not be worth their cost.
            self.rounds_at_zero += 1
            return 0
        cal = self.learned.calibration[source]
        if inputs[1] < _FREE_LOOK * inputs[0][0]:
            # Looking costs next to nothing (n-gram lookup): let the gate judge every round.
            self.learned.hopeless.pop(source, None)
            self.rounds_at_zero = 0
            return self.k_max
        if cal.first.sum() >= 1.0:
            worth = self._worth(source, inputs)
            price = inputs[2] * inputs[1]  # a draft step, in tokens at the reference rate
            # Confidence comes in runs (a copy goes on), so the last first position seen predicts the
            # next: a sure shadow brings drafting back at once, whatever the rounds before say.
            expected = max(float(cal.first @ worth) / cal.first.sum(), worth[cal.bin(cal.last_first)])
            if expected <= price:
                # If even the draft's surest band does not pay, shadows are no use either: each one
                # has to catch the draft up on every plain token since the last, which on a draft
                # as dear as the target costs as much as the speculation it would bring back.
                if float(worth.max()) <= price:
                    self.hopeless.add(source)
                    self.learned.hopeless[source] = 0
                else:
                    self.learned.hopeless.pop(source, None)
                self.rounds_at_zero += 1
                return 0
        self.learned.hopeless.pop(source, None)
        self.rounds_at_zero = 0
        return self.k_max

    def gate(self, source: str, k: int, shadow: bool = False) -> DraftGate:
        return _Gate(self, source, k, shadow)

    def _gate_decider(self, source: str, k: int, shadow: bool) -> Callable[[int, float], bool]:
        """Draft position i (of k) iff some draft length j > i then pays, a Dinkelbach step at the
        reference rate r (the better of plain decoding and the recent rounds):

            max_j  S f (1 - f^(j-i)) / (1 - f)  -  r [T_v(j+1) - T_v(i+1) + (j-i-1) c_d]  >  0

        where S is the probability that positions 0..i-1 all pass and f the acceptance that the
        calibration gives position i's confidence. Later positions are assumed as sure as this one
        (confidence comes in runs); each is judged on its own confidence when it is drafted."""
        inputs = self._gate_inputs(source)
        survival = 1.0

        def decide(i: int, confidence: float) -> bool:
            nonlocal survival
            cal = self.learned.calibration[source]
            if i == 0:
                cal.observe_first(confidence)
            if shadow or inputs is None:
                return not shadow and i < 2  # costs unknown: a short draft measures them
            verify, c_draft, rate = inputs
            f = min(cal.acceptance(confidence), 0.999)
            passing = survival * f
            n = np.arange(1, k - i + 1)  # j - i for j = i + 1 .. k
            gain = passing * (1.0 - f**n) / (1.0 - f)
            cost = rate * (verify[i + n] - verify[i] + (n - 1) * c_draft)
            if float((gain - cost).max()) <= 0.0:
                return False
            survival = passing
            return True

        return decide

    def wants_shadow(self, source: str) -> bool:
        # Shadow every plain round when drafting is cheap (n-gram lookup), less often when not, so
        # that shadows cost at most ~3 % of plain decoding. When drafting could not pay even if every
        # draft were accepted: one in the generation that finds it so (it re-measures the draft's
        # cost), then one in every _RECHECK_EVERY generations.
        if source in self.hopeless:
            return self.rounds_at_zero == 1 and source not in self._silent
        c_draft = self.costs.draft_seconds_per_token(source)
        verify = self.costs.verify_seconds(1)
        if c_draft is None or verify is None:
            return True
        # At least every 64th round: the draft cost itself is learned from these.
        return self.rounds_at_zero % min(64, max(1, math.ceil(c_draft / verify[0] / 0.03))) == 0

    def observe_shadow(self, source: str, acceptance: float, draft_s: float) -> None:
        self.costs.observe_draft(source, 1, draft_s)
        self._observe_acceptance(source, self.decay, (acceptance, 1.0), (0.0, 0.0))

    def observe_held(self, source: str, position: int, confidence: float, acceptance: float) -> None:
        cal = self.learned.calibration.get(source)
        if cal is not None:
            cal.observe(confidence, acceptance)
        if position == 0:
            # As a shadow: the first-position acceptance (what the stats show as alpha). A later
            # position the gate held back is not one a2 describes (a2 is what a passed one gets);
            # no extra decay, the round's own observe() already aged the estimate.
            self._observe_acceptance(source, 1.0, (acceptance, 1.0), (0.0, 0.0))

    def observe(
        self,
        source: str | None,
        k: int,
        accepted: int,
        draft_s: float,
        verify_s: float,
        confidence: Sequence[float] = (),
        positions: int | None = None,
    ) -> None:
        self.costs.observe_verify(k + 1, verify_s)
        self.rate[0] = self.decay * self.rate[0] + accepted + 1
        self.rate[1] = self.decay * self.rate[1] + draft_s + verify_s
        if self.probing:
            # A probe that was fully accepted may have found predictable text: probe again soon.
            # One that failed says k = 0 was right: wait twice as long before the next.
            full = k > 0 and accepted == k
            self.probe_interval = self.probe_every if full else min(2 * self.probe_interval, 256)
        if source is None:
            return
        positions = k if positions is None else positions
        if positions:
            self.costs.observe_draft(source, positions, draft_s)
        if k == 0:
            return
        self._observe_acceptance(
            source, self.decay, (min(accepted, 1), 1.0), (max(accepted - 1, 0), later_examined(k, accepted))
        )
        cal = self.learned.calibration.get(source)
        if cal is not None and confidence:
            for i in range(min(accepted + 1, k, len(confidence))):
                cal.observe(confidence[i], float(i < accepted))


class _Gate:
    """AutoK's gate over one round: position by position (`__call__`, a draft model), or, for a drafter
    that knows every position's confidence up front, the best prefix at once (`best_prefix`)."""

    def __init__(self, policy: AutoK, source: str, k: int, shadow: bool) -> None:
        self._decide = policy._gate_decider(source, k, shadow)
        self._policy, self._source, self._shadow = policy, source, shadow

    def __call__(self, position: int, confidence: float) -> bool:
        return self._decide(position, confidence)

    def best_prefix(self, confidences: Sequence[float]) -> int:
        """The n that maximizes the round's expected accepted drafts, sum over j <= n of f_1...f_j
        (f: each position's calibrated acceptance), less what the n drafts cost at the reference
        rate, r [T_v(n + 1) - T_v(1) + (n - 1) c_d] (the first draft step is the price of looking);
        0 when no n gains."""
        if not confidences:
            return 0
        policy = self._policy
        cal = policy.learned.calibration[self._source]
        cal.observe_first(confidences[0])
        if self._shadow:
            return 0
        inputs = policy._gate_inputs(self._source)
        if inputs is None:
            return min(2, len(confidences))  # costs unknown: a short draft measures them
        verify, c_draft, rate = inputs
        best_n, best, gain, survival = 0, 0.0, 0.0, 1.0
        for n, confidence in enumerate(confidences[: len(verify) - 1], start=1):
            survival *= min(cal.acceptance(confidence), 0.999)
            gain += survival
            value = gain - rate * (verify[n] - verify[0] + (n - 1) * c_draft)
            if value > best:
                best_n, best = n, value
        return best_n
