"""The event stream the engine yields and every front end consumes (run, chat, bench, --json).

One record per emitted token, one per rejected proposal set, one per round, and one at each end of a
generation. The same stream feeds all outputs, so they cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Origin(str, Enum):
    ACCEPTED = "accepted"  # a draft token the target accepted
    CORRECTED = "corrected"  # sampled by the target after it rejected a draft token
    BONUS = "bonus"  # sampled by the target after it accepted every draft token
    PLAIN = "plain"  # sampled by the target in a round without drafts (k = 0)


@dataclass(slots=True)
class TokenEvent:
    token: int
    text: str  # the text this token adds to the output (may be "" while UTF-8 bytes are incomplete)
    origin: Origin
    round: int
    drafter: str | None = None  # which drafter proposed an accepted token


@dataclass(slots=True)
class RejectedEvent:
    """Draft tokens the target rejected in a round (for --show-rejected); never part of the output."""

    tokens: list[int]
    text: str
    round: int
    drafter: str | None = None


@dataclass(slots=True, kw_only=True)  # eleven fields: built by name, never by position
class RoundEvent:
    index: int
    drafter: str | None  # None: plain round
    k: int  # tokens proposed
    accepted: int  # of those, accepted
    emitted: int  # tokens this round added to the output (accepted + 1, less any cut by a stop)
    draft_seconds: float
    verify_seconds: float
    other_seconds: float  # sampling, acceptance, bookkeeping
    decode_seconds: float = 0.0  # of the round, inside llama_decode (target and draft)
    elapsed_seconds: float = 0.0  # since the first round began, at this round's end
    # Where the output ended inside this round (end of text, a stop text): the verified tokens it took,
    # the one that ended it included. None: the round's tokens were all used.
    used: int | None = None

    @property
    def judged(self) -> int:
        """Drafts the output reached: all k, or those up to where it ended (drafts past an end of text
        or a stop text never count as drafted, nor as accepted)."""
        return self.k if self.used is None else min(self.k, self.used)

    @property
    def kept(self) -> int:
        """Accepted drafts the output reached."""
        return self.accepted if self.used is None else min(self.accepted, self.used)


@dataclass(slots=True)
class PromptEvent:
    n_prompt: int  # prompt tokens
    n_evaluated: int  # of those, evaluated now (the rest were already cached)
    seconds: float
    seed: int | None = None  # the seed of the keyed noise (chosen at random when none was given)
    sampling_mode: str = ""  # "greedy" | "same-as-plain" | "rejection"
    sampling_path: str = ""  # where the filters ran: "backend" (llama.cpp's graph) | "host"
    sampling_reason: str = ""  # why there (one line, for --verbose)


@dataclass(slots=True)
class Holdback:
    """Why `-k auto`'s plain rounds gave more than half of a generation's tokens, from its own
    figures: `text` is the one line every front end shows (e.g. "verify of 5 costs 3.1× one token
    here; acceptance 12 %: drafting would run at 0.80×"); the figures are None where the cause has
    none."""

    cause: str  # "nothing" (the drafter proposed nothing) | "declined" | "hopeless" | "unmeasured"
    text: str
    plain_rounds: int
    rounds: int
    verify_size: int | None = None  # the batch the best draft length would verify
    verify_ratio: float | None = None  # its cost over one token's
    draft_ratio: float | None = None  # a draft step's cost over one target token's
    acceptance: float | None = None  # what auto expects of a round's first draft
    drafting_speed: float | None = None  # drafting's predicted speed over plain decoding


@dataclass(slots=True)
class DoneEvent:
    stop_reason: str  # "eos" | "stop" | "length" | "context" | "interrupted"
    text: str  # the whole generated text (what was released to the user)
    elapsed_seconds: float = 0.0  # since the first round began
    holdback: Holdback | None = None  # -k auto drafted little or nothing: why


Event = TokenEvent | RejectedEvent | RoundEvent | PromptEvent | DoneEvent
