"""A chat without a terminal: `ChatSession` keeps the conversation, renders it with the target's own chat
template, fits it into the context (dropping the oldest turns), streams the engine's events for each
turn, runs the slash commands and writes /save transcripts.

The engine keeps the longest common prefix of its cache with each new prompt, so turn N only evaluates
what turn N - 1 did not already have in the cache (the "prefill" figure after each reply).
"""

from __future__ import annotations

import json
from collections.abc import Generator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from specli.api import Speculator
from specli.chat.prompt import ChatFormat
from specli.chat_template import ChatTemplate, ChatTemplateError
from specli.engine import GenerationParams
from specli.events import DoneEvent, Event, TokenEvent
from specli.fileio import atomic_write_text
from specli.llama import PromptTooLong, check_prompt_fits
from specli.sampling import SamplingParams
from specli.settings import MAX_DRAFT_K, RunSettings, Source, UsageProblem, defaults_for, valid_text
from specli.stats import GenerationStats, acceptance, speed

MIN_REPLY_TOKENS = 64  # context kept free for the reply even when max_tokens is larger than a quarter
# Once turns must go, trim to this share of the context: dropping just enough would make every later turn
# drop one more and re-evaluate the whole prompt; the slack lets the next turns reuse the cache again.
TRIM_TO = 0.75


class ChatError(Exception):
    """A turn or command that cannot go ahead; the message is one line for the user."""


# -- records ------------------------------------------------------------------------------------------


@dataclass
class ChatOptions:
    """A chat: the system message, the generation settings (with a seed, turn i uses seed + i:
    reproducible sessions) and what the front end shows."""

    system: str | None = None
    settings: RunSettings = field(default_factory=lambda: defaults_for("chat"))
    show_rejected: bool = False
    history: bool = True  # keep readline history in default_history_path() (terminals only)


# The slash commands that change a setting, as the user types them.
SLASH = Source(text=True, spellings={"draft_max": "/k", "temp": "/temp"})


@dataclass(slots=True)
class ContextNotice:
    """Old turns were dropped so that the prompt and the reply budget fit the context."""

    dropped_turns: int
    prompt_tokens: int
    n_ctx: int

    @property
    def message(self) -> str:
        turns = "turn" if self.dropped_turns == 1 else "turns"
        return (f"dropped {self.dropped_turns} old {turns} to fit the context "
                f"({self.prompt_tokens} prompt tokens, context {self.n_ctx})")


ChatEvent = Event | ContextNotice


class _Rates:
    """tok/s and acceptance of a record with generated_tokens, generation_seconds, accepted, drafted
    (specli.stats' figures)."""

    generated_tokens: int
    generation_seconds: float
    accepted: int
    drafted: int

    @property
    def tokens_per_second(self) -> float | None:
        return speed(self.generated_tokens, self.generation_seconds)

    @property
    def acceptance_rate(self) -> float | None:
        return acceptance(self.accepted, self.drafted)


@dataclass
class TurnRecord(_Rates):
    """One user message and the reply to it, with the figures of its generation."""

    index: int
    prompt_tokens: int
    prefill_tokens: int  # prompt tokens evaluated for this turn (the rest came from the cache)
    generated_tokens: int
    generation_seconds: float
    prompt_seconds: float
    drafted: int
    accepted: int
    stop_reason: str  # the engine's, or "interrupted" / "error"
    dropped_turns: int
    draft_max: int | str
    temperature: float
    stats: GenerationStats = field(repr=False, default_factory=GenerationStats)


    def to_dict(self) -> dict[str, Any]:
        rate, acc = self.tokens_per_second, self.acceptance_rate
        return {
            "turn": self.index,
            "prompt_tokens": self.prompt_tokens,
            "prefill_tokens": self.prefill_tokens,
            "generated_tokens": self.generated_tokens,
            "generation_seconds": round(self.generation_seconds, 4),
            "prompt_seconds": round(self.prompt_seconds, 4),
            "tokens_per_second": None if rate is None else round(rate, 2),
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": None if acc is None else round(acc, 4),
            "stop_reason": self.stop_reason,
            "dropped_turns": self.dropped_turns,
            "draft_max": self.draft_max,
            "temperature": self.temperature,
            "stats": self.stats.as_dict(),
        }


