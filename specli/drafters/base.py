"""The one small interface every drafter shares (like llama.cpp's common_speculative begin/draft/accept).

A new drafter is a new file implementing `Drafter`; the engine does not change.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from specli.llama import GraphFilters, Model
from specli.sampling import Dist, Sampler, Survivors, distribution, greedy_token, mask_banned, top_probability

# A greedy draft row's best ids that cross from llama.cpp's graph: its gate's confidence is their
# softmax's top (llama.cpp's own drafts keep 10).
GREEDY_DRAFT_TOP = 16


def draft_filters(sampler: Sampler, n_vocab: int) -> GraphFilters | None:
    """The filters a drafter's rows get in llama.cpp's graph: where the run filters drafts there
    (`Sampler.drafts_in_graph`), the target's settings (a greedy row: its GREEDY_DRAFT_TOP best ids);
    else None, the whole row crosses."""
    if not sampler.drafts_in_graph:
        return None
    return GraphFilters.of(sampler.params, n_vocab, greedy_top_k=GREEDY_DRAFT_TOP)[0]


class DraftGate(Protocol):
    """The policy's way to stop a round early on a doubtful position."""

    # What the gate spent pricing the round inside the drafter's call: the policy's time, not the
    # drafter's (its steps are priced by what they cost alone).
    pricing_seconds: float

    def __call__(self, position: int, confidence: float) -> bool:
        """Asked before each position is drafted (position in the round, from 0; the drafter's top
        probability there): draft it?"""

    def best_prefix(self, confidences: Sequence[float]) -> int:
        """For a drafter that sees all its positions' confidences before drafting any (n-gram lookup
        costs nothing to look ahead): how many of them to propose."""

    def look(self, position: int) -> bool:
        """Asked before a drafter pays a step (a decode) to learn position's confidence (position >= 1,
        after the one before was drafted): is what it may find worth the step?"""


@dataclass
class HeldPosition:
    """The position where a gate stopped the draft: what would have been proposed there, so that the
    engine can score it against the target's row when the target reaches that position anyway."""

    token: int  # what the draft would have proposed (greedy: its argmax; same-as-plain: its keyed draw)
    probs: Dist | None  # q at that position when sampling (its acceptance is sum min(p, q))
    confidence: float


@dataclass
class DraftStep:
    """One position of a drafter that samples from logits (a draft model, an MTP head)."""

    token: int | None  # None: the draft stops before this position
    q: Dist | None  # the processed distribution the token was drawn from (None when greedy)
    confidence: float | None  # the top probability, when anything looked at it
    held: HeldPosition | None = None  # where a gate stopped: what would have been proposed


def draft_step(
    row: np.ndarray | Survivors,
    i: int,
    position: int,
    sampler: Sampler,
    *,
    width: int,
    p_min: float = 0.0,
    gate: DraftGate | None = None,
) -> DraftStep:
    """Position i of a round from the drafter's logits `row` (masked in place), drawn at absolute
    position `position + i`: a stop under `p_min` or the gate, or the drafted token.

    Confidence is the top probability, known before the token is drawn: a stop that depended on the
    drawn token would bias what gets proposed away from q, and the output away from the target's
    distribution. Survivors: the row as llama.cpp's graph filtered it (banned ids left out there)."""
    params = sampler.params.unbanned  # banned ids are masked in the row first
    if not isinstance(row, Survivors):
        mask_banned(row[None, :], sampler.params.banned)
    q = None if params.greedy else distribution(row, params, width=width)
    top = None  # greedy: the top probability only when something looks at it
    if q is not None or p_min or gate is not None:
        top = q.top() if q is not None else top_probability(row)
        if top < p_min:
            return DraftStep(None, q, top)
        if gate is not None and not gate(i, top):
            # What the draft would have proposed here, for scoring against the target's row.
            guess = (
                greedy_token(row, params.banned)
                if q is None or not sampler.same_as_plain
                else sampler.draft_draw(q, position + i, position)
            )
            return DraftStep(None, q, top, HeldPosition(guess, q, top))
    token = greedy_token(row, params.banned) if q is None else sampler.draft_draw(q, position + i, position)
    return DraftStep(token, q, top)


