"""What a round costs and what it yields: the one model that `-k auto`, the stats panel and `specli
bench` all use, so the figure a user reads explains the k that was chosen.

Acceptance comes in two rates: a1, that a round's first draft is accepted, and a2, that a later one
is, given the one before it was. Acceptance comes in runs (once a draft is on track, a copy or a
passage it knows, it tends to stay there), so a2 > a1 is common, and a single alpha fitted to both
would make long drafts look worse than they are. A round of k drafts then yields

    E(k) = 1 + a1 (1 - a2^k) / (1 - a2)        (Leviathan et al.'s (1 - a^(k+1)) / (1 - a) at a1 = a2)

tokens for k c_d + T_v(k + 1) seconds: c_d a draft step, T_v(m) the target's decode of m tokens.
T_v is measured per batch size; `verify_curve` is the one rule for the sizes not measured. Each row
of a batch also attends to the tokens already cached, so T_v grows with the cache's length: each
size's samples are brought to the length at hand with what a cached token costs that size
(`attention_slopes`) before their median is taken.

Tunings: every constant below, its value, what it does and the measurement behind it are in
docs/tuning.md; their history is in lab/history.md.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

# With one batched size measured, the extra cost per token assumed beyond it, as a share of T_v(1):
# optimistic (GPUs are nearly flat), so that auto tries larger batches and measures them.
OPTIMISTIC_SLOPE = 0.05
# With only T_v(1) measured, the extra cost of each further token in a batch, as a share of T_v(1),
# until a batch is measured. On a GPU a batch costs nearly what one token does; on a CPU each token of
# a batch costs about half of one alone or more, and GPU-flat batches would make a draft as dear as
# the target look worth trying. A sure, cheap draft still pays at 0.5, so auto drafts and measures
# the real curve.
FIRST_STEP_GPU = OPTIMISTIC_SLOPE
FIRST_STEP_CPU = 0.5
# A larger batch is verified in place of a smaller one only when its measured cost is below this share
# of the smaller one's: a few percent is noise, and the extra rows are not free on every device.
PAD_MARGIN = 0.9
# Attention makes a batch dearer with each token already in the cache. What a cached token costs a
# batch size is fitted from pairs of its samples taken at least MIN_SPREAD tokens apart, once there
# are MIN_PAIRS such pairs (`attention_slopes`). The curve is predicted again when the cache has
# grown or shrunk by POSITION_STEP tokens since it last was.
MIN_SPREAD = 32
MIN_PAIRS = 6
POSITION_STEP = 16
# A verify sample this many times dearer than one of the same size taken with at least as many cached
# tokens was slowed by something else on the machine (load only slows a decode down). Kept, such
# samples would price a size out for good: auto would stop verifying it, so nothing would replace them.
BURST = 1.5
# Warm draft steps (or looks) this process must have timed before their median stops auto looking at
# a drafter for good: the first steps of each new shape (a GPU's graphs built) cost many warm ones,
# and one of them taken for the step's cost could give the hopeless verdict to a cheap draft.
SETTLED_SAMPLES = 3
# Or one warm step within this factor of the cost an earlier process kept (its median): the record is
# confirmed by this machine as it is now (a busy spell's record, or a cold step, disagrees by more).
CONFIRMS = 1.5
# A decode whose process got less CPU time than this share of what it could get (CPU time over wall
# time) ran while other work took its cores. Against the best share this process has had
# (`CostModel.observe_verify`), it prices a batch size only where no decode with the full share has,
# and never above what those predict; against its threads' share of the cores, it is not written for
# the next process (specli.costcache). Starved, llama.cpp's threads spin at each barrier for one the
# OS has put aside, and a decode slows far more than its share falls; kept, such a spell's costs would
# stop later processes from drafting.
STARVED = 0.7
# A restored (carried) batch size that no process has measured again is forgotten after this many
# processes have carried it.
CARRIED_AGE = 4
# Recent verify samples kept per batch size: their median resists bursts of machine load.
WINDOW = 9
# The verify curve is predicted again every this many samples (and whenever a new size is measured):
# a round on a tiny model takes well under a millisecond, and the curve is read every round.
REFRESH = 8
# `specli bench`'s measured curve (`prime_verify`) counts as this many of a size's WINDOW samples: the
# process's own decodes of that size soon outvote it.
PRIMED_WEIGHT = 3
# A size's median brought to another cache length never falls below this share of its cheapest sample:
# the slope it is brought there with is an estimate.
MEDIAN_FLOOR = 0.1
# Per observation, the decayed mean of a draft step's (or a look's) cost forgets at this rate, until
# SETTLED_SAMPLES warm ones give a median.
DRAFT_DECAY = 0.9


def expected_tokens(a1: float, a2: float, k: int) -> float:
    """E[tokens a round of k drafts emits]: the accepted drafts, plus the target's own token."""
    if k <= 0:
        return 1.0
    if a2 >= 1.0:
        return 1.0 + a1 * k
    return 1.0 + a1 * (1.0 - a2**k) / (1.0 - a2)