@dataclass(frozen=True)
class SessionTotals(_Rates):
    turns: int
    generated_tokens: int
    generation_seconds: float
    prefill_tokens: int
    drafted: int
    accepted: int
    dropped_turns: int



@dataclass(frozen=True)
class CommandResult:
    """What a slash command says back; `error` lines are one line, `exit` ends the loop."""

    text: str = ""
    error: bool = False
    exit: bool = False
    failed: bool = False  # an action that did not happen (a /save not written), not just a typo


@dataclass(frozen=True)
class PreparedPrompt:
    """A rendered, tokenized prompt for one turn (history after any dropped turns + the user message)."""

    history: list[dict[str, str]]
    user_text: str
    text: str
    tokens: list[int]
    dropped_turns: int


# -- the session ------------------------------------------------------------------------------------------


HELP_TEXT = f"""\
commands:
  /help           this list
  /stats          session totals: turns, tokens, mean tok/s, acceptance
  /reset          forget the conversation (the system message stays)
  /k N|auto       tokens drafted per round (0..{MAX_DRAFT_K}) or auto
  /temp X         temperature (0: greedy)
  /system TEXT    set the system message (/system alone shows it)
  /save FILE      write the transcript as JSON (messages, settings, per-turn stats)
  /exit           leave (Ctrl-D works too)
input: end a line with \\ to continue it; \"\"\" starts and ends a multi-line block; //text sends /text"""


