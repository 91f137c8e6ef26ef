"""How far to draft each round: a fixed k, or `auto`, which drafts each position only where that pays.

Every drafter reports its confidence at each position it drafts (a model: its top probability; n-gram
lookup: the continuation's lead over the runner-up), so `auto` is one path for all of them: a **gate**,
asked before each position (or, for a drafter that sees all its positions at once, over the whole
proposal), drafts position i when, for some length j > i,

    S f (1 - f^(j-i)) / (1 - f)  >  r [T_v(j+1) - T_v(i+1) + (j-i-1) c_d]  (costs.run_gain, run_cost)

S: the chance that positions 0..i-1 all pass; f: the acceptance the `Calibration` gives position i's
confidence, which the positions after it are assumed to share (confidence comes in runs; each is
judged on its own when it is drafted); T_v: the target's verify cost by batch size at the cache's
length (every row attends to it); c_d: a draft step; r: the reference rate (the better of plain
decoding and the recent rounds), which prices time in tokens (a Dinkelbach step towards the best
long-run rate). There is no ceiling below the drafter's own limit (MAX_DRAFT_K, the context, a
recurrent target's rollback): a sure source (a long copy) drafts as far as it stays sure, where a
verify batch of many tokens costs far less than several short ones.
Showing a position's confidence costs a draft step, which the gate takes only when what it may show
is worth it (`Gate.look`, over the confidences that have followed the last one's: `Calibration.after`);
the inequality above leaves that step out, and counts the n - 1 after it.

Before drafting at all, `decide` weighs one draft step against what rounds starting at the recent
first-position confidences gain. When that does not pay, the round is plain, and now and then the
gate **holds position 0** (a shadow): the drafter looks at the next position, nothing is verified, and
the target's own row there scores what it would have proposed, so drafting comes back when the text
turns predictable. If even the draft's surest confidence could not pay (a draft as dear as the
target), the source is hopeless: no shadows, except a recheck now and then that costs at most
RECHECK_SHARE of the time decoded meanwhile (what made it hopeless, a busy spell's draft cost or a
verify curve from a cost file, may not hold now); in later generations only one in `RECHECK_EVERY`
looks at once.
A drafter that reads every committed position before it drafts (a trained head catching up on the
target's features) pays for them however far apart its looks are. Where that alone costs more than
WATCH_SHARE of plain decoding, watching it cannot pay: declined or hopeless, the source **rests** for
the rest of the generation (no shadows, no rechecks, and the drafter stops the work that keeps it
ready: `Drafter.set_resting`), and in later generations only one in `RECHECK_EVERY` wakes it.

When plain rounds give more than half of a generation's tokens, `AutoK.holdback` says why from its own
figures (the engine's DoneEvent carries it to every front end): the drafter proposed nothing, or what
a verify and a draft step cost here against the acceptance it expects.

The cost model and `Learned` (calibration, hopeless sources) outlive a generation: they describe the
machine and the pair of models. Where confidence is a statistic of the text itself (n-gram lookup),
what it was worth on earlier prompts only starts the next one as a light prior (CARRIED_WEIGHT).
The cost model also outlives the process (specli.costcache). A fixed k drafts every position
whatever the draft's doubts.

Tunings: every constant below, its value, what it does and the measurement behind it are in
docs/tuning.md (the replays that moved each one: docs/performance.md, "The tunings of -k auto");
the constants carry only why they exist, and their history is in lab/history.md.
"""

from __future__ import annotations

import bisect
import math
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from specli.costs import CostModel, best_net_gain, best_rate, read_only, run_cost, run_gain
from specli.drafters.base import DraftGate
from specli.events import Holdback
from specli.sampling import SamplingParams
from specli.settings import MAX_DRAFT_K

# The tunings below, their values and what measured them: docs/tuning.md.
HORIZON = MAX_DRAFT_K + 1  # batch sizes the gate prices: the longest round (its drafts and one token)
FREE_LOOK = 0.01  # a draft step under this share of a target token is free: the gate judges every round
RECHECK_EVERY = 16  # a hopeless source looks again in one generation of this many (the load may change)
# Within a generation a hopeless source is looked at again once the rounds since its verdict (or its last
# recheck) took 1 / RECHECK_SHARE times what a look costs: a recheck costs at most this share.
RECHECK_SHARE = 0.01
# Shadows (looks in plain rounds, which measure the draft) may cost this share of plain decoding's time,
# and come at least every MAX_SHADOW_GAP rounds; none where fewer tokens are left than a shadow's gap.
SHADOW_SHARE = 0.01
MAX_SHADOW_GAP = 256
# A source whose catch-up, with what its features add to each plain token, costs more than this share of
# a plain token per committed position rests once declined (watching it would cost that share whatever
# the spacing of its looks).
WATCH_SHARE = 0.02
# A declined verdict holds this many plain rounds (or to the next shadow) unpriced; once the rate has
# settled (RATE_SETTLED plain rounds), after n plain rounds n more.
QUIET_ROUNDS = 8
# A catch-up of at least this many positions prices a position of it (a shorter one is mostly the
# decode's fixed cost, which looks spaced further apart would spread).
CATCH_UP_SAMPLE = 8
RATE_TOKENS = 8.0  # decayed tokens of recent rounds before their rate is the reference
RATE_DECAY = 0.9  # per round: the reference rate follows the text within ~10 rounds
RATE_SETTLED = 29  # plain rounds after which the rounds before weigh under 5 % in the rate (0.9^29 = 0.047)
# Near the output's end the reference rate is at most this share of the best rate the tokens left can
# give (all of them drafted in one batch and accepted), so that drafting them can pay.
END_SHARE = 0.9
# What earlier generations taught the calibration of a source whose confidence is the text's (n-gram
# lookup) weighs at most this many observations per bin when a new one starts (the next prompt may be
# another kind of text); a draft model's calibration describes the pair and carries whole.
CARRIED_WEIGHT = 4.0
# In a new process such a source's bins start from their confidence weighted as this many observations
# (a draft model's: one), so its first rounds learn the text sooner.
TEXT_PRIOR_WEIGHT = 0.5