def run_gain(first: float | np.ndarray, f: float | np.ndarray, n: np.ndarray) -> np.ndarray:
    """E[accepted] of n more drafts when the first passes with probability `first` and each later one
    with `f` given the one before passed: first (1 - f^n) / (1 - f) (each n of the array; `first` and
    `f` may be arrays that broadcast against it, one gain per element)."""
    below = np.asarray(f) < 1.0
    return np.where(below, first * (1.0 - f**n) / np.where(below, 1.0 - f, 1.0), first * n)


def run_cost(verify: np.ndarray, i: int, n: np.ndarray, c_draft: float) -> np.ndarray:
    """Seconds that drafting positions i .. i+n-1 adds to a round that drafts up to i - 1, beyond the
    draft step that shows position i (whoever decides to take a step prices it: `decide` the first,
    the gate's `look` each later one): the larger verify batch, T_v(i+n+1) - T_v(i+1), and the n - 1
    steps that show positions i+1 .. i+n-1 (`verify`: T_v(1..), index m - 1). The step after the
    last drafted position is not taken unless it is worth it, and not priced here: each step is
    priced once, by whoever decides to take it (priced twice, auto drafts too short)."""
    return verify[i + n] - verify[i] + (n - 1) * c_draft


def best_net_gain(first: float | np.ndarray, f: float | np.ndarray, verify: np.ndarray, i: int, n_max: int,
                  c_draft: float, rate: float) -> float | np.ndarray:
    """The most that drafting on from position i gains, over lengths n = 1 .. n_max: E[accepted]
    (`run_gain`) less its cost (`run_cost`) in tokens at `rate`. > 0: drafting position i pays.
    `first` and `f` may be arrays of the same shape: one best gain for each element."""
    n_max = min(n_max, len(verify) - 1 - i)
    if n_max < 1:
        return np.full(np.shape(first), -math.inf) if np.ndim(first) else -math.inf
    n = np.arange(1, n_max + 1)
    net = run_gain(np.asarray(first)[..., None], np.asarray(f)[..., None], n) - rate * run_cost(
        verify, i, n, c_draft)
    best = net.max(axis=-1)
    return float(best) if best.ndim == 0 else best


def best_rate(acceptance: float, verify: np.ndarray, c_draft: float, *, c_pass: float | None = None,
              n_max: int | None = None) -> float:
    """The most tokens per second a round can be expected to yield when each draft passes with
    `acceptance` given the one before passed: the best of 1 + run_gain over T_v(n+1) + drafting n, n = 0
    (plain decoding) up to len(verify) - 1 (or n_max). Drafting n costs n c_d, or for a block drafter
    one pass c_pass and c_d (0) for each further position."""
    n = np.arange(min(len(verify), (n_max or len(verify)) + 1))
    drafting = np.where(n > 0, (c_draft if c_pass is None else c_pass) + (n - 1) * c_draft, 0.0)
    return float(((1.0 + run_gain(acceptance, acceptance, n)) / (verify[n] + drafting)).max())


def later_examined(k: int, accepted: int) -> int:
    """Drafts after the first that the target judged in a round of k with `accepted` accepted: the
    accepted ones after the first, and the first rejected one if it was not the first draft."""
    if accepted == 0:
        return 0
    return accepted - 1 + (1 if accepted < k else 0)