class ChatSession:
    """A conversation with a loaded Speculator: history, template, settings and per-turn stats."""

    def __init__(self, spec: Speculator, options: ChatOptions | None = None, *,
                 template: ChatTemplate | None = None) -> None:
        self.spec = spec
        self.options = options = options or ChatOptions()
        self.format = ChatFormat.for_model(spec.target, template)
        self.template, self.template_notice = self.format.template, self.format.notice
        self.messages: list[dict[str, str]] = []  # the conversation as the model sees it (fits the context)
        # Messages dropped from the context to make room: still part of what was said, so /save keeps them.
        self.dropped: list[dict[str, str]] = []
        if options.system:
            self.messages.append({"role": "system", "content": options.system})
        self.turns: list[TurnRecord] = []
        self.settings = options.settings
        self.stops: list[str] = list(self.format.stops)
        self.last_prompt: PreparedPrompt | None = None
        if options.system and (problem := self.system_problem(options.system)):
            # Refused now: every turn would fail, and /reset keeps the system message.
            raise UsageProblem(f"--system {problem}")

    # -- facts -------------------------------------------------------------------------------------

    @property
    def n_ctx(self) -> int:
        return self.spec.target.n_ctx

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams.of(self.settings)

    @property
    def draft_max(self) -> int | str:
        return self.settings.draft_max

    @property
    def max_tokens(self) -> int:
        return self.settings.max_tokens

    @property
    def system(self) -> str | None:
        return self.messages[0]["content"] if self.messages and self.messages[0]["role"] == "system" else None

    def system_problem(self, text: str) -> str | None:
        """Why `text` cannot be the system message (None: it can): with an empty user message it must
        leave the reply its reserve of the context, since turns are dropped but it never is."""
        messages = [{"role": "system", "content": text}, {"role": "user", "content": ""}]
        try:
            tokens = self.tokenize_prompt(self.template.render(messages, add_generation_prompt=True))
        except ChatTemplateError:
            return None  # the template's own problem: each turn says it
        room = self.n_ctx - self.reply_reserve()
        if len(tokens) <= room:
            return None
        return (f"is {len(tokens)} tokens in the chat template, but the context ({self.n_ctx}) keeps "
                f"{self.reply_reserve()} for the reply and can give it at most {room}: shorten it, or "
                "raise --ctx")

    def reply_reserve(self) -> int:
        """Context kept free for the reply: max_tokens, capped at a quarter of the context (at least 64)."""
        return min(self.max_tokens, max(MIN_REPLY_TOKENS, self.n_ctx // 4))

    def generation_params(self) -> GenerationParams:
        """The next turn's: the session's settings, stopping where the template ends a reply."""
        return GenerationParams.of(self.format.reply_settings(self.settings), seed_offset=len(self.turns))

    def totals(self) -> SessionTotals:
        t = self.turns
        return SessionTotals(
            turns=len(t),
            generated_tokens=sum(r.generated_tokens for r in t),
            generation_seconds=sum(r.generation_seconds for r in t),
            prefill_tokens=sum(r.prefill_tokens for r in t),
            drafted=sum(r.drafted for r in t),
            accepted=sum(r.accepted for r in t),
            dropped_turns=sum(r.dropped_turns for r in t),
        )

    # -- prompts -----------------------------------------------------------------------------------

    def tokenize_prompt(self, text: str) -> list[int]:
        """Tokens of a rendered prompt: BOS added only if the template did not write it already."""
        return self.format.tokenize(text)

    def render(self, messages: list[dict[str, str]]) -> str:
        try:
            return self.format.render(messages)
        except ChatTemplateError as e:
            raise ChatError(f"the chat template cannot render this conversation: {e}") from None

    def prepare(self, user_text: str) -> PreparedPrompt:
        """Render and tokenize the conversation plus `user_text`, dropping the oldest turns to fit.

        The prompt must leave reply_reserve() tokens free; if it does not, the oldest exchanges go
        (never the system message) until it fills at most TRIM_TO of the context.
        """
        try:
            valid_text(user_text, "the message")
        except UsageProblem as e:
            raise ChatError(str(e)) from None
        history = [dict(m) for m in self.messages]
        reserve = self.reply_reserve()
        limit = self.n_ctx - reserve
        dropped = 0
        while True:
            text = self.render([*history, {"role": "user", "content": user_text}])
            tokens = self.tokenize_prompt(text)
            if len(tokens) <= limit or not _drop_oldest_turn(history):
                break
            dropped += 1
            limit = min(limit, int(self.n_ctx * TRIM_TO) - reserve)
        try:
            check_prompt_fits(len(tokens), self.n_ctx)
        except PromptTooLong as e:
            raise ChatError(f"the message does not fit: {e} (shorten it, /reset, or raise --ctx)") from None
        return PreparedPrompt(history, user_text, text, tokens, dropped)

    # -- a turn ------------------------------------------------------------------------------------

    def send(self, user_text: str) -> Generator[ChatEvent, None, None]:
        """Start a turn: the prompt is prepared now (ChatError here, before any output), then the
        returned iterator streams a ContextNotice if turns were dropped, then the engine's events.

        The reply (what the engine released) is appended to the history when the iterator ends, also
        when it is closed early or interrupted: the partial reply is kept.
        """
        prepared = self.prepare(user_text)
        return self._turn(prepared)

    def _turn(self, prepared: PreparedPrompt) -> Generator[ChatEvent, None, None]:
        self.last_prompt = prepared
        if prepared.dropped_turns:
            # _drop_oldest_turn removes one block right after the system message
            start = 1 if self.system is not None else 0
            n_removed = len(self.messages) - len(prepared.history)
            self.dropped.extend(self.messages[start : start + n_removed])
            self.messages = prepared.history
        self.messages.append({"role": "user", "content": prepared.user_text})
        params = self.generation_params()
        parts: list[str] = []
        stop_reason = "interrupted"
        generation = self.spec.generate(prepared.tokens, params)
        try:
            if prepared.dropped_turns:
                yield ContextNotice(prepared.dropped_turns, len(prepared.tokens), self.n_ctx)
            for event in generation:
                if isinstance(event, TokenEvent):
                    parts.append(event.text)
                elif isinstance(event, DoneEvent):
                    stop_reason = event.stop_reason
                yield event
        except (KeyboardInterrupt, GeneratorExit):
            # Ctrl-C, in the engine or in the front end: the generation ends as "interrupted" (below).
            # The caches need nothing: each Model knows what its cache holds, even after an
            # interrupted decode, and the next turn reuses what it can.
            raise
        except BaseException:
            stop_reason = "error"
            raise
        finally:
            if generation.done is None:
                generation.interrupt()
            stats = generation.stats
            if stop_reason in ("interrupted", "error"):
                stats.stop_reason = stop_reason
            self.messages.append({"role": "assistant", "content": "".join(parts)})
            self.turns.append(TurnRecord(
                index=len(self.turns) + 1,
                prompt_tokens=len(prepared.tokens),
                prefill_tokens=stats.n_prompt_evaluated,
                generated_tokens=stats.n_generated,
                generation_seconds=stats.generation_seconds,
                prompt_seconds=stats.prompt_seconds,
                drafted=stats.drafted,
                accepted=stats.accepted,
                stop_reason=stop_reason,
                dropped_turns=prepared.dropped_turns,
                draft_max=params.draft_max,
                temperature=params.sampling.temperature,
                stats=stats,
            ))

    # -- settings and commands ---------------------------------------------------------------------

    def reset(self) -> None:
        """Forget the conversation; the system message stays."""
        system = self.system
        self.messages = [{"role": "system", "content": system}] if system is not None else []
        self.dropped = []

    def set_system(self, text: str) -> None:
        if (problem := self.system_problem(text)) is not None:
            raise ChatError(f"the system message {problem}")
        if self.system is not None:
            self.messages[0] = {"role": "system", "content": text}
        else:
            self.messages.insert(0, {"role": "system", "content": text})

    # The same rules as --draft-max and --temp (specli.settings), named as typed here.
    def set_k(self, value: str) -> None:
        self._update({"draft_max": value})

    def set_temperature(self, value: str) -> None:
        self._update({"temp": value})

    def _update(self, values: dict[str, str]) -> None:
        try:
            self.settings = self.settings.updated(values, SLASH)
        except UsageProblem as e:
            raise ChatError(str(e)) from None

    def transcript(self) -> dict[str, Any]:
        drafter = self.spec.drafter
        return {
            "format": "specli-chat",
            "version": 1,
            "saved_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "target": self.spec.target.path.name,
            "drafter": None if drafter is None else drafter.name,
            "draft_model": next((m.path.name for m in drafter.models), None) if drafter else None,
            "chat_template": self.format.template_kind,
            "n_ctx": self.n_ctx,
            "settings": {
                "system": self.system,
                "max_tokens": self.max_tokens,
                "temperature": self.sampling.temperature,
                "top_k": self.sampling.top_k,
                "top_p": self.sampling.top_p,
                "min_p": self.sampling.min_p,
                "draft_max": self.draft_max,
                "seed": self.settings.seed,
                "stop": self.stops,
            },
            # everything said since the last /reset, also turns dropped from the context to make room
            "messages": self.conversation(),
            "dropped_from_context": len(self.dropped),
            "turns": [t.to_dict() for t in self.turns],
        }

    def conversation(self) -> list[dict[str, str]]:
        """The whole conversation since the last /reset: the system message, the turns dropped from the
        context, then those still in it."""
        start = 1 if self.system is not None else 0
        return [dict(m) for m in [*self.messages[:start], *self.dropped, *self.messages[start:]]]

    def save(self, path: str | Path) -> Path:
        path = Path(path).expanduser()
        try:
            text = json.dumps(self.transcript(), ensure_ascii=False, indent=2)
            atomic_write_text(path, text + "\n")
        except OSError as e:
            raise ChatError(f"cannot write {path}: {e.strerror or e}") from None
        return path

    def command(self, line: str) -> CommandResult:
        """Run a slash command (`line` starts with '/'); bad values give an error result, never raise."""
        name, _, arg = line.strip().partition(" ")
        name, arg = name.lower(), arg.strip()
        try:
            if name == "/help":
                return CommandResult(HELP_TEXT)
            if name in ("/exit", "/quit", "/bye"):
                return CommandResult(exit=True)
            if name == "/stats":
                return CommandResult(format_totals(self.totals()))
            if name == "/reset":
                self.reset()
                kept = " (system message kept)" if self.system else ""
                return CommandResult("conversation cleared" + kept)
            if name == "/k":
                if not arg:
                    return CommandResult(f"k = {self.draft_max} (usage: /k N|auto)")
                self.set_k(arg)
                note = "" if self.spec.drafter else " (no drafter loaded: it has no effect)"
                return CommandResult(f"k = {self.draft_max}{note}")
            if name == "/temp":
                if not arg:
                    return CommandResult(f"temperature = {self.sampling.temperature:g} (usage: /temp X)")
                self.set_temperature(arg)
                return CommandResult(f"temperature = {self.sampling.temperature:g}"
                                     + (" (greedy)" if self.sampling.greedy else ""))
            if name == "/system":
                if not arg:
                    return CommandResult(f"system: {self.system!r}" if self.system is not None
                                         else "no system message (usage: /system TEXT)")
                self.set_system(arg)
                return CommandResult("system message set")
            if name == "/save":
                if not arg:
                    raise ChatError("usage: /save FILE")
                try:
                    path = self.save(arg)
                except ChatError as e:
                    return CommandResult(str(e), error=True, failed=True)
                return CommandResult(f"saved {len(self.turns)} turns to {path}")
        except ChatError as e:
            return CommandResult(str(e), error=True)
        return CommandResult(f"unknown command {name}: /help lists the commands", error=True)


def _drop_oldest_turn(history: list[dict[str, str]]) -> bool:
    """Remove the oldest non-system message and what follows it up to the next user message."""
    start = next((i for i, m in enumerate(history) if m["role"] != "system"), None)
    if start is None:
        return False
    end = start + 1
    while end < len(history) and history[end]["role"] not in ("user", "system"):
        end += 1
    del history[start:end]
    return True


# -- formatting -----------------------------------------------------------------------------------------


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.0f}%"


def _rate(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1f}"


def format_turn_line(turn: TurnRecord) -> str:
    """The one line after a reply: tokens, tok/s, acceptance (n/a with nothing drafted), prefill, and
    why -k auto decoded most of it plainly when it did."""
    parts = [_plural(turn.generated_tokens, "token"), f"{_rate(turn.tokens_per_second)} tok/s",
             f"acceptance {_pct(turn.acceptance_rate)} ({turn.accepted}/{turn.drafted})",
             f"prefill {turn.prefill_tokens}"]
    if turn.stop_reason in ("length", "context", "interrupted"):
        parts.append({"length": "hit max tokens", "context": "context full",
                      "interrupted": "interrupted"}[turn.stop_reason])
    if turn.stats.auto_reason:
        parts.append(f"auto: {turn.stats.auto_reason}")
    return " · ".join(parts)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def format_totals(t: SessionTotals) -> str:
    """The /stats line: session totals (prefill: prompt tokens evaluated over all turns)."""
    return (f"{_plural(t.turns, 'turn')} · {_plural(t.generated_tokens, 'token')} · "
            f"mean {_rate(t.tokens_per_second)} tok/s · acceptance {_pct(t.acceptance_rate)} "
            f"({t.accepted}/{t.drafted}) · prefill {t.prefill_tokens}"
            + (f" · {_plural(t.dropped_turns, 'old turn')} dropped" if t.dropped_turns else ""))