# Positions a gate lets through before a verify batch and a draft step have been measured.
UNMEASURED_DRAFT = 2
# A bin's acceptance is used capped below 1: a sure run still ends somewhere.
ACCEPTANCE_CAP = 0.999
# Per observation, a bin's acceptance and its transitions forget at this rate: they describe the pair
# of models (or the kind of text) and change slowly.
CALIBRATION_DECAY = 0.98
# Per round, the first-position histogram forgets at this rate: it describes the text, which it
# follows within ~10 rounds.
FIRST_DECAY = 0.9
# Confidence bins: finer near 1, where a draft that knows the text puts most of its tokens.
_CONFIDENCE_EDGES = np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98])
_CONFIDENCE_MIDS = np.convolve(np.concatenate(([0.0], _CONFIDENCE_EDGES, [1.0])), [0.5, 0.5], "valid")
_EDGES = _CONFIDENCE_EDGES.tolist()  # `Calibration.bin`'s (bisect on a list: ~0.05 us, searchsorted ~0.9)


@dataclass
class Calibration:
    """How often a drafter's token is accepted as a function of its confidence, and how its confidence
    at a round's first position is distributed.

    The acceptance per bin starts at the bin's own confidence (a calibrated draft), weighted as one
    observation (with `borrow`, set for sources whose confidence is the text's, at what a less
    confident bin has learned if that is more; `starting` weighs it less for them); it describes the
    pair of models and changes slowly.
    The first-position histogram describes the text and follows it within ~10 rounds.
    """

    accepted: np.ndarray = field(default_factory=lambda: _CONFIDENCE_MIDS.copy())
    seen: np.ndarray = field(default_factory=lambda: np.ones(len(_CONFIDENCE_MIDS)))
    prior: np.ndarray = field(default_factory=lambda: np.ones(len(_CONFIDENCE_MIDS)))  # its weight left
    borrow: bool = False  # an unlearned bin's prior may be what a less confident bin learned
    first: np.ndarray = field(default_factory=lambda: np.zeros(len(_CONFIDENCE_MIDS)))
    last_first: float = 0.0
    # after[a, b]: how often a position in bin a was followed by one in bin b (confidence comes in
    # runs: one observation of "the same bin" to start).
    after: np.ndarray = field(default_factory=lambda: np.eye(len(_CONFIDENCE_MIDS)))
    # acceptances() and next_bins() until the next observation (read-only arrays): a priced round asks
    # for both, and on a fast token their numpy calls were a tenth of what pricing it cost.
    _derived: dict[str, np.ndarray] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def starting(cls, of_text: bool) -> Calibration:
        """A source's calibration before any round. Where confidence is the text's (n-gram lookup), bins
        borrow and their prior weighs TEXT_PRIOR_WEIGHT observations: the text's own rounds decide
        sooner."""
        cal = cls(borrow=of_text)
        if of_text:
            cal.carry(TEXT_PRIOR_WEIGHT)
        return cal

    @staticmethod
    def bin(confidence: float) -> int:
        # np.searchsorted(_CONFIDENCE_EDGES, confidence, side="right"), NaN included (the last bin); a
        # drafting round asks for ~30 of these.
        return bisect.bisect_right(_EDGES, confidence)

    def acceptance(self, confidence: float) -> float:
        return float(self._estimates()[self.bin(confidence)])

    def acceptances(self) -> np.ndarray:
        """The acceptance of every bin (capped below 1: a sure run still ends somewhere); read-only."""
        kept = self._derived.get("acceptances")
        if kept is None:
            kept = self._derived["acceptances"] = read_only(np.minimum(self._estimates(), ACCEPTANCE_CAP))
        return kept

    def _estimates(self) -> np.ndarray:
        # With `borrow`, a bin's prior is its own confidence, or what a less confident bin has learned
        # if that is more: a surer proposal is not taken to be accepted less often until its own
        # rounds say so (a copy resumes at once after a fork; lab/history.md).
        own = self.accepted / self.seen
        if not self.borrow:
            return own
        below = np.concatenate(([0.0], np.maximum.accumulate(own)[:-1]))
        return (self.accepted + self.prior * np.maximum(0.0, below - _CONFIDENCE_MIDS)) / self.seen

    def carry(self, weight: float) -> None:
        """Make each bin weigh at most `weight` observations, its acceptance unchanged (a new prompt
        starts: what earlier texts taught becomes a prior its own rounds soon outweigh)."""
        scale = np.minimum(1.0, weight / self.seen)
        self._derived.clear()
        self.accepted *= scale
        self.seen *= scale
        self.prior *= scale

    def observe(self, confidence: float, acceptance: float, decay: float = CALIBRATION_DECAY) -> None:
        b = self.bin(confidence)
        self._derived.clear()
        self.accepted[b] = decay * self.accepted[b] + acceptance
        self.seen[b] = decay * self.seen[b] + 1.0
        self.prior[b] *= decay

    def observe_after(self, confidence: float, next_confidence: float,
                      decay: float = CALIBRATION_DECAY) -> None:
        """A position with `confidence` was followed by one with `next_confidence` in a draft."""
        row = self.after[self.bin(confidence)]
        self._derived.clear()
        row *= decay
        row[self.bin(next_confidence)] += 1.0

    def next_bins(self) -> np.ndarray:
        """P(the next position's bin | this one's), one row per bin; read-only."""
        kept = self._derived.get("next_bins")
        if kept is None:
            kept = self._derived["next_bins"] = read_only(self.after / self.after.sum(axis=1, keepdims=True))
        return kept

    def observe_first(self, confidence: float, decay: float = FIRST_DECAY) -> None:
        self.first *= decay
        self.first[self.bin(confidence)] += 1.0
        self.last_first = confidence

    def to_record(self) -> dict[str, list[float]]:
        """What a later process starts from (`from_record`; Learned.to_record)."""
        return {"accepted": self.accepted.tolist(), "seen": self.seen.tolist(), "prior": self.prior.tolist(),
                "first": self.first.tolist(), "last_first": [self.last_first],
                "after": self.after.ravel().tolist()}

    @classmethod
    def from_record(cls, record: Mapping) -> Calibration:
        """A calibration from `to_record`; ValueError if it is malformed."""
        arrays = {name: np.asarray(record[name], dtype=float)
                  for name in ("accepted", "seen", "prior", "first")}
        if any(a.shape != _CONFIDENCE_MIDS.shape or not np.isfinite(a).all() or (a < 0).any()
               for a in arrays.values()) or (arrays["seen"] <= 0).any():
            raise ValueError("a calibration of another shape, or negative")
        (last_first,) = record["last_first"]
        after = np.eye(len(_CONFIDENCE_MIDS))
        if "after" in record:  # older files lack it: they start from the prior
            after = np.asarray(record["after"], dtype=float).reshape(after.shape)
            if not np.isfinite(after).all() or (after < 0).any() or (after.sum(axis=1) <= 0).any():
                raise ValueError("a calibration's transitions negative or empty")
        return cls(**arrays, last_first=float(last_first), after=after)