def verify_curve(
    known: Mapping[int, float], m_max: int, first_step: float = OPTIMISTIC_SLOPE
) -> list[float] | None:
    """T_v(m) for m = 1..m_max (index m - 1) from measured seconds by batch size; None without T_v(1).

    Measured sizes are made non-decreasing in m from above: a size measured dearer than a larger one
    takes the larger one's cost (a batch never costs less than a smaller batch, so the dearer figure
    is the outlier: a cold first decode that built the graph, or a burst of load; taken as it is, a
    slow T_v(1) makes plain decoding look slow and auto would draft on and never time it again);
    sizes between two measured ones are interpolated;
    sizes above the largest measured one are extrapolated with the smallest per-token slope measured
    between batched sizes (or an optimistic default); with no batched size measured, each token
    beyond the first adds `first_step` x T_v(1) (what the device makes likely). On CPUs T_v is a
    staircase (m = 2 can cost twice m = 1 while m = 3..6 cost little more than m = 2): a straight
    line through the first two points would never let auto find that out.
    """
    if 1 not in known:
        return None
    sizes = sorted(known)
    mono: dict[int, float] = {}
    running = float("inf")
    for m in reversed(sizes):
        running = mono[m] = min(known[m], running)
    batched = [m for m in sizes if m >= 2]
    slopes = [(mono[b] - mono[a]) / (b - a) for a, b in zip(batched, batched[1:], strict=False)]
    slope = min(slopes) if slopes else OPTIMISTIC_SLOPE * mono[1]
    out: list[float] = []
    nearest = 0  # sizes[nearest]: the largest measured size <= m (m rises, so it only moves up)
    for m in range(1, m_max + 1):
        while nearest + 1 < len(sizes) and sizes[nearest + 1] <= m:
            nearest += 1
        below = sizes[nearest]
        if below == m:
            out.append(mono[m])
        elif nearest + 1 < len(sizes):
            a = sizes[nearest + 1]
            out.append(mono[below] + (mono[a] - mono[below]) * (m - below) / (a - below))
        elif below == 1:
            # No batch measured yet: what a batch usually costs on this kind of device.
            out.append(mono[1] * (1 + first_step * (m - 1)))
        else:
            out.append(mono[below] + slope * (m - below))
    return out


def predicted_speedup(
    verify: Sequence[float],
    a1: float | None,
    a2: float | None,
    draft_seconds_per_token: float | None,
    k_per_round: Sequence[int],
) -> float | None:
    """Predicted speed over plain decoding of the rounds `k_per_round`:
    sum E(k) * T_v(1) / sum (k c_d + T_v(k + 1)), with `verify` the curve T_v(1..) in seconds (long
    enough for every k + 1). None without rounds, or with drafts but no acceptance or draft cost."""
    if not k_per_round:
        return None
    expected = cost = 0.0
    for k in k_per_round:
        if k == 0:
            expected += 1.0
            cost += verify[0]
            continue
        if a1 is None or draft_seconds_per_token is None:
            return None
        expected += expected_tokens(a1, a1 if a2 is None else a2, k)
        cost += k * draft_seconds_per_token + verify[k]
    return expected * verify[0] / cost if cost > 0 else None