@dataclass
class Draft:
    """Tokens a drafter proposes for the positions after the committed context.

    probs: the drafter's processed distribution q for each proposed position (over the target's
    vocabulary), or None for a deterministic proposal (a point mass, as n-gram lookup makes).
    confidence: how sure the drafter was of each proposed position (a model's top probability,
    n-gram lookup's lead of the continuation). held: the position a gate stopped at, if one did.
    catch_up_seconds: time spent on committed tokens the drafter had not seen (after plain rounds),
    beyond the usual one or two: a debt of the rounds before, not a cost of this draft's length.
    first_in_catch_up: that work also evaluated the first position (a model's catch-up decode
    yields the first position's row), so the draft's own cost covers one position fewer.
    """

    tokens: list[int]
    probs: list[Dist] | None
    drafter: str
    confidence: list[float] = field(default_factory=list)
    held: HeldPosition | None = None
    catch_up_seconds: float = 0.0
    first_in_catch_up: bool = False

    @staticmethod
    def empty(drafter: str) -> Draft:
        return Draft([], None, drafter)


def draft_positions(
    row: np.ndarray | Survivors,
    next_row: Callable[[int], np.ndarray | Survivors],
    k: int,
    position: int,
    sampler: Sampler,
    *,
    width: int,
    p_min: float,
    gate: DraftGate | None,
    name: str,
    catch_up_seconds: float,
) -> Draft:
    """Up to k positions of a drafter that samples from logits, by `draft_step`: `row` gives position
    0, and `next_row(token)` (the drafter decoding the token it just drafted) each next one. The
    catch-up that produced `row` evaluated position 0 too (`Draft.first_in_catch_up`). The gate may
    stop the round before a step as well as after (`DraftGate.look`): then nothing is held."""
    tokens: list[int] = []
    probs: list[Dist] = []
    confidence: list[float] = []
    held = None
    for i in range(k):
        step = draft_step(row, i, position, sampler, width=width, p_min=p_min, gate=gate)
        held = step.held
        if step.token is None:
            break
        if step.confidence is not None:
            confidence.append(step.confidence)
        if step.q is not None:
            probs.append(step.q)
        tokens.append(step.token)
        if i + 1 < k:
            if gate is not None and not gate.look(i + 1):
                break
            row = next_row(step.token)
    return Draft(tokens, probs or None, name, confidence, held, catch_up_seconds, catch_up_seconds > 0)


@dataclass(frozen=True)
class Source:
    """One kind of proposal a drafter makes, as the policy keys it and front ends show it (its colour is
    the drafter registry's). Every source reports its confidence per position, which auto's gate reads."""

    name: str  # Draft.drafter, TokenEvent.drafter, the policy's key, what front ends print
    # Its confidence is a statistic of the text itself (n-gram counts), so what it is worth changes
    # from one prompt to the next; a draft model's describes the pair of models.
    confidence_of_text: bool = False
    # A block drafter (DFlash, DSpark): one pass proposes up to this many positions at once, and costs
    # about the same however many of them are kept; 0: one pass (a draft step) per position.
    block: int = 0