def _same(a: tuple, b: tuple) -> bool:
    """Two stamps alike: arrays the same object, everything else equal."""
    return len(a) == len(b) and all(x is y if isinstance(x, np.ndarray) else x == y
                                    for x, y in zip(a, b, strict=True))


def _held_this_generation(verdicts: dict[str, int]) -> list[str]:
    """A new generation for `verdicts` (source -> generations since the verdict): each one older, and
    the sources it still holds off (all but one generation in RECHECK_EVERY, which looks again)."""
    for source in verdicts:
        verdicts[source] += 1
    return [source for source, since in verdicts.items() if since % RECHECK_EVERY]


def regime(sampling: SamplingParams, same_as_plain: bool) -> str:
    """What a draft's acceptance depends on besides the pair of models: the sampling settings (greedy
    is one regime whatever the rest) and the verify rule."""
    if sampling.greedy:
        return "greedy"
    return (f"T={sampling.temperature:g} top_k={sampling.top_k} top_p={sampling.top_p:g} "
            f"min_p={sampling.min_p:g} {'same-as-plain' if same_as_plain else 'rejection'}")


@dataclass
class Learned:
    """What auto learned about this pair of models that the next generation starts from: acceptance by
    confidence per source, and the sources found hopeless with the generations since. (What the
    machine's decodes cost is the CostModel's.)

    Acceptance depends on the sampling settings too (`regime`): `calibration` is the current regime's,
    and `enter` switches to another's, as it was left (what an earlier process saved, `restore`, or
    nothing yet). A draft model's calibration describes the pair of models and is what a later
    process starts from (`to_record`, kept by specli.costcache), instead of taking each confidence at
    its face value for its first rounds. A calibration whose confidence is the text's (n-gram lookup)
    is not kept: the next process's text is another."""

    calibration: dict[str, Calibration] = field(default_factory=dict)
    hopeless: dict[str, int] = field(default_factory=dict)
    resting: dict[str, int] = field(default_factory=dict)  # sources that rest, with the generations since
    regime: str | None = None
    others: dict[str, dict[str, Calibration]] = field(default_factory=dict)  # other regimes' calibrations

    def enter(self, regime: str) -> None:
        """Generations from now on sample in `regime`: its calibrations become `calibration`."""
        if regime == self.regime:
            return
        if self.regime is not None:
            self.others[self.regime] = self.calibration
        elif self.calibration:
            # Learned before any regime was named (an API caller's own Learned): the first one's.
            self.others.setdefault(regime, {}).update(self.calibration)
        self.calibration = self.others.pop(regime, {})
        self.regime = regime

    def to_record(self) -> dict[str, dict[str, dict[str, list[float]]]]:
        """Per regime, the calibrations a later process over the same models starts from: those of
        sources whose confidence is the model's own (not the text's)."""
        regimes = dict(self.others)
        if self.regime is not None:
            regimes[self.regime] = self.calibration
        record = {name: {source: cal.to_record() for source, cal in sources.items() if not cal.borrow}
                  for name, sources in regimes.items()}
        return {name: sources for name, sources in record.items() if sources}

    def restore(self, record: Mapping) -> None:
        """Start from an earlier process's `to_record` (regimes this process has not entered yet);
        ValueError if it is malformed."""
        restored = {str(name): {str(source): Calibration.from_record(cal) for source, cal in sources.items()}
                    for name, sources in record.items()}
        for name, sources in restored.items():
            if name != self.regime:
                self.others.setdefault(name, {}).update(sources)


@dataclass(frozen=True)
class Decision:
    """A round's plan: draft up to `k` positions (the gate may stop earlier); at k = 0, `look` asks the
    drafter for position 0 anyway, held back by the gate and scored against the target's row (a
    shadow)."""

    k: int
    look: bool = False


@dataclass(frozen=True)
class RoundReport:
    """What one round tells the policy (one record, as the proposer builds it)."""

    source: str | None  # the source asked (None: a plain round that looked at nothing)
    drafted: int  # tokens the target verified after the pending one
    accepted: int
    draft_seconds: float  # the drafter's, without the catch-up debt of earlier plain rounds
    verify_seconds: float
    positions: int  # draft steps this round's drafting cost (drafted, a held one, less a caught-up one)
    confidence: Sequence[float] = ()  # of the drafted positions
    first_confidence: float | None = None  # position 0's, drafted or held
    held: tuple[float, float] | None = None  # (confidence, acceptance) of a held position the target scored
    catch_up_seconds: float = 0.0  # the catch-up debt left out of draft_seconds
    padding: int = 0  # rows verified past the draft (`DraftPolicy.batch_size`)
    position: int = 0  # tokens in the target's cache before the verify
    cpu_share: float | None = None  # the process's CPU seconds over the verify's wall seconds (or None)
    # The round's time before the drafter was asked (the policy pricing it): the round's, in the
    # recent rate, not the drafter's cost.
    deciding_seconds: float = 0.0


@dataclass(frozen=True)
class GateInputs:
    """What a gate decision needs, fixed for a round: T_v(1..), a draft step's seconds, the reference
    rate, the calibrated acceptance of each confidence bin and, when known, how a position's bin
    predicts the next one's (`Calibration.next_bins`)."""

    verify: np.ndarray
    c_draft: float  # what one more drafted position costs (a block drafter's: nothing, once its pass ran)
    rate: float
    acceptances: np.ndarray
    next_bins: np.ndarray | None = None
    c_pass: float | None = None  # a block drafter's pass (None: a draft step, c_draft)
    n_max: int | None = None  # the positions a pass can propose (a block drafter's block)

    def acceptance(self, confidence: float) -> float:
        return float(self.acceptances[Calibration.bin(confidence)])

    @property
    def pass_cost(self) -> float:
        """What asking the drafter for a round's first position costs: a draft step, or a block pass."""
        return self.c_draft if self.c_pass is None else self.c_pass

    def drafting_cost(self, n: np.ndarray) -> np.ndarray:
        """Seconds drafting n positions costs (0 for n = 0)."""
        return np.where(n > 0, self.pass_cost + (n - 1) * self.c_draft, 0.0)