@dataclass
class CostModel:
    """Verify seconds by batch size and draft seconds per token by source, as measured so far on this
    machine with these models (it outlives a generation; acceptance, which describes the text, does
    not live here)."""

    window: int = WINDOW  # recent samples per batch size
    first_step: float = FIRST_STEP_CPU  # verify_curve's assumption until a batch is measured
    # Per batch size, recent (seconds, position) samples this process measured with its full share of
    # the CPU: position, the tokens in the cache before it.
    verify: dict[int, deque[tuple[float, int]]] = field(default_factory=dict)
    # Per batch size, samples an earlier process measured (`restore`) and how many processes have
    # carried them since: they price a size until this process measures it, never above what this
    # process's own samples predict for it (`_predict`), and yield to its first own sample.
    carried: dict[int, deque[tuple[float, int]]] = field(default_factory=dict)
    carried_age: dict[int, int] = field(default_factory=dict)
    # Per batch size, this process's samples taken while it did not get its share of the CPU (STARVED):
    # used as carried ones are, and never kept for the next process.
    starved: dict[int, deque[tuple[float, int]]] = field(default_factory=dict)
    draft: dict[str, list[float]] = field(default_factory=dict)  # source -> [seconds, tokens], decayed
    # source -> [seconds, looks], decayed: a round that asked the drafter and drafted nothing (a shadow)
    look: dict[str, list[float]] = field(default_factory=dict)
    # source -> [seconds, positions], decayed: catching a drafter up on the positions plain rounds
    # committed since it last read the context (what watching it costs whatever the looks' spacing)
    catch_up: dict[str, list[float]] = field(default_factory=dict)
    # source -> seconds a plain token costs more while the source is watched (a trained head's features,
    # which the target hands out at every decode), as its drafter measured at load (Drafter.watch_costs)
    watch: dict[str, float] = field(default_factory=dict)

    # The curve is recomputed when a new size is measured or every `refresh` samples (REFRESH).
    refresh: int = REFRESH
    _curve: list[float] | None = field(default=None, repr=False)  # predicted at _position
    _curve_array: tuple[list[float], np.ndarray] | None = field(default=None, repr=False)  # verify_array's
    _draft_seen: set[str] = field(default_factory=set, repr=False)
    _look_seen: set[str] = field(default_factory=set, repr=False)
    _warmed: set[str] = field(default_factory=set, repr=False)  # sources whose drafter ran a pass at load
    # This process's recent per-unit draft and look costs by source (the first of each left out): their
    # median is the cost once there are SETTLED_SAMPLES of them, the decayed means above until then.
    _draft_recent: dict[str, deque[float]] = field(default_factory=dict, repr=False)
    _draft_restored: dict[str, float] = field(default_factory=dict, repr=False)  # per unit, from `restore`
    _look_recent: dict[str, deque[float]] = field(default_factory=dict, repr=False)
    _catch_up_seen: set[str] = field(default_factory=set, repr=False)
    _catch_up_recent: dict[str, deque[float]] = field(default_factory=dict, repr=False)
    _verify_largest: int = field(default=0, repr=False)  # the largest batch decoded in this process
    # The CPU share (CPU seconds over wall seconds) of each sample in `verify`, None where not judged;
    # and the best share a judged decode of this process has had.
    _verify_share: dict[int, deque[float | None]] = field(default_factory=dict, repr=False)
    best_share: float = field(default=0.0, repr=False)
    # Seconds a cached token adds to a decode, per batch size (`attention_slopes`), refitted with the
    # curve; and each size's median predicted at _position (cheapest_batch runs every round).
    slopes: dict[int, float] = field(default_factory=dict, repr=False)
    _medians: dict[int, float] = field(default_factory=dict, repr=False)
    _position: int = 0
    _stale: int = 0

    @staticmethod
    def for_device(offloaded: bool) -> CostModel:
        """A cost model whose assumptions suit where the target runs (offloaded: on a GPU)."""
        return CostModel(first_step=FIRST_STEP_GPU if offloaded else FIRST_STEP_CPU)

    def to_record(self, min_share: float | None = None) -> dict[str, dict]:
        """What a later process over the same models can start from (`restore`; specli.costcache keeps
        it on disk): the verify samples by batch size, and the decayed draft, look and catch-up costs
        by source.
        Samples with a CPU share below `min_share` are left out (the machine was busy: they describe
        other work's load, not this machine); sizes this process did not measure keep their carried
        samples, one process older, until CARRIED_AGE."""
        verify: dict[str, list[list[float]]] = {}
        age: dict[str, int] = {}
        for m, samples in self.verify.items():
            shares = self._verify_share.get(m) or [None] * len(samples)
            kept = [list(sample) for sample, share in zip(samples, shares, strict=True)
                    if share is None or min_share is None or share >= min_share]
            if kept:
                verify[str(m)] = kept
        for m, samples in self.carried.items():
            older = self.carried_age.get(m, 0) + 1
            if str(m) not in verify and older <= CARRIED_AGE:
                verify[str(m)], age[str(m)] = [list(sample) for sample in samples], older
        return {
            "verify": verify,
            "verify_age": age,
            "draft": {source: _robust_slot(slot, self._draft_recent.get(source))
                      for source, slot in self.draft.items()},
            "look": {source: _robust_slot(slot, self._look_recent.get(source))
                     for source, slot in self.look.items()},
            "catch_up": {source: _robust_slot(slot, self._catch_up_recent.get(source))
                         for source, slot in self.catch_up.items()},
        }

    def restore(self, record: Mapping) -> None:
        """Start from an earlier process's `to_record`: its verify samples are carried (they price a
        size until this process measures it, and never above what this process's own samples
        predict), its draft and look costs price steps until this process has timed SETTLED_SAMPLES
        of its own. This process's decodes larger than any before (and its first draft and look) are
        still left out as cold. ValueError if it is malformed."""
        verify = {int(m): [_sample(s) for s in samples][-self.window:]
                  for m, samples in record.get("verify", {}).items()}
        if any(m < 1 or not samples for m, samples in verify.items()):
            raise ValueError("a batch size below 1 or without samples")
        ages = {int(m): int(a) for m, a in record.get("verify_age", {}).items()}
        if any(a < 0 for a in ages.values()):
            raise ValueError("a negative age")
        slots = {name: {source: _slot(slot) for source, slot in record.get(name, {}).items()}
                 for name in ("draft", "look", "catch_up")}
        for m, samples in verify.items():
            if m not in self.verify:
                self.carried[m] = deque(samples, maxlen=self.window)
                self.carried_age[m] = ages.get(m, 0)
        self.draft.update(slots["draft"])
        self._draft_restored.update({source: cost for source, slot in slots["draft"].items()
                                     if (cost := _per_unit(slot)) is not None and cost > 0})
        self.look.update(slots["look"])
        self.catch_up.update(slots["catch_up"])
        self._refit(self._position)

    def prime_verify(self, seconds: Mapping[int, float], position: int = 0,
                     weight: int = PRIMED_WEIGHT) -> None:
        """Take T_v(m) measured elsewhere (`specli bench`'s curve, after `position` cached tokens) as
        `weight` samples of each size, in place of what was known of those sizes."""
        for m, s in seconds.items():
            self.verify[m] = deque([(_positive(s), position)] * weight, maxlen=self.window)
            self._verify_share[m] = deque([None] * weight, maxlen=self.window)
            self._forget_other_samples(m)
        self._refit(position)

    def _forget_other_samples(self, m: int) -> None:
        """This process has measured size m with its full share: carried and starved samples yield."""
        self.carried.pop(m, None)
        self.carried_age.pop(m, None)
        self.starved.pop(m, None)

    def _refit(self, position: int) -> None:
        """Fit what a cached token costs each size, then each size's median at `position`."""
        self.slopes = attention_slopes({m: unhurried(samples) for m, samples in self._unstarved().items()})
        self._stale = 0
        self._predict(position)

    def _unstarved(self) -> dict[int, Sequence[tuple[float, int]]]:
        """Each size's own samples, or its carried ones where it has none."""
        return {**self.carried, **self.verify}

    def _predict(self, position: int) -> None:
        """Each size's median with its samples brought to `position` cached tokens (never below a
        tenth of its cheapest sample: a slope is an estimate), bursts of load left out (`unhurried`),
        and the curve to be made from them. A size this process has not measured with its full share
        is priced by its carried and starved samples, but once this process has measured any size, at
        most at what its own medians predict for it (`verify_curve`, as a process with no cost file
        would): a record or a burst from a busy spell cannot price a size out for good."""

        def median(samples: Sequence[tuple[float, int]], m: int) -> float:
            kept = unhurried(samples)
            return max(MEDIAN_FLOOR * min(s for s, _ in kept),
                       statistics.median(s + self.slopes.get(m, 0.0) * (position - p) for s, p in kept))

        own = {m: median(samples, m) for m, samples in self.verify.items()}
        others = {m: median([*self.carried.get(m, ()), *self.starved.get(m, ())], m)
                  for m in self.carried.keys() | self.starved.keys() if m not in own}
        if own and others:
            anchor = own if 1 in own or 1 not in others else {**own, 1: others[1]}
            fresh = verify_curve(anchor, max(others), self.first_step)
            if fresh is not None:
                others = {m: min(seconds, fresh[m - 1]) if m > 1 else seconds
                          for m, seconds in others.items()}
        self._medians = {**others, **own}
        self._position, self._curve = position, None

    def _at(self, position: int) -> None:
        if self._stale >= self.refresh:
            self._refit(position)
        elif abs(position - self._position) >= POSITION_STEP:
            self._predict(position)

    def cheapest_batch(self, m: int, m_max: int, position: int = 0) -> int:
        """The batch size to verify m tokens with: m, or a larger size up to m_max measured to cost
        clearly less (PAD_MARGIN). CPU kernels change with the batch: on a 2-core Xeon a 150k-vocabulary
        Q8_0 target decodes 64 tokens in 399 ms and 63 in 643 (ggml switches its matrix kernel), so
        a draft of 40 is verified faster with 23 rows of padding, which are rolled back with the
        rejected drafts. This is what makes `verify_curve`'s rule (a size costs no more than any
        larger one) true of the batches actually run. m itself when unmeasured around m. Priced after
        `position` cached tokens (every row of a batch attends to them)."""
        if m < 2 or m_max <= m:
            return m
        self._at(position)
        medians = self._medians
        larger = [size for size in medians if m < size <= m_max]
        if not larger:
            return m
        below = [size for size in medians if size <= m]
        above = [size for size in medians if size >= m]
        if m in medians:
            own = medians[m]
        elif below and above:
            a, b = max(below), min(above)
            own = medians[a] + (medians[b] - medians[a]) * (m - a) / (b - a)
        else:
            return m
        best = min(larger, key=lambda size: (medians[size], size))
        return best if medians[best] < PAD_MARGIN * own else m

    def observe_verify(self, m: int, seconds: float, position: int = 0, share: float | None = None) -> None:
        """A decode of m tokens took `seconds` after `position` tokens in the cache; `share`: the CPU
        seconds the process used meanwhile over `seconds` (None: not judged)."""
        if m > self._verify_largest:
            # A batch larger than any before grows llama.cpp's compute buffers: 15x a warm decode on
            # a tiny model (65 tokens: 52 ms, then 3.4), +14 % on Gemma 3 270M, and a cold T_v(1)
            # makes plain decoding look slow. A new smaller size only plans its graph again (up to
            # 1.5x on a tiny model, nothing measurable on real ones), and is kept: were it left out,
            # sizes a process runs once each (n-gram copies of varying length) would never be known.
            self._verify_largest = m
            return
        if share is not None:
            self.best_share = max(self.best_share, share)
            if share < STARVED * self.best_share:
                new = self._append(self.starved, m, (seconds, position)) and m not in self.verify
                self._stale += 1
                if new:
                    self._refit(self._position)
                return
        new = self._append(self.verify, m, (seconds, position))
        self._append(self._verify_share, m, share)
        self._stale += 1
        if new:
            self._forget_other_samples(m)
            self._refit(self._position)

    def _append(self, windows: dict, m: int, sample: object) -> bool:
        """`sample` into the window of size m, made at its first sample; whether it was (setdefault
        would build a deque every call, and this runs once a token)."""
        window = windows.get(m)
        if window is None:
            windows[m] = deque((sample,), maxlen=self.window)
            return True
        window.append(sample)
        return False

    def observe_draft(self, source: str, tokens: int, seconds: float, decay: float = DRAFT_DECAY) -> None:
        # A model's first single-token decodes build their graphs: on a small draft that can take
        # 10x a warm step, and a cost that high would stop auto from ever drafting again.
        # A cold step (a new shape: on a GPU a CUDA graph built) may cost many warm ones: medians.
        _observe_warm(self.draft, self._draft_seen, source, seconds, tokens, decay,
                      self._draft_recent.setdefault(source, deque(maxlen=self.window)))

    def warmed(self, source: str) -> None:
        """`source`'s drafter has run a pass of a draft's shape already (Drafter.warm_up): its first
        step and look are timed as warm ones."""
        self._draft_seen.add(source)
        self._look_seen.add(source)
        self._warmed.add(source)

    def warmed_up(self, source: str) -> bool:
        return source in self._warmed

    def observe_look(self, source: str, seconds: float, decay: float = DRAFT_DECAY) -> None:
        _observe_warm(self.look, self._look_seen, source, seconds, 1.0, decay,  # the first: cold, as above
                      self._look_recent.setdefault(source, deque(maxlen=self.window)))

    def observe_catch_up(self, source: str, positions: int, seconds: float,
                         decay: float = DRAFT_DECAY) -> None:
        _observe_warm(self.catch_up, self._catch_up_seen, source, seconds, positions, decay,
                      self._catch_up_recent.setdefault(source, deque(maxlen=self.window)))

    def timed_catch_up(self, source: str, positions: int, seconds: float) -> None:
        """A catch-up of `positions` that `source`'s drafter timed at load on a warm pass
        (Drafter.catch_up_costs, its fixed cost taken off): a sample from the first, so that auto can
        weigh watching the source before a shadow in a generation has paid for one."""
        self._catch_up_seen.add(source)
        self.observe_catch_up(source, positions, seconds)

    def catch_up_seconds_per_position(self, source: str) -> float | None:
        """What catching `source` up costs per committed position it had not read (None: not timed)."""
        return _cost(self.catch_up.get(source), self._catch_up_recent.get(source))

    def observe_watch(self, source: str, seconds: float) -> None:
        self.watch[source] = max(0.0, seconds)

    def watch_seconds_per_token(self, source: str) -> float | None:
        """What watching `source` adds to each plain token besides its catch-up (None: not measured)."""
        return self.watch.get(source)

    def look_seconds(self, source: str) -> float | None:
        """What a look that drafts nothing costs, catching up included (shadows are rationed by it)."""
        return _cost(self.look.get(source), self._look_recent.get(source))

    def draft_seconds_per_token(self, source: str | None) -> float | None:
        return _cost(self.draft.get(source or ""), self._draft_recent.get(source or ""))

    def draft_settled(self, source: str) -> bool:
        """Whether this process has timed enough warm draft steps of `source` (SETTLED_SAMPLES) for a
        verdict that stops looking at it: one or two may still be cold, and a record restored from
        another process may describe another load of the machine; or one warm step that confirms
        the restored record (within CONFIRMS of it: a block drafter's look costs more than a target
        token, and each process would pay SETTLED_SAMPLES + 1 of them before any verdict)."""
        recent = self._draft_recent.get(source)
        if _settled(recent):
            return True
        restored = self._draft_restored.get(source)
        return (bool(recent) and restored is not None
                and restored / CONFIRMS <= recent[-1] <= restored * CONFIRMS)

    def verify_seconds(self, m_max: int, position: int = 0) -> list[float] | None:
        """Predicted T_v(m) for m = 1..m_max after `position` cached tokens, from the medians measured
        so far, each brought to that length (`verify_curve`)."""
        if 1 not in self.verify and 1 not in self.carried and 1 not in self.starved:
            return None
        self._at(position)
        if self._curve is None or len(self._curve) < m_max:
            self._curve = verify_curve(self._medians, m_max, self.first_step)
        return self._curve[:m_max]

    def verify_array(self, m_max: int, position: int = 0) -> np.ndarray | None:
        """verify_seconds as a read-only array, the same object until the curve changes (a priced round
        asks for it twice, and what is derived from it can be kept as long as it is the same)."""
        curve = self.verify_seconds(m_max, position)
        if curve is None:
            return None
        kept = self._curve_array
        if kept is None or kept[0] is not self._curve or len(kept[1]) != m_max:
            kept = self._curve_array = (self._curve, read_only(np.asarray(curve)))
        return kept[1]


