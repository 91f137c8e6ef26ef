"""OpenAI's request and response shapes, without a web framework: a request's fields checked and turned
into settings (specli.settings, by the same rules as flags and models.toml), and the bodies, stream
chunks, `usage` and llama-server's `timings` built from the engine's events and stats.

Errors are `ApiError`s: an HTTP status and OpenAI's `{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from specli.events import TokenEvent
from specli.settings import (
    REQUEST,
    REQUEST_FIELDS,
    SETTINGS,
    RunSettings,
    SettingError,
    UsageProblem,
    parse_updates,
    valid_text,
)
from specli.stats import GenerationStats

MAX_BODY_BYTES = 8 * 1024 * 1024  # a 128k-token conversation is well under 1 MiB of JSON
# JSON values (texts, numbers, lists, objects, field names included) one body may hold besides a token-id
# prompt's numbers (the context's size): thousands of messages, never the millions that 8 MiB can spell
# (each costs 50-200 bytes once parsed: a million tiny messages took ~200 MB).
MAX_JSON_VALUES = 65_536
MAX_NUMBER_CHARS = 40  # digits of a JSON number (a double needs 24; a 64-bit integer 20)
MAX_STOP_STRINGS = 16  # OpenAI takes 4; each is searched for after every token
MAX_STOP_CHARS = 500  # per stop text
MAX_ECHO_CHARS = 100  # of a value a message repeats
RETRY_AFTER_SECONDS = 2  # what a refusal for load (429, 503) tells a client to wait
MAX_MESSAGE_BYTES = 600  # an error's message, as JSON: the whole error body stays under 1 KB

CHAT = "chat"
TEXT = "text"

# Length fields, strongest first (llama-server's precedence); each one is the max_tokens setting.
LENGTH_FIELDS = ("n_predict", "max_completion_tokens", "max_tokens")

# Message roles as the chat templates know them; OpenAI's newer "developer" is the system message.
ROLE_ALIASES = {"developer": "system"}


class ApiError(Exception):
    """A request that cannot be served: its HTTP status and OpenAI's error body."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 code: str | None = None, param: str | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        message = fitted(message)
        super().__init__(message)
        self.status, self.message, self.type, self.code = status, message, type, code
        self.param = None if param is None else shorten(param)
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, code=code, param=param)