def position_pays(inputs: GateInputs, i: int, confidence: float, survival: float, k: int) -> float | None:
    """Whether drafting position i (of at most k) pays, given the chance `survival` that positions
    before it all pass: the new survival if it does (some length j > i gains more than it costs at the
    reference rate), None if not. A pure function of its arguments."""
    f = inputs.acceptance(confidence)
    gain = best_net_gain(survival * f, f, inputs.verify, i, k - i, inputs.c_draft, inputs.rate)
    return survival * f if gain > 0.0 else None


def worth_looking(inputs: GateInputs, i: int, previous: float, survival: float, k: int) -> bool:
    """Whether a draft step to learn position i's confidence (of at most k; the one before had
    `previous`, and all before pass with chance `survival`) is worth its cost: what drafting on from
    i gains, over the confidences the next position is likely to have (`GateInputs.next_bins`), each
    the best length chosen or none, against the step, at the reference rate. Taking the step and
    letting the gate refuse what it finds would cost a draft decode a round that a fixed k never
    pays."""
    if min(k - i, len(inputs.verify) - 1 - i) < 1:
        return False
    if inputs.next_bins is None:
        return True
    f = np.minimum(inputs.acceptances, ACCEPTANCE_CAP)  # each bin's, the best length chosen for each
    net = best_net_gain(survival * f, f, inputs.verify, i, k - i, inputs.c_draft, inputs.rate)
    chances = inputs.next_bins[Calibration.bin(previous)]
    return float(chances @ np.maximum(net, 0.0)) > inputs.rate * inputs.c_draft


def best_prefix(inputs: GateInputs, confidences: Sequence[float]) -> int:
    """The n that maximizes a round's expected accepted drafts, sum over j <= n of f_1 ... f_j (each
    position's calibrated acceptance), less what the n drafts cost at the reference rate (the first
    draft step is the price of looking); 0 when no n gains. For a drafter that sees every position's
    confidence before drafting (n-gram lookup): a doubtful position followed by sure ones (the turn of
    a repeated passage) is still worth drafting through."""
    n_max = min(len(confidences), len(inputs.verify) - 1)
    if n_max == 0:
        return 0
    f = np.minimum(inputs.acceptances[np.searchsorted(_CONFIDENCE_EDGES, confidences[:n_max], side="right")],
                   ACCEPTANCE_CAP)
    value = np.cumsum(np.cumprod(f)) - inputs.rate * run_cost(inputs.verify, 0, np.arange(1, n_max + 1),
                                                              inputs.c_draft)
    best = int(np.argmax(value))
    return best + 1 if value[best] > 0.0 else 0


class Gate:
    """One round's gate over the positions a drafter proposes: position by position (`__call__`, a
    drafter that draws one at a time) or over the whole proposal at once (`best_prefix`). Holding
    position 0 (`hold_first`) makes the round a shadow. Without measured costs it lets a short draft
    through (UNMEASURED_DRAFT positions), which measures them."""

    def __init__(self, inputs: GateInputs | None, k: int, hold_first: bool,
                 make_inputs: Callable[[], GateInputs | None] | None = None) -> None:
        self._inputs, self.k, self.hold_first = inputs, k, hold_first
        self._make_inputs = make_inputs  # when given, the inputs are made the first time one is asked
        self.pricing_seconds = 0.0  # making them, inside the drafter's call (DraftGate)
        self._survival = 1.0
        self._previous = 1.0  # the last drafted position's confidence

    @property
    def inputs(self) -> GateInputs | None:
        if self._make_inputs is not None:
            started = time.perf_counter()
            self._inputs, self._make_inputs = self._make_inputs(), None
            self.pricing_seconds = time.perf_counter() - started
        return self._inputs

    def __call__(self, position: int, confidence: float) -> bool:
        if self.hold_first:
            return False
        if self.inputs is None:
            return position < UNMEASURED_DRAFT
        survival = position_pays(self.inputs, position, confidence, self._survival, self.k)
        if survival is None:
            return False
        self._survival, self._previous = survival, confidence
        return True

    def look(self, position: int) -> bool:
        if self.inputs is None:
            return position < UNMEASURED_DRAFT
        return worth_looking(self.inputs, position, self._previous, self._survival, self.k)

    def best_prefix(self, confidences: Sequence[float]) -> int:
        if self.hold_first or not confidences:
            return 0
        if self.inputs is None:
            return min(UNMEASURED_DRAFT, len(confidences))
        return best_prefix(self.inputs, confidences[: self.k])


class DraftPolicy:
    """Decides each round's draft length (and gives the gate that may stop it earlier) from what the
    rounds before cost and yielded. The Proposer asks it and reports back to it."""

    def decide(self, source: str, limit: int, left: int | None = None, position: int = 0) -> Decision:
        """This round's plan: at most `limit` drafts; `left`, the tokens the generation can still emit;
        `position`, the tokens in the target's cache (what each verified row attends to)."""
        raise NotImplementedError

    def gate(self, source: str, decision: Decision) -> DraftGate | None:
        """This round's gate (None: draft every position of the decision)."""
        return None

    def batch_size(self, m: int, m_max: int) -> int:
        """The batch to verify m tokens with (at most m_max): m, or a larger one that costs less."""
        return m

    def observe(self, report: RoundReport) -> None:
        """Feedback after a round."""

    def observe_plain(self, source: str, draft_seconds: float, verify_seconds: float, position: int,
                      cpu_share: float | None, rested: bool) -> None:
        """A plain round in which the drafter was asked nothing: what `observe` learns from one, without
        its report (a fast target's token leaves a few microseconds for a round's work). `source`: the
        one `decide` was last asked about; `rested`: every source rests, and `decide` was not called."""
        self.observe(RoundReport(None, 0, 0, draft_seconds, verify_seconds, 0, position=position,
                                 cpu_share=cpu_share))

    def resting(self) -> frozenset[str]:
        """Sources this generation will not ask again (their drafter may stop keeping ready)."""
        return frozenset()

    def holdback(self) -> Holdback | None:
        """Why this generation drafted little or nothing (None: it did not hold back, or the policy
        never does)."""
        return None