def read_only(array: np.ndarray) -> np.ndarray:
    """`array`, made read-only: kept and handed out while what it was derived from is the same."""
    array.flags.writeable = False
    return array


def _observe_warm(table: dict[str, list[float]], seen: set[str], source: str, seconds: float, units: float,
                  decay: float, recent: deque[float]) -> None:
    """Add (seconds, units) to `source`'s decayed [seconds, units] in `table` and its cost per unit to
    `recent`, except its first observation, which is left out as cold (it built llama.cpp's graphs)."""
    if source not in seen:
        seen.add(source)
        return
    slot = table.setdefault(source, [0.0, 0.0])
    slot[0] = decay * slot[0] + seconds
    slot[1] = decay * slot[1] + units
    if units > 0:
        recent.append(seconds / units)


def _settled(recent: deque[float] | None) -> bool:
    return recent is not None and len(recent) >= SETTLED_SAMPLES


def _cost(slot: list[float] | None, recent: deque[float] | None) -> float | None:
    """A draft's or look's cost per unit: the median of this process's recent samples once they are
    SETTLED_SAMPLES, before that the decayed mean (a restored record's with them)."""
    return statistics.median(recent) if _settled(recent) else _per_unit(slot)


def _robust_slot(slot: list[float], recent: deque[float] | None) -> list[float]:
    """A decayed [seconds, units] to keep on disk: with settled samples, their median at the slot's
    weight (a cold outlier of this process is not handed on to the next)."""
    if _settled(recent) and slot[1] > 0:
        return [statistics.median(recent) * slot[1], slot[1]]
    return list(slot)