class Drafter(ABC):
    """Proposes tokens. The Proposer calls begin() once per generation, then draft()/accept() per round.

    A drafter declares what it is (`name`, its `sources`, the llama.cpp `models` it holds), so front
    ends and the policy never test for a drafter's name or class."""

    name: str  # its registry entry's (specli.drafters.registry), given when the registry builds it
    sources: tuple[Source, ...] = ()

    @property
    def models(self) -> list[Model]:
        """The llama.cpp models this drafter holds (none for n-gram lookup)."""
        return []

    @property
    def head_files(self) -> list[Path]:
        """The files of trained heads this drafter runs beside the target (not Models of their own)."""
        return []

    def begin(self, context: list[int], sampler: Sampler) -> None:
        """A generation starts over `context` (the prompt): prefill, reset indexes. `sampler` is how
        the generation draws (its settings, keyed noise and verification rule)."""

    def next_source(self, context: list[int]) -> str:
        """Which proposer the next draft() will use (the policy keeps acceptance estimates per source)."""
        return self.name

    @abstractmethod
    def draft(self, context: list[int], k: int, gate: DraftGate | None = None) -> Draft:
        """Propose up to k tokens to follow `context` (committed tokens; the last is pending).

        A drafter that knows its confidence asks `gate` before each position and stops where it
        says no; one that does not (n-gram lookup) ignores it."""

    def accept(self, context: list[int]) -> None:
        """The round committed: `context` is the new committed sequence (roll back what was not)."""

    def reset(self) -> None:
        """Forget any cached state (the next begin() starts from nothing)."""

    def set_resting(self, resting: bool) -> None:
        """True: nothing will be drafted until this is called with False (before a later generation's
        prompt), so the work that only keeps the drafter ready may stop (a trained head's features,
        read at every target decode, and its catch-up at the next begin())."""

    def set_p_min(self, p_min: float) -> None:
        """--draft-p-min from the next generation on (a server's request sets it per generation);
        a drafter without probabilities (n-gram lookup) has none."""

    def warm_up(self) -> tuple[str, ...]:
        """Before the first generation, one pass of the shape a draft takes, the drafter's state left
        as it was (llama.cpp warms its contexts up at load too), where a first pass costs far more
        than later ones; the sources whose next step is then timed as a warm one."""
        return ()

    def watch_costs(self) -> dict[str, float]:
        """At load, after warm_up: per source, the seconds each plain token costs more while the source
        is watched rather than resting, besides its catch-up (a trained head's features: the target
        hands out its layer inputs at every decode). A source not here costs nothing while watched,
        or was not timed."""
        return {}

    def catch_up_costs(self) -> dict[str, tuple[int, float]]:
        """At load, after warm_up: per source that reads what plain rounds committed only when a draft
        is asked for (a trained head), (positions, seconds) of a warm catch-up, a one-position
        decode's time taken off (as auto takes a draft step off a generation's catch-up; a block
        drafter's it prices whole, so for DFlash/DSpark this figure is the lower): -k auto then weighs
        watching a declined source (policy.WATCH_SHARE) before a shadow has paid for a catch-up. A
        source not here was not timed."""
        return {}

    @property
    def decode_seconds(self) -> float:
        """Seconds this drafter spent inside llama_decode (0 for drafters without a model)."""
        return 0.0

    def close(self) -> None:
        """Free what the drafter holds."""


# Positions of the catch-up a catching-up drafter times at load (`timed_catch_up`): as many as a
# shadow's gap reads on a CPU, and few enough that a large head times them in a fraction of its load.
CATCH_UP_TIMED = 16


def timed_catch_up(catch_up: Callable[[int], object], undo: Callable[[], object]) -> tuple[int, float]:
    """(positions, seconds) of a warm catch-up of CATCH_UP_TIMED positions, a one-position one's time
    taken off (Drafter.catch_up_costs): `catch_up(n)` reads n positions into an empty state, `undo`
    empties it again. The faster of two each: a first pass of a shape costs up to ~1.8x a warm one
    (buffers made, weights read in), and a slow one-position pass would hide the positions' cost."""
    def timed(n: int) -> float:
        started = time.perf_counter()
        try:
            catch_up(n)
            return time.perf_counter() - started
        finally:
            undo()

    ones, wholes = [], []
    for _ in range(2):
        ones.append(timed(1))
        wholes.append(timed(CATCH_UP_TIMED))
    return CATCH_UP_TIMED, max(0.0, min(wholes) - min(ones))


class CatchingUpDrafter(Drafter):
    """A drafter that reads the committed positions only when a draft is asked for (an MTP head, a
    trained head): what plain rounds committed since its last draft is their debt
    (Draft.catch_up_seconds), not this draft's cost. p_min: --draft-p-min."""

    p_min: float = 0.0
    _debt = False  # plain rounds since the last draft: their positions are a catch-up debt
    _drafted = False

    def _catch_up_billed(self, seconds: float) -> float:
        """A draft is being made after a catch-up of `seconds`: the part that is a debt."""
        debt, self._debt, self._drafted = self._debt, False, True
        return seconds if debt else 0.0

    def _forget_debt(self) -> None:
        self._debt = self._drafted = False

    def accept(self, context: list[int]) -> None:
        if not self._drafted:
            self._debt = True
        self._drafted = False

    def set_p_min(self, p_min: float) -> None:
        self.p_min = p_min