def shorten(text: str, limit: int = MAX_ECHO_CHARS) -> str:
    """`text`, cut to `limit` characters (the last three "...") when it is longer."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def fitted(message: str) -> str:
    """An error message that stays under MAX_MESSAGE_BYTES once written as JSON, whatever characters
    it echoes (a control character takes 6 bytes, an emoji 4)."""
    if len(message) * 6 <= MAX_MESSAGE_BYTES or \
            len(json.dumps(message, ensure_ascii=False).encode()) <= MAX_MESSAGE_BYTES:
        return message
    return shorten(message, MAX_MESSAGE_BYTES // 6)


# -- requests -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CompletionRequest:
    """A checked request: what to continue (chat `messages`, or a text `prompt` or its token ids) and
    with which settings (the server's defaults with the request's fields applied)."""

    kind: str  # CHAT | TEXT
    settings: RunSettings
    stream: bool
    include_usage: bool
    messages: list[dict[str, str]] | None = None
    prompt: str | list[int] | None = None
    cache_prompt: bool = True  # llama-server's field: False evaluates the whole prompt afresh


# A JSON text's values, for counting them before parsing: a text (its escaped quotes and backslashes
# removed first), a list or an object (their opening), a number, a literal.
_JSON_VALUE = re.compile(rb'"[^"]*"|[\[{]|-?[0-9][0-9.eE+-]*|true|false|null')
# JSON escapes that can write half of a character (\ud800-\udfff): only then can a parsed text hold one.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")


def parse_json(raw: bytes | bytearray, max_values: int = MAX_JSON_VALUES) -> dict[str, Any]:
    """A request body: a JSON object in UTF-8 (RFC 8259: no other encoding, no byte order mark) whose
    texts are all valid Unicode (JSON's escapes can write a lone surrogate, which no text can hold), of at
    most `max_values` values (413 before it is parsed) and numbers of at most MAX_NUMBER_CHARS characters
    that a double holds (RFC 8259 lets an implementation limit their range)."""
    n_values = count_json_values(raw, max_values + 1)
    if n_values > max_values:
        raise ApiError(413, f"the request body holds more than {max_values:,} JSON values (texts, numbers, "
                       "lists, objects), this server's limit", code="request_too_large")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ApiError(400, f"the request body is not UTF-8 (byte {e.start}): send JSON in UTF-8",
                       code="invalid_json") from None
    if text.startswith("\ufeff"):
        raise ApiError(400, "the request body starts with a byte order mark: send JSON in UTF-8 without one",
                       code="invalid_json")
    try:
        body = json.loads(text, parse_int=_json_int, parse_float=_json_float, parse_constant=_json_constant)
    except (ValueError, RecursionError) as e:
        raise ApiError(400, f"the request body is not valid JSON: {shorten(str(e), 120)}",
                       code="invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"the request body must be a JSON object, not {_json_type(body)}",
                       code="invalid_json")
    if _SURROGATE_ESCAPE.search(text) is not None:
        del text
        where = _lone_surrogate(body)
        if where is not None:
            raise bad_request(f"{where or 'a field name'} holds a lone surrogate (an escape such as \\ud800 "
                              "that is half of a character): it is not text", where or None)
    return body


def count_json_values(raw: bytes | bytearray, at_most: int) -> int:
    """How many values (field names included) the JSON text `raw` holds, counted up to `at_most`: linear
    in its length, with no object per value (the escapes go first, so that no quote inside a text ends
    it; what is not JSON is the parser's to refuse)."""
    flat = raw.replace(b"\\\\", b"").replace(b'\\"', b"") if b"\\" in raw else raw
    return sum(1 for _ in itertools.islice(_JSON_VALUE.finditer(flat), at_most))


def _json_int(literal: str) -> int:
    if len(literal) > MAX_NUMBER_CHARS:
        raise _number_too_long(literal)
    return int(literal)


def _json_float(literal: str) -> float:
    if len(literal) > MAX_NUMBER_CHARS:
        raise _number_too_long(literal)
    value = float(literal)
    if not math.isfinite(value):
        raise bad_request(f"the number {literal} is beyond the range of a double (about 1.8e308)")
    return value


def _json_constant(literal: str) -> float:
    raise ApiError(400, f"the request body is not valid JSON: {literal} is not a JSON number",
                   code="invalid_json")


def _number_too_long(literal: str) -> ApiError:
    return bad_request(f"a number of {len(literal):,} characters ({shorten(literal, 24)}): numbers here have "
                       f"at most {MAX_NUMBER_CHARS}")


def _lone_surrogate(body: dict[str, Any]) -> str | None:
    """The path of the first text (or field name: "") holding a lone surrogate, None if none does. A walk
    that keeps one iterator per open list or object, and builds a path only for the text it reports."""
    keys: list[str | int] = []  # the key (or index) of each open container in its parent
    stack: list[Any] = [iter(body.items())]
    while stack:
        for key, value in stack[-1]:
            if isinstance(key, str) and not key.isascii() and _SURROGATE.search(key):
                return ""
            if isinstance(value, str):
                if not value.isascii() and _SURROGATE.search(value):
                    return _path([*keys, key])
            elif isinstance(value, dict):
                keys.append(key)
                stack.append(iter(value.items()))
                break
            elif isinstance(value, list):
                keys.append(key)
                stack.append(enumerate(value))
                break
        else:
            stack.pop()
            if keys:
                keys.pop()
    return None


def _path(keys: list[str | int]) -> str:
    """A value's place as the request spells it: `messages[2].content`."""
    out = ""
    for key in keys:
        out += f"[{key}]" if isinstance(key, int) else (f".{key}" if out else key)
    return out


def parse_completion_request(body: Mapping[str, Any], kind: str, defaults: RunSettings) -> CompletionRequest:
    """Check a /v1/chat/completions (CHAT) or /v1/completions (TEXT) body; ApiError names the field."""
    _refuse_unsupported(body, kind)
    stream = _optional_bool(body, "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise bad_request(f"stream_options must be an object, not {_json_type(options)}", "stream_options",
                          "invalid_type")
    include_usage = _optional_bool(options or {}, "include_usage", "stream_options.include_usage")
    cache_prompt = _optional_bool(body, "cache_prompt", default=True)
    settings = request_settings(body, defaults)
    if kind == CHAT:
        return CompletionRequest(kind, settings, stream, include_usage, messages=parse_messages(body),
                                 cache_prompt=cache_prompt)
    return CompletionRequest(kind, settings, stream, include_usage, prompt=parse_prompt(body),
                             cache_prompt=cache_prompt)


def request_settings(body: Mapping[str, Any], defaults: RunSettings) -> RunSettings:
    """`defaults` with the request's setting fields applied (specli.settings.REQUEST: checked as flags
    are, an error names the field as the request spells it)."""
    for outer in {field.split(".", 1)[0] for field in REQUEST_FIELDS if "." in field}:
        if outer in body and body[outer] is not None and not isinstance(body[outer], dict):
            raise bad_request(f"{outer} must be an object such as {{\"n_max\": 4}}, not {_show(body[outer])}",
                              outer, "invalid_type")
    given: dict[str, Any] = {}  # the values as the request spells their fields, for messages
    raw: dict[str, Any] = {}
    for field, name in REQUEST_FIELDS.items():
        if name != "max_tokens":
            raw[name] = given[field] = _field(body, field)
    _check_stops(raw["stop"])
    try:
        settings = defaults.merged(parse_updates(raw, REQUEST))
        # Every length field given is checked, the strongest one applies.
        lengths = []
        for field in LENGTH_FIELDS:
            value = given[field] = body.get(field)
            if value is None or (field == "n_predict" and value == -1):  # llama-server's -1: no limit
                continue
            source = replace(REQUEST, spellings={**REQUEST.spellings, "max_tokens": field})
            lengths.append(parse_updates({"max_tokens": value}, source))
        return settings.merged(lengths[0]) if lengths else settings
    except SettingError as e:
        message = str(e)
        if len(message) > 2 * MAX_ECHO_CHARS:  # the settings' message repeats the whole value
            expected = SETTINGS[REQUEST_FIELDS.get(e.option, "max_tokens")].expected
            message = f"{e.option} must be {expected}, got {_show(given.get(e.option))}"
        raise bad_request(message, e.option) from None


def _field(body: Mapping[str, Any], field: str) -> Any:
    """A field by its name; a dotted name (llama-server's `speculative.n_max`) also as a nested object,
    but not both at once, and never null (an extension's field has no null to fall back on)."""
    if "." not in field:
        return body.get(field)
    outer, inner = field.split(".", 1)
    nested = body.get(outer)
    inside = isinstance(nested, dict) and inner in nested
    if field in body and inside:
        raise bad_request(f"{field} is given twice (as \"{field}\" and inside \"{outer}\"): give it once",
                          field)
    if not inside and field not in body:
        return None
    value = nested[inner] if inside else body[field]
    if value is None:
        expected = SETTINGS[REQUEST_FIELDS[field]].expected
        raise bad_request(f"{field} must be {expected}, not null (leave it out for the server's default)",
                          field, "invalid_type")
    return value


def _check_stops(stop: Any) -> None:
    """At most MAX_STOP_STRINGS stop texts of MAX_STOP_CHARS each: every one is looked for after each
    token (500,000 of them took generation from 70 to 0.8 tokens/s)."""
    if isinstance(stop, list) and len(stop) > MAX_STOP_STRINGS:
        raise bad_request(f"stop holds {len(stop):,} texts: this server takes at most {MAX_STOP_STRINGS}",
                          "stop")
    for i, text in enumerate([stop] if isinstance(stop, str) else stop if isinstance(stop, list) else []):
        if isinstance(text, str) and len(text) > MAX_STOP_CHARS:
            where = "stop" if isinstance(stop, str) else f"stop[{i}]"
            raise bad_request(f"{where} is {len(text):,} characters long: a stop text has at most "
                              f"{MAX_STOP_CHARS}", where)


def _optional_bool(body: Mapping[str, Any], field: str, name: str | None = None, *,
                   default: bool = False) -> bool:
    value = body.get(field)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad_request(f"{name or field} must be true or false, not {_show(value)}", name or field,
                          "invalid_type")
    return value


def _refuse_unsupported(body: Mapping[str, Any], kind: str) -> None:
    """Fields asking for what this server cannot give: a clear 400 instead of a silent difference."""
    n = body.get("n")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n != 1):
        raise bad_request(f"n must be 1: this server generates one completion per request, got {_show(n)}",
                          "n", "unsupported_value")
    logprobs = body.get("logprobs")
    if logprobs not in (None, False, 0):
        raise bad_request("logprobs are not supported by this server", "logprobs", "unsupported_parameter")
    if kind == TEXT:
        if body.get("echo") not in (None, False):
            raise bad_request("echo is not supported by this server", "echo", "unsupported_parameter")
        if body.get("suffix") not in (None, ""):
            raise bad_request("suffix is not supported by this server", "suffix", "unsupported_parameter")
        best_of = body.get("best_of")
        if best_of is not None and (isinstance(best_of, bool) or best_of != 1):
            raise bad_request(f"best_of must be 1, got {_show(best_of)}", "best_of", "unsupported_value")


def parse_messages(body: Mapping[str, Any]) -> list[dict[str, str]]:
    messages = body.get("messages")
    if messages is None:
        raise bad_request("messages is required", "messages", "missing_required_parameter")
    if not isinstance(messages, list) or not messages:
        raise bad_request(f"messages must be a non-empty list of messages, not {_show(messages)}", "messages",
                          "invalid_type")
    out = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise bad_request(f"{where} must be an object with role and content, not {_show(message)}", where,
                              "invalid_type")
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise bad_request(f"{where}.role must be a text such as \"user\", not {_show(role)}",
                              f"{where}.role", "invalid_type")
        out.append({"role": ROLE_ALIASES.get(role, role),
                    "content": _content(message.get("content"), f"{where}.content")})
    return out


def _content(content: Any, where: str) -> str:
    """A message's text: a string, or a list of text parts (joined by newlines); null is empty."""
    if content is None:
        return ""
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            text = part.get("text") if isinstance(part, dict) and part.get("type") == "text" else None
            if not isinstance(text, str):
                kind = part.get("type") if isinstance(part, dict) else _json_type(part)
                raise bad_request(f"{where}[{j}]: only text parts are supported, not {_show(kind)}",
                                  f"{where}[{j}]", "unsupported_value")
            texts.append(text)
        content = "\n".join(texts)
    if not isinstance(content, str):
        raise bad_request(f"{where} must be a text or a list of text parts, not {_show(content)}", where,
                          "invalid_type")
    return _valid(content, where)


def parse_prompt(body: Mapping[str, Any]) -> str | list[int]:
    """A text prompt: a string, a list holding one string, or token ids (a list of ints)."""
    prompt = body.get("prompt")
    if prompt is None:
        raise bad_request("prompt is required", "prompt", "missing_required_parameter")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # ["text"] or [[ids]]: one prompt
    if isinstance(prompt, str):
        if not prompt:
            raise bad_request("prompt is empty: there is nothing to continue", "prompt")
        return _valid(prompt, "prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool)
                                                   for t in prompt):
        return list(prompt)
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, str) for p in prompt):
        raise bad_request("one prompt per request: this server generates one completion at a time",
                          "prompt", "unsupported_value")
    raise bad_request(f"prompt must be a text or a list of token ids, not {_show(prompt)}", "prompt",
                      "invalid_type")