def attention_slopes(verify: Mapping[int, Sequence[tuple[float, int]]]) -> dict[int, float]:
    """Seconds each cached token adds to a decode, per batch size: for a size with MIN_PAIRS pairs of
    samples MIN_SPREAD tokens apart, the median of their slopes weighted by how far apart they are
    (robust to bursts of load); for the others, interpolated between the nearest fitted sizes below
    and above (scaled down from the smallest above; the largest below's above it, which does not
    guess what a kernel change makes of large batches); none fitted, none. Without it, sizes measured
    on a short prompt look cheap on a long one (figures: docs/tuning.md, MIN_SPREAD)."""
    fitted: dict[int, float] = {}
    for m, samples in verify.items():
        if len(samples) < 2:
            continue
        p = np.array([q for _, q in samples], dtype=float)
        y = np.array([t for t, _ in samples])
        dp, dy = p[:, None] - p[None, :], y[:, None] - y[None, :]
        apart = dp >= MIN_SPREAD
        if int(apart.sum()) < MIN_PAIRS:
            continue
        slope, weight = dy[apart] / dp[apart], dp[apart]
        order = np.argsort(slope)
        cumulative = np.cumsum(weight[order])
        fitted[m] = max(0.0, float(slope[order][np.searchsorted(cumulative, cumulative[-1] / 2)]))
    if not fitted:
        return {}
    sizes = sorted(fitted)
    values = [fitted[m] for m in sizes]

    def unfitted(m: int) -> float:
        # np.interp holds the largest fitted size's slope above it; below the smallest, scale it down.
        return values[0] * m / sizes[0] if m < sizes[0] else float(np.interp(m, sizes, values))

    return {m: fitted[m] if m in fitted else unfitted(m) for m in verify}