class FixedK(DraftPolicy):
    """Always k drafts (fewer only where the output or the context ends), whatever the draft's doubts."""

    def __init__(self, k: int) -> None:
        self.k = k

    def decide(self, source: str, limit: int, left: int | None = None, position: int = 0) -> Decision:
        return Decision(max(0, min(self.k, limit)))


@dataclass
class AutoK(DraftPolicy):
    costs: CostModel = field(default_factory=CostModel)
    learned: Learned = field(default_factory=Learned)
    rate: list[float] = field(default_factory=lambda: [0.0, 0.0])  # decayed tokens, seconds of rounds
    plain_rounds: int = 0  # rounds since the last one that drafted (a declined verdict's quiet counts them)
    hopeless: set[str] = field(default_factory=set)  # sources that would not pay even at their surest
    # Sources not asked again this generation (`resting`), each with why: "declined" | "hopeless".
    rests: dict[str, str] = field(default_factory=dict)
    left: int | None = None  # tokens the generation can still emit (this round's `decide`)
    position: int = 0  # tokens in the target's cache (this round's `decide`)
    text_sources: frozenset[str] = frozenset()  # sources whose confidence is the text's (n-gram)
    block_sources: Mapping[str, int] = field(default_factory=dict)  # block drafters' sources: their block
    _round_inputs: tuple[str, GateInputs | None] | None = field(default=None, repr=False)  # decide's
    # What each round of this generation did: "drafted", or why not: "nothing" (the drafter proposed
    # nothing), "declined" (not worth its cost), "hopeless", "unmeasured" (costs not known yet).
    tally: Counter = field(default_factory=Counter)
    emitted: int = 0  # tokens this generation's rounds emitted (a drafting round emits several)
    asked: Counter = field(default_factory=Counter)  # rounds by the source asked
    _plan: str = field(default="unmeasured", repr=False)  # this round's, from `decide`
    _since_recheck: float = field(default=0.0, repr=False)  # seconds decoded since a hopeless verdict
    _unread: dict[str, int] = field(default_factory=dict, repr=False)  # tokens since a source last read
    _quiet: tuple[str, int] | None = field(default=None, repr=False)  # declined until plain_rounds reach
    _look_price: dict[str, float] = field(default_factory=dict, repr=False)  # `_recheck_due`'s, per source
    # inputs()'s best rate with what it was priced from (the verify array itself, then the rest).
    _best_rate: tuple | None = field(default=None, repr=False)
    _worth_terms: dict[str, tuple] = field(default_factory=dict, repr=False)  # `_worth`'s, per source
    # The last priced verdict that holds while nothing it rested on changes (`_stamp`): (stamp, plan,
    # shadow gap, plain_rounds when priced).
    _verdict: tuple | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        for source in self.text_sources & self.learned.calibration.keys():
            self.learned.calibration[source].carry(CARRIED_WEIGHT)
        # Not even a shadow: on a draft as dear as the target, one costs a target token.
        self.hopeless.update(_held_this_generation(self.learned.hopeless))
        self.rests.update(dict.fromkeys(_held_this_generation(self.learned.resting), "declined"))

    def _calibration(self, source: str) -> Calibration:
        cal = self.learned.calibration.get(source)
        if cal is None:
            # Borrowing pays for n-gram lookup, not for a draft model (docs/tuning.md).
            cal = self.learned.calibration[source] = Calibration.starting(source in self.text_sources)
        return cal

    def inputs(self, source: str) -> GateInputs | None:
        """The round's gate inputs, once T_v(1) and a draft step (a block drafter's pass) have been
        measured."""
        verify = self.costs.verify_array(HORIZON, self.position)
        c_draft = self.costs.draft_seconds_per_token(source)
        if verify is None or c_draft is None:
            return None
        block = self.block_sources.get(source, 0)
        # A block drafter's pass is paid before the gate sees its positions: once it ran, a kept
        # position costs only its share of the verify.
        c_pass, c_draft = (c_draft, 0.0) if block else (None, c_draft)
        tokens, seconds = self.rate
        # The recent rounds' rate once they are a few tokens' worth: a rate from one or two rounds
        # is noise, and a high one makes every draft step look dear for the whole generation.
        rate = max(1.0 / verify[0], tokens / seconds if tokens >= RATE_TOKENS else 0.0)
        acceptances = self._calibration(source).acceptances()
        # But no more than the best rate a round can be expected to give (each draft at the best
        # acceptance learned): a reference rate above every option prices even a sure long copy at a
        # loss.
        rate = min(rate, self._best_rate_of(float(acceptances.max()), verify, c_draft, c_pass, block))
        if self.left is not None and self.left <= len(verify):
            # Near the output's end the time to come is that of the tokens left, at best all in one
            # batch: priced at the recent rate (after long copies, several times plain decoding), a
            # draft of the last tokens looks dear and they are decoded one by one.
            rate = min(rate, max(1.0 / verify[0], END_SHARE * self.left / verify[self.left - 1]))
        return GateInputs(verify, c_draft, rate, acceptances, self._calibration(source).next_bins(), c_pass,
                          block or None)

    def _best_rate_of(self, acceptance: float, verify: np.ndarray, c_draft: float, c_pass: float | None,
                      block: int) -> float:
        """best_rate, kept while what it depends on is the same (on a fast token each priced round
        paid ~30 us for it, though the curve changes every few rounds and acceptance more rarely)."""
        kept = self._best_rate
        key = (acceptance, c_draft, c_pass, block)
        if kept is None or kept[0] is not verify or kept[1] != key:
            kept = self._best_rate = (verify, key, best_rate(acceptance, verify, c_draft, c_pass=c_pass,
                                                              n_max=block or None))
        return kept[2]

    def _worth(self, source: str, inputs: GateInputs) -> np.ndarray:
        """Per confidence bin, the tokens (beyond their cost at the reference rate) a round gains whose
        first position has that confidence, the best length chosen; 0 if none gains."""
        f, verify = inputs.acceptances, inputs.verify
        n_max = min(inputs.n_max or len(verify) - 1, len(verify) - 1)
        if n_max < 1:
            return np.maximum(0.0, best_net_gain(f, f, verify, 0, n_max, inputs.c_draft, inputs.rate))
        # best_net_gain's terms, those that do not move with the rate kept while their inputs are the
        # same objects (a calibration's acceptances until it observes, the curve until it changes).
        kept = self._worth_terms.get(source)
        if kept is None or kept[0] is not f or kept[1] is not verify or kept[2] != (inputs.c_draft, n_max):
            n = np.arange(1, n_max + 1)
            kept = self._worth_terms[source] = (f, verify, (inputs.c_draft, n_max),
                                                run_gain(f[..., None], f[..., None], n),
                                                run_cost(verify, 0, n, inputs.c_draft))
        return np.maximum(0.0, (kept[3] - inputs.rate * kept[4]).max(axis=-1))

    def decide(self, source: str, limit: int, left: int | None = None, position: int = 0) -> Decision:
        """Draft up to `limit` positions if looking at the first one (a draft step) is worth its cost,
        given how the draft's confidence there has been distributed lately (or was the last time) and
        what each confidence is worth; the gate then stops the round where drafting on stops paying.
        Otherwise a plain round, with a look now and then (a shadow)."""
        self.left, self.position, self._round_inputs = left, position, None
        self.asked[source] += 1
        self._unread.setdefault(source, 0)
        if source in self.rests:
            self._plan = self.rests[source]
            return self._plain(look=False)
        quiet = self._quiet
        if quiet is not None and quiet[0] == source and self.plain_rounds < quiet[1]:
            self._plan = "declined"
            return self._plain(look=False)
        self._quiet = None
        if source in self.hopeless:
            if not self._recheck_due(source):
                self._plan = "hopeless"
                return self._plain(look=False)  # nothing new is learned without looks
            # Judged again with what is known now; if still hopeless, this round's look re-measures
            # the draft step (below).
            self.hopeless.discard(source)
        kept = self._verdict
        if (kept is not None and self.plain_rounds - kept[3] < MAX_SHADOW_GAP
                and (self.left is None or self.left > HORIZON) and _same(kept[0], self._stamp(source))):
            # Nothing the last verdict rested on has changed since (no step timed, no position
            # proposed; only the rate and the curve drift, and it is priced again at least every
            # MAX_SHADOW_GAP plain rounds): it holds unpriced. N-gram lookup on text without repeats
            # times a step only where it finds something, and pricing each round (or each shadow's)
            # cost 40-150 us on a 1 ms token, several times the lookup.
            if kept[1] == "unmeasured":
                self._plan = "unmeasured"
                return self._plain(look=True)
            return self._declined(source, kept[2], woken=False)
        self._verdict = None
        curve = self.costs.verify_seconds(HORIZON, self.position)
        c_draft = self.costs.draft_seconds_per_token(source)
        if curve is None or c_draft is None:
            # No T_v(1) yet (a plain round measures it) or no draft step: shadows measure it before
            # any round pays for drafts that may not be worth their cost (a look once it is timed
            # measures nothing a plain round does not).
            self._round_inputs = (source, None)
            self._plan = "unmeasured"
            return self._plain(look=c_draft is None or not self.costs.warmed_up(source))
        self._plan = "offered"
        if c_draft < FREE_LOOK * curve[0]:
            # Looking costs next to nothing (n-gram lookup): let the gate judge every round, pricing
            # only a round with a proposal (`gate`): most rounds of most text have none.
            self.learned.hopeless.pop(source, None)
            self.learned.resting.pop(source, None)
            return Decision(limit)
        inputs = self.inputs(source)
        assert inputs is not None  # the curve and the draft step are known
        self._round_inputs = (source, inputs)  # the gate's too, for this round
        cal = self._calibration(source)
        if cal.first.sum() >= 1.0:
            worth = self._worth(source, inputs)
            price = inputs.rate * inputs.pass_cost  # a draft step (a pass), in tokens at the reference rate
            # Confidence comes in runs (a copy goes on), so the last first position seen predicts the
            # next: a sure shadow brings drafting back at once, whatever the rounds before say.
            expected = max(float(cal.first @ worth) / cal.first.sum(), worth[cal.bin(cal.last_first)])
            if expected <= price:
                if not self.costs.draft_settled(source) and not (
                        self.costs.warmed_up(source) and float(worth.max()) > price
                        and not self._dear_to_watch(source, inputs)):
                    # Priced by a step or two that may be cold (a GPU's graph building): look again
                    # each round, which times more steps, before any verdict (costs.SETTLED_SAMPLES).
                    # A drafter that ran a pass of its shape at load (Drafter.warm_up) times warm
                    # steps from its first: a declined verdict, whose shadows time more, needs no more
                    # (one that stops the looks, hopeless or resting, still waits for the median).
                    self._plan = "unmeasured"
                    if not self.costs.warmed_up(source):  # (a warmed-up one's turns on its unread tokens)
                        self._keep_verdict(source, "unmeasured", 0)
                    return self._plain(look=True)
                if self._dear_to_watch(source, inputs):
                    return self._rest(source, "hopeless" if float(worth.max()) <= price else "declined")
                if float(worth.max()) <= price:
                    # Even the draft's surest band does not pay: each shadow would have to catch the
                    # draft up on every plain token since the last, which on a draft as dear as the
                    # target costs as much as the speculation it would bring back. This round looks
                    # once more (it re-measures the draft step), then only a recheck now and then.
                    self.hopeless.add(source)
                    self.learned.hopeless[source] = 0
                    self._since_recheck = 0.0
                    self._plan = "hopeless"
                    return self._plain(look=True)
                # A shadow once the tokens since the drafter last read take it, and at the first round
                # of a generation that woke a resting source (it has nothing to catch up on there).
                woken = self.asked[source] == 1 and source in self.learned.resting
                self.learned.hopeless.pop(source, None)
                self.learned.resting.pop(source, None)
                gap = self._shadow_gap(source, inputs)
                if not woken and self._unread[source] > 0:  # (with none unread it was not dear to watch)
                    self._keep_verdict(source, "declined", gap)
                return self._declined(source, gap, woken)
        self.learned.hopeless.pop(source, None)
        self.learned.resting.pop(source, None)
        return Decision(limit)

    def _declined(self, source: str, gap: int, woken: bool) -> Decision:
        """A plain round of a declined verdict, shadows `gap` tokens apart."""
        self._plan = "declined"
        if not woken and not self.tally["drafted"] and self.left is not None and self.left < gap:
            # A shadow is bought for the gap's tokens (SHADOW_SHARE of their time); fewer are left to
            # watch, and no round of this generation drafted: none is due before the output ends (where
            # drafting came back before, one that brings it back again may pay many times its cost).
            # Priced again where the output's end prices the tokens left (END_SHARE).
            self._quiet = (source, self.plain_rounds + (self.left - HORIZON if self.left > HORIZON
                                                        else QUIET_ROUNDS))
            return self._plain(look=False)
        wait = 0 if woken else max(0, gap - self._unread[source])
        # Nothing that could change this verdict is learned before the next shadow but the reference
        # rate, which follows the text within ~10 rounds: the rounds up to the next shadow are plain
        # without pricing it again, QUIET_ROUNDS of them while the rounds that drafted still weigh in
        # the rate, then as many as have been plain.
        hold = self.plain_rounds if self.plain_rounds >= RATE_SETTLED else QUIET_ROUNDS
        self._quiet = (source, self.plain_rounds + min(wait or gap, hold))
        return self._plain(look=wait == 0)

    def _keep_verdict(self, source: str, plan: str, gap: int) -> None:
        """Keep a verdict to hold while nothing it rested on changes: once the reference rate has
        settled (RATE_SETTLED plain rounds: before, the rounds that drafted still move it, and with it
        the verdict), and not near the output's end, which prices the rate by the tokens left."""
        if self.plain_rounds >= RATE_SETTLED and (self.left is None or self.left > HORIZON):
            self._verdict = (self._stamp(source), plan, gap, self.plain_rounds)

    def _stamp(self, source: str) -> tuple:
        """What a verdict on `source` rested on that a round can change: the source, its timed steps,
        its calibration (its acceptances are one object until it observes) and the first positions
        seen."""
        cal = self._calibration(source)
        return (source, tuple(self.costs.draft.get(source, ())), cal.acceptances(), cal.last_first,
                float(cal.first.sum()))

    def _plain(self, look: bool) -> Decision:
        return Decision(0, look)

    def _dear_to_watch(self, source: str, inputs: GateInputs) -> bool:
        """Whether watching `source` costs more than WATCH_SHARE of a plain token per committed
        position: its catch-up, and what its features add to every plain decode (a trained head's,
        timed at load). No spacing of its looks would make watching it cheaper than that. Not before
        it has anything to catch up on: a generation's begin() caught it up on the prompt, and a look
        there is what wakes it."""
        per_position = self._watch_seconds(source)
        return (per_position is not None and per_position > WATCH_SHARE * float(inputs.verify[0])
                and self._unread.get(source, 0) > 0)

    def _watch_seconds(self, source: str) -> float | None:
        """What watching `source` costs per committed position: its catch-up and its features (None:
        neither measured)."""
        catch_up = self.costs.catch_up_seconds_per_position(source)
        features = self.costs.watch_seconds_per_token(source)
        if catch_up is None and features is None:
            return None
        return (catch_up or 0.0) + (features or 0.0)

    def _rest(self, source: str, cause: str) -> Decision:
        self.rests[source] = cause
        self.learned.resting[source] = 0
        self.learned.hopeless.pop(source, None)
        self._plan = cause
        return self._plain(look=False)

    def resting(self) -> frozenset[str]:
        return frozenset(self.rests)

    def _recheck_due(self, source: str) -> bool:
        """Whether the rounds since a hopeless verdict (or the last recheck) took long enough that a
        look costs at most RECHECK_SHARE of them: a verdict from a busy spell, or from a cost file's
        verify curve, does not hold drafting off for the whole generation."""
        look = self._look_price.get(source)
        if look is None:  # priced again after each look (only a look changes what it costs)
            look = self._look_price[source] = max(self.costs.draft_seconds_per_token(source) or 0.0,
                                                  self.costs.look_seconds(source) or 0.0)
        return self._since_recheck * RECHECK_SHARE >= look

    def _shadow_gap(self, source: str, inputs: GateInputs) -> int:
        """The tokens between shadows."""
        # Shadow every plain round when drafting is cheap, less often when not, so that shadows cost
        # at most ~SHADOW_SHARE of plain decoding (at least every MAX_SHADOW_GAP tokens: the draft
        # cost itself is learned from these). A shadow costs what a look costs (the draft catching
        # up on the plain tokens since the last one, its step, its draw), not the draft step alone:
        # the catch-up reads the draft's weights back after the target's evicted them.
        cost = max(inputs.pass_cost, self.costs.look_seconds(source) or 0.0)
        return min(MAX_SHADOW_GAP, max(1, math.ceil(cost / inputs.verify[0] / SHADOW_SHARE)))

    def gate(self, source: str, decision: Decision) -> Gate:
        kept = self._round_inputs
        if kept is not None and kept[0] == source:
            return Gate(kept[1], decision.k, hold_first=decision.k == 0)
        return Gate(None, decision.k, hold_first=decision.k == 0, make_inputs=lambda: self.inputs(source))

    def batch_size(self, m: int, m_max: int) -> int:
        return self.costs.cheapest_batch(m, m_max, self.position)

    def observe(self, report: RoundReport) -> None:
        self._round_inputs = None
        if report.drafted:
            self.tally["drafted"] += 1
        elif report.source is not None and report.first_confidence is None:
            self.tally["nothing"] += 1  # asked, it proposed nothing (n-gram lookup found no match)
        else:
            self.tally["declined" if self._plan == "offered" else self._plan] += 1
        self._observe_round(report.drafted, report.accepted, report.padding,
                            report.draft_seconds + report.deciding_seconds, report.verify_seconds,
                            report.position, report.cpu_share)
        source = report.source
        if source is not None:
            if report.drafted or report.first_confidence is not None:
                self._quiet = None  # what the drafter showed is priced in the next round
            # (A look that found nothing, n-gram lookup on text without repeats, leaves the price
            # as it was: pricing the round after each shadow cost more than the shadows on a fast
            # token.)
            unread = self._unread.get(source, 0)
            if report.catch_up_seconds > 0.0 and unread >= CATCH_UP_SAMPLE:
                # Less a draft step, about the fixed cost of the catch-up's decode (a block drafter's
                # pass is not: its catch-up is a cheaper decode of its own).
                fixed = 0.0 if source in self.block_sources else self.costs.draft_seconds_per_token(source)
                debt = max(0.0, report.catch_up_seconds - (fixed or 0.0))
                self.costs.observe_catch_up(source, unread, debt)
            self._unread[source] = 0
        self._count_unread(report.accepted + 1)
        if source is None:
            return
        self._look_price.pop(source, None)
        if report.positions:
            self.costs.observe_draft(source, report.positions, report.draft_seconds)
        if not report.drafted:
            self.costs.observe_look(source, report.draft_seconds + report.catch_up_seconds)
        cal = self._calibration(source)
        if report.first_confidence is not None:
            cal.observe_first(report.first_confidence)
        # Positions the target judged: the accepted ones and the first rejected one.
        for i in range(min(report.accepted + 1, report.drafted, len(report.confidence))):
            cal.observe(report.confidence[i], float(i < report.accepted))
        drafted = list(report.confidence[: report.drafted])
        if drafted and report.held is not None:
            drafted.append(report.held[0])
        for before, after in zip(drafted[:-1], drafted[1:], strict=True):
            cal.observe_after(before, after)
        if report.held is not None:
            cal.observe(*report.held)

    def observe_plain(self, source: str, draft_seconds: float, verify_seconds: float, position: int,
                      cpu_share: float | None, rested: bool) -> None:
        # What `observe` does with a report of no source, and, for a rested round, the count and the
        # plan (the cause it rests for) that `decide` would have given.
        self._round_inputs = None
        if rested:
            self.asked[source] += 1
            self.tally[self.rests.get(source, "declined")] += 1
        else:
            self.tally["declined" if self._plan == "offered" else self._plan] += 1
        self._observe_round(0, 0, 0, draft_seconds, verify_seconds, position, cpu_share)
        self._count_unread(1)

    def _observe_round(self, drafted: int, accepted: int, padding: int, draft_seconds: float,
                       verify_seconds: float, position: int, cpu_share: float | None) -> None:
        """What every round teaches, asked or not: the verify's cost and the recent rate."""
        self.emitted += accepted + 1
        if self.hopeless:
            self._since_recheck += draft_seconds + verify_seconds
        self.costs.observe_verify(drafted + 1 + padding, verify_seconds, position, cpu_share)
        self.rate[0] = RATE_DECAY * self.rate[0] + accepted + 1
        self.rate[1] = RATE_DECAY * self.rate[1] + draft_seconds + verify_seconds
        self.plain_rounds = 0 if drafted else self.plain_rounds + 1

    def _count_unread(self, tokens: int) -> None:
        """A round committed `tokens` that no source has read yet."""
        for asked in self._unread:
            self._unread[asked] += tokens

    def holdback(self) -> Holdback | None:
        """Why plain rounds gave more than half of this generation's tokens, from auto's own figures:
        the cause most plain rounds had, and what a verify and a draft step cost here against the
        acceptance auto expects at a round's first position (None: drafting rounds gave half or more)."""
        rounds = sum(self.tally.values())
        plain = rounds - self.tally["drafted"]
        if not rounds or 2 * plain <= self.emitted or not self.asked:
            return None
        cause = max(("nothing", "declined", "hopeless", "unmeasured"), key=lambda c: self.tally[c])
        source = self.asked.most_common(1)[0][0]
        count = f"{self.tally[cause]} of {rounds} rounds"
        if cause == "nothing":
            what = "nothing to copy" if source in self.text_sources else "nothing proposed"
            return Holdback(cause, f"{source}: {what} in {count}", plain, rounds)
        inputs = self.inputs(source)
        if inputs is None:
            return Holdback("unmeasured", f"the output ended before auto had measured what a verify and a "
                                          f"draft step cost ({count} plain)", plain, rounds)
        return self._priced(cause, source, inputs, plain, rounds)

    def _priced(self, cause: str, source: str, inputs: GateInputs, plain: int, rounds: int) -> Holdback:
        """A holdback priced with the round's figures: the verify of the best length at the acceptance
        auto expects (each first-position confidence as often as it came; a sure draft when hopeless)
        and the speed drafting would give against plain decoding."""
        verify = inputs.verify
        t1 = float(verify[0])
        cal = self._calibration(source)
        acceptances = np.minimum(cal.acceptances(), ACCEPTANCE_CAP)
        if cause == "hopeless" or cal.first.sum() <= 0:
            weights = np.zeros(len(acceptances))
            weights[-1] = 1.0  # the surest band
        else:
            weights = cal.first / cal.first.sum()
        n = np.arange(1, min(len(verify), (inputs.n_max or len(verify)) + 1))
        per_bin = acceptances[:, None]
        cost = verify[n] + inputs.drafting_cost(n)
        speeds = (1.0 + run_gain(per_bin, per_bin, n)) * t1 / cost
        speed = float(weights @ speeds.max(axis=1))
        acceptance = float(weights @ acceptances)
        best = int(n[np.argmax((1.0 + run_gain(acceptance, acceptance, n)) / cost)])
        # Rounded once: the line and the figures beside it (--json) say the same.
        ratio, step = round(float(verify[best]) / t1, 3), round(inputs.pass_cost / t1, 4)
        acceptance, speed = round(acceptance, 4), round(speed, 3)
        verify_text = f"verify of {best + 1} costs {ratio:.1f}× one token here"
        step_text = (f", a {'block' if inputs.c_pass is not None else 'draft step'} {step:.2f}×"
                     if step >= FREE_LOOK else "")
        if cause == "hopeless":
            text = f"{verify_text}{step_text}: even a sure draft would run at {speed:.2f}×"
        elif speed > 1.0:
            # What it knows now says drafting pays: the plain rounds came before it knew (a draft model
            # starts from its confidence at face value, and shadows teach it what that is worth).
            text = (f"{plain} of {rounds} rounds plain while auto measured the costs and learned the draft's "
                    f"acceptance (now {100 * acceptance:.0f} %, verify of {best + 1} at {ratio:.1f}× one "
                    f"token: drafting runs at {speed:.2f}×)")
        else:
            text = (f"{verify_text}{step_text}; acceptance {100 * acceptance:.0f} %: drafting would run at "
                    f"{speed:.2f}×")
        per_position = self._watch_seconds(source)
        if source in self.rests and per_position is not None:
            costs = self.costs
            parts = [name for name, cost in (("its catch-up", costs.catch_up_seconds_per_position(source)),
                                             ("its features", costs.watch_seconds_per_token(source))) if cost]
            what = " and ".join(parts) or "its catch-up"
            share = 100 * per_position / t1
            text += f"; watching it would cost {share:.0f} % of a token ({what}), so it rests"
        return Holdback(cause, text, plain, rounds, best + 1, ratio, step, acceptance, speed)
