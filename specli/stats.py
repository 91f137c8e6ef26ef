"""Counters and timings of a generation: a fold over its event stream, and the speedup they predict.

The prediction is costs.py's, the model `-k auto` chooses k with (Leviathan et al. 2023 with two
acceptance rates and measured costs instead of a constant verify cost): the rounds' expected tokens
E(k) = 1 + a1 (1 - a2^k) / (1 - a2) at plain decoding's T_v(1) per token, over what drafting and
verifying cost, with T_v by batch size measured in this generation (costs.verify_curve where not).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field

from specli.costs import expected_tokens, later_examined
from specli.events import DoneEvent, Event, Holdback, Origin, PromptEvent, RoundEvent, TokenEvent

_ORIGIN_KEYS = {origin: origin.value for origin in Origin}  # an enum's .value is a slow property


def speed(tokens: int, seconds: float) -> float | None:
    """Tokens per second (None before any time has passed): the one rate every front end reports."""
    return tokens / seconds if seconds > 0 else None


def acceptance(accepted: int | None, drafted: int | None) -> float | None:
    """Accepted / drafted (what llama.cpp reports as its acceptance rate; None: nothing drafted, or a
    server that did not say)."""
    return accepted / drafted if drafted and accepted is not None else None


def expected_tokens_per_round(alpha: float, k: int) -> float:
    """E[tokens a round emits] with one acceptance rate: (1 - alpha^(k+1)) / (1 - alpha); k + 1 when
    alpha = 1 (costs.expected_tokens with a1 = a2 = alpha)."""
    return expected_tokens(alpha, alpha, k)


@dataclass
class GenerationStats:
    n_prompt: int = 0
    n_prompt_evaluated: int = 0
    prompt_seconds: float = 0.0
    n_generated: int = 0
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    rejections: int = 0  # rounds that ended with a rejected draft token
    first_accepted: int = 0  # drafting rounds whose first draft was accepted (a1's numerator)
    later_examined: int = 0  # drafts after a round's first that the target judged (a2's denominator)
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    other_seconds: float = 0.0
    generation_seconds: float = 0.0  # wall time from the first round to the end
    decode_seconds: float = 0.0  # of that, inside llama_decode (target and draft)
    stop_reason: str = ""
    seed: int | None = None
    sampling_mode: str = ""  # "greedy" | "same-as-plain" | "rejection"
    sampling_path: str = ""  # "backend" (filters in llama.cpp's graph) | "host"
    sampling_reason: str = ""
    accepted_per_round: Counter = field(default_factory=Counter)  # histogram over drafting rounds
    k_per_round: list[int] = field(default_factory=list)
    origins: Counter = field(default_factory=Counter)  # emitted tokens by origin
    accepted_by_drafter: Counter = field(default_factory=Counter)
    # verify seconds by batch size m = k + 1: [count, total seconds]
    verify_by_size: dict[int, list[float]] = field(default_factory=dict)
    holdback: Holdback | None = None  # why -k auto drafted little or nothing (the DoneEvent's)

    def observe(self, event: Event) -> None:
        if type(event) is TokenEvent:
            self.n_generated += 1
            origin = event.origin
            self.origins[_ORIGIN_KEYS[origin]] += 1
            if origin is Origin.ACCEPTED and event.drafter:
                self.accepted_by_drafter[event.drafter] += 1
        elif isinstance(event, RoundEvent):
            self.rounds += 1
            judged, kept = event.judged, event.kept
            self.drafted += judged
            self.accepted += kept
            self.draft_seconds += event.draft_seconds
            self.verify_seconds += event.verify_seconds
            self.other_seconds += event.other_seconds
            self.k_per_round.append(event.k)
            self.decode_seconds += event.decode_seconds
            self.generation_seconds = event.elapsed_seconds
            if judged:
                self.accepted_per_round[kept] += 1
                self.rejections += kept < judged
                self.first_accepted += kept > 0
                self.later_examined += later_examined(judged, kept)
            slot = self.verify_by_size.setdefault(event.k + 1, [0, 0.0])  # the batch verified: all k
            slot[0] += 1
            slot[1] += event.verify_seconds
        elif isinstance(event, DoneEvent):
            self.stop_reason = event.stop_reason
            self.generation_seconds = event.elapsed_seconds
            self.holdback = event.holdback
        elif isinstance(event, PromptEvent):
            self.n_prompt = event.n_prompt
            self.n_prompt_evaluated = event.n_evaluated
            self.prompt_seconds = event.seconds
            self.seed = event.seed
            self.sampling_mode = event.sampling_mode
            self.sampling_path = event.sampling_path
            self.sampling_reason = event.sampling_reason

    # -- derived figures -----------------------------------------------------------------------------

    @property
    def auto_reason(self) -> str | None:
        """One line: why -k auto decoded most tokens plainly (None: it did not hold back)."""
        return self.holdback.text if self.holdback is not None else None

    @property
    def drafting_rounds(self) -> int:
        return sum(self.accepted_per_round.values())

    @property
    def acceptance_rate(self) -> float | None:
        return acceptance(self.accepted, self.drafted)

    @property
    def alpha(self) -> float | None:
        """Per-position acceptance probability: accepted / positions examined (MLE for a geometric
        number of acceptances, since a round stops examining at its first rejection)."""
        examined = self.accepted + self.rejections
        return self.accepted / examined if examined else None

    @property
    def tokens_per_round(self) -> float | None:
        return self.n_generated / self.rounds if self.rounds else None

    @property
    def tokens_per_second(self) -> float | None:
        return speed(self.n_generated, self.generation_seconds)

    @property
    def draft_ms_per_token(self) -> float | None:
        return 1000 * self.draft_seconds / self.drafted if self.drafted else None

    @property
    def verify_ms_per_round(self) -> float | None:
        return 1000 * self.verify_seconds / self.rounds if self.rounds else None

    def verify_ms(self, batch_size: int) -> float | None:
        slot = self.verify_by_size.get(batch_size)
        return 1000 * slot[1] / slot[0] if slot and slot[0] else None

    @property
    def overhead_fraction(self) -> float | None:
        """Share of generation wall time spent outside llama_decode (sampling, bookkeeping, UI)."""
        if self.generation_seconds <= 0:
            return None
        return max(0.0, 1.0 - self.decode_seconds / self.generation_seconds)

    @property
    def a1(self) -> float | None:
        """Acceptance of a round's first draft."""
        rounds = self.drafting_rounds
        return self.first_accepted / rounds if rounds else None

    @property
    def a2(self) -> float | None:
        """Acceptance of a later draft, given the one before it was accepted (None: none judged)."""
        later = self.accepted - self.first_accepted
        return later / self.later_examined if self.later_examined else None

    @property
    def predicted_speedup(self) -> float | None:
        """What these rounds should have gained over plain decoding: their expected tokens (costs.py's
        E(k) with this generation's a1 and a2) at plain decoding's T_v(1) each, over what drafting and
        verifying took. None without a measured T_v(1): a fixed k never decodes one token alone, so
        for it only bench, which measures the verify curve, predicts."""
        t1, spent = self.verify_ms(1), self.draft_seconds + self.verify_seconds
        if t1 is None or spent <= 0:
            return None
        a1, a2 = self.a1, self.a2
        if a1 is None:  # nothing drafted: nothing to predict
            return None
        expected = sum(expected_tokens(a1, a1 if a2 is None else a2, k) for k in self.k_per_round)
        return expected * (t1 / 1000) / spent

    def as_dict(self) -> dict:
        """Every figure, machine-readable (for --json and bench files)."""

        def r(x: float | None, nd: int = 4) -> float | None:
            return None if x is None else round(x, nd)

        return {
            "prompt_tokens": self.n_prompt,
            "prompt_tokens_evaluated": self.n_prompt_evaluated,
            "prompt_seconds": r(self.prompt_seconds),
            "generated_tokens": self.n_generated,
            "rounds": self.rounds,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": r(self.acceptance_rate),
            "alpha": r(self.alpha),
            "tokens_per_round": r(self.tokens_per_round),
            "accepted_per_round_histogram": {str(k): v for k, v in sorted(self.accepted_per_round.items())},
            "k_per_round": self.k_per_round,
            "origins": dict(self.origins),
            "accepted_by_drafter": dict(self.accepted_by_drafter),
            "draft_seconds": r(self.draft_seconds),
            "verify_seconds": r(self.verify_seconds),
            "other_seconds": r(self.other_seconds),
            "generation_seconds": r(self.generation_seconds),
            "decode_seconds": r(self.decode_seconds),
            "overhead_fraction": r(self.overhead_fraction),
            "draft_ms_per_token": r(self.draft_ms_per_token, 3),
            "verify_ms_per_round": r(self.verify_ms_per_round, 3),
            "verify_ms_by_batch_size": {str(m): r(self.verify_ms(m), 3) for m in sorted(self.verify_by_size)},
            "tokens_per_second": r(self.tokens_per_second, 2),
            "predicted_speedup": r(self.predicted_speedup, 3),
            "stop_reason": self.stop_reason,
            "sampling_mode": self.sampling_mode,
            "sampling": self.sampling_path,
            "sampling_reason": self.sampling_reason,
            "seed": self.seed,
            "auto_reason": self.auto_reason,
            "auto_holdback": None if self.holdback is None else asdict(self.holdback),
        }