def _valid(text: str, where: str) -> str:
    try:
        return valid_text(text, where)
    except UsageProblem as e:  # lone surrogates ("\ud800") in the JSON
        raise bad_request(str(e), where) from None


def _json_type(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a text", bool: "a boolean", type(None): "null",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)


def _show(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."


# -- responses ------------------------------------------------------------------------------------------


def finish_reason(stop_reason: str) -> str:
    """OpenAI's finish_reason for the engine's stop reason: the output or the context ran out ("length"),
    or the reply ended (end of text, a stop text, or interrupted: "stop")."""
    return "length" if stop_reason in ("length", "context") else "stop"


def timings(stats: GenerationStats, drafter_loaded: bool) -> dict[str, Any]:
    """llama-server's `timings` (its names, so the tools that read them read ours): prompt tokens evaluated
    (`prompt_n`) and taken from the cache (`cache_n`), generation, and with a drafter loaded `draft_n` and
    `draft_n_accepted`, 0 and 0 when nothing was drafted (llama-server has them only when it drafted)."""
    prompt_ms = 1000 * stats.prompt_seconds
    predicted_ms = 1000 * stats.generation_seconds
    prompt_n, predicted_n = stats.n_prompt_evaluated, stats.n_generated
    out: dict[str, Any] = {
        "cache_n": stats.n_prompt - stats.n_prompt_evaluated,
        "prompt_n": prompt_n,
        "prompt_ms": round(prompt_ms, 3),
        "prompt_per_token_ms": round(prompt_ms / prompt_n, 3) if prompt_n else 0.0,
        "prompt_per_second": round(1000 * prompt_n / prompt_ms, 3) if prompt_ms > 0 else 0.0,
        "predicted_n": predicted_n,
        "predicted_ms": round(predicted_ms, 3),
        "predicted_per_token_ms": round(predicted_ms / predicted_n, 3) if predicted_n else 0.0,
        "predicted_per_second": round(1000 * predicted_n / predicted_ms, 3) if predicted_ms > 0 else 0.0,
    }
    if drafter_loaded:
        out["draft_n"] = stats.drafted
        out["draft_n_accepted"] = stats.accepted
    return out


def usage(stats: GenerationStats) -> dict[str, Any]:
    return {
        "prompt_tokens": stats.n_prompt,
        "completion_tokens": stats.n_generated,
        "total_tokens": stats.n_prompt + stats.n_generated,
        "prompt_tokens_details": {"cached_tokens": stats.n_prompt - stats.n_prompt_evaluated},
    }


def speculation(stats: GenerationStats, drafter: str | None) -> dict[str, Any]:
    """specli's own figures (an extension field OpenAI clients ignore): what the page's stats line shows,
    with `-k auto`'s reason for decoding most of the reply plainly (`auto_reason`, its one line, and
    `auto_holdback`, the figures it decided with; both null when it did not hold back)."""
    d = stats.as_dict()
    keys = ("stop_reason", "seed", "sampling_mode", "tokens_per_second", "acceptance_rate",
            "drafted", "accepted", "tokens_per_round", "predicted_speedup", "origins", "accepted_by_drafter",
            "auto_reason", "auto_holdback")
    return {"drafter": drafter, **{k: d[k] for k in keys}}


class Reply:
    """The shapes of one completion's responses: the whole body, or its stream's chunks."""

    def __init__(self, kind: str, model: str, drafter: str | None) -> None:
        self.kind, self.model, self.drafter = kind, model, drafter
        self.id = ("chatcmpl-" if kind == CHAT else "cmpl-") + secrets.token_hex(12)
        self.created = int(time.time())

    def _envelope(self, chunk: bool) -> dict[str, Any]:
        if self.kind == CHAT:
            kind = "chat.completion.chunk" if chunk else "chat.completion"
        else:
            kind = "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def _choice(self, text: str | None, finish: str | None, *, chunk: bool, role: bool = False) -> dict:
        choice: dict[str, Any] = {"index": 0}
        if self.kind == CHAT:
            if chunk:
                delta: dict[str, Any] = {"role": "assistant"} if role else {}
                if text is not None:
                    delta["content"] = text
                choice["delta"] = delta
            else:
                choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text or ""
        choice["logprobs"] = None
        choice["finish_reason"] = finish
        return choice

    def figures(self, stats: GenerationStats) -> dict[str, Any]:
        """llama-server's timings and specli's own figures."""
        return {"timings": timings(stats, self.drafter is not None),
                "speculation": speculation(stats, self.drafter)}

    def response(self, text: str, stats: GenerationStats) -> dict[str, Any]:
        """The non-streamed body: the text, usage, timings, and specli's figures."""
        return {**self._envelope(False),
                "choices": [self._choice(text, finish_reason(stats.stop_reason), chunk=False)],
                "usage": usage(stats), **self.figures(stats)}

    def first_chunk(self) -> dict[str, Any] | None:
        """The chat stream's opening chunk (the assistant's role, no text yet); none for text completions."""
        if self.kind != CHAT:
            return None
        return {**self._envelope(True), "choices": [self._choice("", None, chunk=True, role=True)]}

    def token_chunk(self, event: TokenEvent) -> dict[str, Any]:
        """One token's text, and where it came from (`origin`, and the drafter of an accepted token)."""
        return {**self._envelope(True), "choices": [self._choice(event.text, None, chunk=True)],
                "origin": event.origin.value, "drafter": event.drafter}

    def final_chunks(self, stats: GenerationStats, include_usage: bool) -> list[dict[str, Any]]:
        """The stream's end: the finish_reason chunk, then with include_usage a usage chunk with no
        choices; the last of them carries the timings (as llama-server) and specli's figures."""
        figures = self.figures(stats)
        last = {**self._envelope(True), "choices": [
            self._choice(None if self.kind == CHAT else "", finish_reason(stats.stop_reason), chunk=True)]}
        if not include_usage:
            return [{**last, **figures}]
        return [last, {**self._envelope(True), "choices": [], "usage": usage(stats), **figures}]


def sse(data: dict[str, Any] | str) -> bytes:
    """One server-sent event: `data: {json}` and a blank line."""
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"data: {text}\n\n".encode()


def error_chunk(error: ApiError) -> dict[str, Any]:
    """A failure after the stream began: a chunk holding `error` (the openai client raises APIError)."""
    return error.body()
