"""The engine's one question each round, "what do we draft?", and the one report it gives back.

A `Proposer` puts a drafter and a draft-length policy behind that interface. Everything adaptive
lives here or in the policy: how far each round drafts, the gate that stops a drafter on doubt, held
positions (where a gate stopped, scored when the target gets there anyway; a gate that holds position
0 makes a shadow, so the policy learns when drafting pays again), calibration, and what drafting
cost. The engine sees a `Draft` and reports a `RoundResult`; it never learns what a shadow is.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

try:
    import resource
except ImportError:  # Windows
    resource = None

from specli.costs import CostModel
from specli.drafters.base import Draft, Drafter
from specli.events import Holdback
from specli.policy import AutoK, DraftPolicy, FixedK, Learned, RoundReport
from specli.sampling import Sampler
from specli.settings import AUTO
from specli.verify import Verdict, acceptance_of


@dataclass
class RoundResult:
    """What became of a draft: the committed context after the round, the target's verdict, and what
    drafting and verifying took."""

    context: list[int]
    draft: Draft
    verdict: Verdict
    draft_seconds: float
    verify_seconds: float
    padding: int = 0  # rows verified past the draft (`Proposer.batch_size`), rolled back


class Proposer:
    """Plain decoding: never drafts. The base of the drafting proposer, and the engine's proposer
    when there is no drafter."""

    name = "plain"

    def prepare(self) -> None:
        """A generation is about to decode its prompt (what a drafter reads of the target's decodes
        must be switched on or off before it)."""

    def begin(self, context: list[int], sampler: Sampler) -> None:
        """A generation starts over `context` (the prompt; its last token is pending)."""

    def propose(self, context: list[int], limit: int, left: int | None = None) -> Draft:
        """Tokens to verify after `context` this round: at most `limit` (what fits the output, the
        context and the target's rollback); `left`: tokens the generation can still emit."""
        return Draft.empty(self.name)

    def batch_size(self, m: int, m_max: int) -> int:
        """The batch to verify this round's m tokens with (at most m_max): m, or a larger one that
        costs less on this machine; the rows past the draft are ignored."""
        return m

    def observe(self, result: RoundResult) -> None:
        """The round is committed: learn from it."""

    def holdback(self) -> Holdback | None:
        """Why the generation drafted little or nothing, when the policy held back (the DoneEvent's)."""
        return None

    @property
    def decode_seconds(self) -> float:
        """Seconds the drafter spent inside llama_decode, over its lifetime."""
        return 0.0


def _cpu_seconds() -> float:
    """The CPU seconds this process has used, all threads: getrusage's, which reads the same sums as
    time.process_time() (shares within 0.003 over 0.7-25 ms decodes) at ~11 us against ~27 while
    llama.cpp's threads run (2-core VM, 2026-11-28); process_time where there is no getrusage."""
    if resource is None:
        return time.process_time()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# A span shorter than this is not judged for its CPU share: Python's own work around a sub-millisecond
# decode (tiny models) is most of it, and runs on one thread.
JUDGED_SPAN = 0.002


class CpuShare:
    """The CPU seconds this process used over the wall seconds of a span: about the threads it runs
    when it has the cores to itself, less when other work takes them (llama.cpp's threads then also
    wait at each barrier for one the OS has put aside, so the decode slows far more than its share
    falls)."""

    def __init__(self) -> None:
        self._start: tuple[float, float | None] | None = None
        self._last_wall: float | None = None  # the last span's wall seconds
        self.share: float | None = None  # a `with` block's, once it has ended

    def __enter__(self) -> CpuShare:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.share = self.stop()

    def start(self) -> None:
        # The process's CPU time costs ~11 us to read while llama.cpp's threads run (the kernel sums
        # them; 2-core VM, 2026-11-28): a span after one too short to judge (a fast token's verify)
        # is timed on the wall clock alone.
        last = self._last_wall
        cpu = _cpu_seconds() if last is None or last >= JUDGED_SPAN / 2 else None
        self._start = (time.perf_counter(), cpu)

    def stop(self) -> float | None:
        """The share since `start` (None: not started, or too short to judge)."""
        if self._start is None:
            return None
        wall, cpu_start = time.perf_counter() - self._start[0], self._start[1]
        self._start = None
        self._last_wall = wall
        if cpu_start is None or wall < JUDGED_SPAN:
            return None
        return (_cpu_seconds() - cpu_start) / wall


class DraftingProposer(Proposer):
    """A drafter and a policy: each round the policy decides how far to draft and gives a gate, the
    drafter drafts, and the round's outcome goes back to the policy as one RoundReport."""

    def __init__(self, drafter: Drafter, policy: DraftPolicy) -> None:
        self.drafter = drafter
        self.policy = policy
        self.name = drafter.name
        self._same_as_plain = False
        self._source: str | None = None
        self._verify_share = CpuShare()  # from `batch_size`, just before the verify, to `observe`
        self._block = {s.name: s.block for s in drafter.sources}
        self._resting: bool | None = None  # what the drafter was last told (`_rest`)
        self._asked = drafter.sources[0].name  # the source the policy was last asked about
        self._drafter_seconds = 0.0  # the drafter's own call this round (`propose`)

    def prepare(self) -> None:
        self._rest()

    def _rest(self) -> None:
        """Tell the drafter when the policy will ask none of its sources again this generation (and
        when it may again: a later generation's policy wakes it)."""
        resting = self.policy.resting() >= self._block.keys()
        if resting != self._resting:
            self.drafter.set_resting(resting)
            self._resting = resting

    def begin(self, context: list[int], sampler: Sampler) -> None:
        self._same_as_plain = sampler.same_as_plain
        self.drafter.begin(context, sampler)

    def propose(self, context: list[int], limit: int, left: int | None = None) -> Draft:
        drafter = self.drafter
        if self._resting:
            # Every source rests for the rest of this generation: nothing to ask, and a plain round's
            # report (`observe_plain`; a fast target's token leaves a few microseconds).
            self._source = None
            return Draft.empty(drafter.name)
        source = self._asked = drafter.next_source(context)
        decision = self.policy.decide(source, limit, left, position=len(context) - 1)
        # At k = 0 with a look, the gate holds position 0: the drafter proposes nothing, and what it
        # would have proposed there is scored against the target's row (a shadow).
        self._source = source if decision.k or decision.look else None
        if self._source is None:
            return Draft.empty(drafter.name)
        # A block drafter's look decodes its whole block (held): what a pass costs is what it measures.
        k = decision.k or self._block.get(source, 0) or 1
        gate = self.policy.gate(source, decision)
        started = time.perf_counter()
        draft = drafter.draft(context, k, gate)
        self._drafter_seconds = time.perf_counter() - started - (gate.pricing_seconds if gate else 0.0)
        return draft

    def batch_size(self, m: int, m_max: int) -> int:
        size = m if self._resting else self.policy.batch_size(m, m_max)  # a plain round's one token
        self._verify_share.start()
        return size

    def observe(self, result: RoundResult) -> None:
        share = self._verify_share.stop()
        self.drafter.accept(result.context)
        draft, verdict = result.draft, result.verdict
        if self._source is None:  # the drafter was asked nothing: a plain round
            position = len(result.context) - len(verdict.tokens) - 1
            self.policy.observe_plain(self._asked, result.draft_seconds, result.verify_seconds, position,
                                      share, bool(self._resting))
            if not self._resting:
                self._rest()  # a source that rests stays so until the generation ends
            return
        k, held = len(draft.tokens), draft.held
        scored = None
        if held is not None and verdict.n_accepted == k:
            # The target's row at the position the gate held is here anyway (the bonus row, or the
            # only row of a plain round): score what the draft would have proposed there.
            scored = (held.confidence, acceptance_of(verdict, k, held.token, held.probs, self._same_as_plain))
        first = draft.confidence[0] if k and draft.confidence else (held.confidence if held else None)
        self.policy.observe(RoundReport(
            source=self._source,
            drafted=k,
            accepted=verdict.n_accepted,
            # A catch-up after plain rounds is a debt of those rounds, not this draft's cost; the
            # first position goes with it when the catch-up decode also evaluated it. The policy's
            # own pricing before the drafter was asked is neither: priced into a draft step, on a
            # fast token it made a cheap drafter (n-gram lookup) look dear enough to be priced every
            # round, which made its steps look dearer still.
            draft_seconds=self._drafter_seconds - draft.catch_up_seconds,
            deciding_seconds=max(0.0, result.draft_seconds - self._drafter_seconds),
            catch_up_seconds=draft.catch_up_seconds,
            verify_seconds=result.verify_seconds,
            # A block drafter's pass is one step, however many of its positions were kept or held.
            positions=(int(k > 0 or held is not None) if self._block.get(self._source or "") else
                       k + (held is not None) - draft.first_in_catch_up),
            confidence=draft.confidence,
            first_confidence=first,
            held=scored,
            padding=result.padding,
            position=len(result.context) - len(verdict.tokens) - 1,
            cpu_share=share,
        ))
        self._rest()

    def holdback(self) -> Holdback | None:
        return self.policy.holdback()

    @property
    def decode_seconds(self) -> float:
        return self.drafter.decode_seconds


def make_proposer(
    drafter: Drafter | None, draft_max: int | str, costs: CostModel, learned: Learned
) -> Proposer:
    """The proposer for one generation: plain without a drafter; a fixed k; or auto, which learns with
    the engine's `costs` and `learned` (kept across generations)."""
    if drafter is None:
        return Proposer()
    if draft_max == AUTO:
        of_text = frozenset(s.name for s in drafter.sources if s.confidence_of_text)
        blocks = {s.name: s.block for s in drafter.sources if s.block}
        return DraftingProposer(drafter, AutoK(costs, learned, text_sources=of_text, block_sources=blocks))
    return DraftingProposer(drafter, FixedK(int(draft_max)))