def unhurried(samples: Sequence[tuple[float, int]]) -> list[tuple[float, int]]:
    """The (seconds, position) samples of one batch size that no sample taken with at least as many
    cached tokens shows to have been slowed down by a burst of load (BURST times its seconds). A
    longer context is allowed to be dearer by any amount, so no slope is needed."""
    return [(s, p) for s, p in samples if not any(q >= p and s > BURST * t for t, q in samples)]


def _sample(value: object) -> tuple[float, int]:
    """A verify sample (seconds, position), checked."""
    if not isinstance(value, list | tuple) or len(value) != 2:
        raise ValueError(f"not a [seconds, position] pair: {value!r}")
    position = int(value[1])
    if position < 0:
        raise ValueError(f"a position of {position}")
    return _positive(value[0]), position


def _positive(value: object) -> float:
    number = float(value)  # type: ignore[arg-type]
    if not math.isfinite(number) or number <= 0:
        raise ValueError(f"a cost of {value!r} seconds")
    return number


def _slot(slot: object) -> list[float]:
    """A decayed [seconds, units] pair, checked."""
    if not isinstance(slot, list | tuple) or len(slot) != 2:
        raise ValueError(f"not a [seconds, units] pair: {slot!r}")
    return [_positive(slot[0]), _positive(slot[1])]


def _per_unit(slot: list[float] | None) -> float | None:
    return slot[0] / slot[1] if slot and slot[1] > 0 else None
