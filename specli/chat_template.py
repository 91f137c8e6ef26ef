"""Render chat prompts with a model's Jinja2 chat template (HF-compatible).

The environment mirrors what Hugging Face transformers (and llama-cpp-python) give a chat
template: a sandboxed Jinja2 environment with ``trim_blocks``/``lstrip_blocks``, the
``loopcontrols`` extension, a pass-through ``{% generation %}`` tag, a ``raise_exception``
global, a ``strftime_now`` global and an HF-style ``tojson`` filter.  Templates are rendered
with ``messages``, ``bos_token``, ``eos_token``, ``add_generation_prompt`` and, optionally,
``tools`` plus any extra keyword variables.

Prefix property (for keeping the KV cache across chat turns): for the usual templates
(ChatML/Qwen2, Llama 3/3.1, Mistral ``[INST]``, Gemma, Phi-3), if ``p1`` is
``render(history, add_generation_prompt=True)`` and the model answers ``reply``, then
``render(history + [assistant reply, next user message])`` starts with ``p1 + reply``.  The
engine therefore only has to evaluate the new suffix.  Some templates break this on purpose
(e.g. ones that strip earlier reasoning blocks, or that ``trim`` replies with surrounding
whitespace), so callers should compare the token sequences rather than assume it (the engine
keeps the cache's longest common token prefix with each new prompt: ``Model.keep_common_prefix``).
Rendering itself is deterministic: ``strftime_now`` uses a clock frozen when the
:class:`ChatTemplate` is built, so a date in the system prompt does not change in the middle of a
session.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from specli.text import printable

__all__ = [
    "CHATML_TEMPLATE",
    "KNOWN_END_MARKERS",
    "ChatTemplate",
    "ChatTemplateError",
]

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""ChatML template used when the model ships no chat template."""

# End-of-turn markers we know of, in the order they are reported by ``stop_strings``.
KNOWN_END_MARKERS: tuple[str, ...] = (
    "<|im_end|>",  # ChatML (Qwen, Yi, many fine-tunes)
    "<|eot_id|>",  # Llama 3.x
    "<|eom_id|>",  # Llama 3.1 tool ("ipython") turns
    "<|eot|>",  # Llama 4
    "<|end|>",  # Phi-3 / Phi-3.5
    "<end_of_turn>",  # Gemma
    "<|END_OF_TURN_TOKEN|>",  # Command-R
    "<\uff5cend\u2581of\u2581sentence\uff5c>",  # DeepSeek ("<｜end▁of▁sentence｜>")
    "<|endoftext|>",
    "<|end_of_text|>",
)
# Harmony (gpt-oss) ends intermediate messages with <|end|>; only these end the answer.
_HARMONY_END_MARKERS: tuple[str, ...] = ("<|return|>", "<|call|>")
_SPECIAL_LOOKING = re.compile(r"^<[|\uff5c].+[|\uff5c]>$")

_MAX_ERROR_LEN = 300


class ChatTemplateError(Exception):
    """A chat template failed to compile or render (the message is a single line)."""

    def __init__(self, message: str) -> None:
        super().__init__(_one_line(message))


class _TemplateRaised(Exception):
    """Raised by the template's own ``raise_exception(...)`` call."""


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` (HF assistant-mask marker): render the body as-is."""

    tags = {"generation"}

    def parse(self, parser: Any) -> list[Any]:
        next(parser.stream)  # the "generation" name token
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """HF-style ``tojson``: plain ``json.dumps`` (no HTML escaping, unicode kept)."""
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise_exception(message: str) -> None:
    raise _TemplateRaised(str(message))


def _one_line(text: object) -> str:
    # printable(): a template's own error text may carry escape codes meant for the terminal
    line = printable(" ".join(str(text).split()))
    if len(line) > _MAX_ERROR_LEN:
        line = line[: _MAX_ERROR_LEN - 3] + "..."
    return line


# -- bounds: a chat template comes inside a downloaded file, and rendering it must always end ----------

# Python lines a render may execute (the template's compiled code and the Jinja runtime and filters it
# calls): 400 messages through a Llama 3 template take about 27,000; a nested loop of ranges
# (the sandbox caps one range at 100,000 items) would run for hours.
MAX_RENDER_LINES = 5_000_000
# Characters one operation may make, and a whole prompt may have (far beyond any context).
MAX_RENDER_CHARS = 1 << 24


class TemplateTooCostly(Exception):
    """A render went past MAX_RENDER_LINES or MAX_RENDER_CHARS."""


def _too_big(size: float, what: str) -> None:
    if size > MAX_RENDER_CHARS:
        raise TemplateTooCostly(f"{what} would make {size:,.0f} characters (at most {MAX_RENDER_CHARS:,})")


_WIDTHS = re.compile(r"%[-+ #0]*(\d+)?(?:\.(\d+))?|\{[^{}]*?:[^{}]*?(\d+)(?:\.(\d+))?[^{}]*\}")


_ARGUMENT_WIDTH = re.compile(r"%[-+ #0]*\*|%[-+ #0]*\d*\.\*|\{[^{}]*:[^{}]*\{")


def _check_format(spec: str, args: Any = ()) -> None:
    """printf (`%0999999999d`) and str.format (`{:999999999}`) widths: each makes a string that long;
    where the width is an argument (`%*d`, `{:{}}`), the arguments' numbers count as widths."""
    for match in _WIDTHS.finditer(spec):
        for number in match.groups():
            if number:
                _too_big(int(number), f"the width {number} in {spec[:40]!r}")
    if _ARGUMENT_WIDTH.search(spec):
        values = args.values() if isinstance(args, Mapping) else args if isinstance(args, tuple) else (args,)
        for value in values:
            if isinstance(value, int) and not isinstance(value, bool):
                _too_big(value, f"a width given to {spec[:40]!r}")


def _amplified(method: str, text: str, args: tuple[Any, ...]) -> float:
    """The length of `text.method(*args)` where a str method can make a string far longer than its
    inputs, 0 for the others."""
    if method in ("center", "ljust", "rjust", "zfill") and args and isinstance(args[0], int):
        return args[0]
    if method == "expandtabs":
        tab = args[0] if args and isinstance(args[0], int) else 8
        return len(text) + text.count("\t") * tab
    if method == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
        count = text.count(args[0]) if args[0] else len(text) + 1
        return len(text) + count * len(args[1])
    return 0


class _BoundedEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox, plus checks on what Python does in C where the line budget cannot see: big powers,
    repetition, padding, replacement and format widths."""

    intercepted_binops = frozenset({"*", "**", "%"})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int):
                    _too_big(len(seq) * n, "repeating a sequence")
        elif operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1:
            if right * math.log2(abs(left)) > 4 * MAX_RENDER_CHARS:
                raise TemplateTooCostly(f"{left} ** {right} is too large a number")
        elif operator == "%" and isinstance(left, str):
            _check_format(left, right)
        return super().call_binop(context, operator, left, right)

    def wrap_str_format(self, value: Any) -> Any:
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        spec = value.__self__

        def checked(*args: Any, **kwargs: Any) -> Any:
            _check_format(spec, (*args, *kwargs.values(), *(a for m in args if isinstance(m, Mapping)
                                                            for a in m.values())))
            return wrapped(*args, **kwargs)

        return checked

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        owner = getattr(__obj, "__self__", None)
        if isinstance(owner, str):
            name = getattr(__obj, "__name__", "")
            _too_big(_amplified(name, owner, args), f"str.{name}")
        return super().call(__context, __obj, *args, **kwargs)


def _checked_filter(name: str, filter_function: Any, size: Any) -> Any:
    def checked(value: Any, *args: Any, **kwargs: Any) -> Any:
        _too_big(size(value, *args, **kwargs), f"the {name} filter")
        return filter_function(value, *args, **kwargs)

    return checked


def _format_size(value: Any, *args: Any, **kwargs: Any) -> int:
    _check_format(str(value), kwargs or args)
    return 0


def _indent_size(value: Any, width: Any = 4, *args: Any, **kwargs: Any) -> float:
    step = width if isinstance(width, int) else len(str(width))
    return len(str(value)) + (str(value).count("\n") + 1) * step


class _LineBudget:
    """A trace function counting the Python lines a render executes (in this thread only)."""

    def __init__(self, limit: int) -> None:
        self.left = limit

    def __call__(self, frame: Any, event: str, arg: Any) -> Any:
        if event == "line":
            self.left -= 1
            if self.left < 0:
                raise TemplateTooCostly(f"it ran more than {MAX_RENDER_LINES:,} lines of template code")
        return self


def _make_environment(now: datetime) -> ImmutableSandboxedEnvironment:
    env = _BoundedEnvironment(
        loader=jinja2.BaseLoader(),
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationTag, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    for name, size in (("center", lambda value, width=80, *a, **k: width if isinstance(width, int) else 0),
                       ("indent", _indent_size), ("format", _format_size),
                       ("replace", lambda value, old, new, *a, **k: _amplified("replace", str(value),
                                                                               (str(old), str(new))))):
        env.filters[name] = _checked_filter(name, env.filters[name], size)
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = now.strftime
    return env


def _normalize_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        if isinstance(m, Mapping):
            if not isinstance(m.get("role"), str):
                raise ChatTemplateError(f"message {i} has no string 'role'")
            out.append(dict(m))
        else:
            raise ChatTemplateError(f"message {i} is a {type(m).__name__}, expected a dict")
    return out


class ChatTemplate:
    """A compiled chat template plus the BOS/EOS token texts it is rendered with."""

    def __init__(
        self,
        template: str | None,
        bos_token: str = "",
        eos_token: str = "",
        *,
        now: datetime | None = None,
    ) -> None:
        self.is_fallback: bool = template is None or not template.strip()
        self.source: str = CHATML_TEMPLATE if self.is_fallback else str(template)
        self.bos_token: str = bos_token or ""
        self.eos_token: str = eos_token or ""
        self.now: datetime = now if now is not None else datetime.now()
        env = _make_environment(self.now)
        try:
            self._compiled = env.from_string(self.source)
        except jinja2.TemplateSyntaxError as exc:
            raise ChatTemplateError(f"invalid chat template: {exc.message} (line {exc.lineno})") from exc
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"invalid chat template: {exc}") from exc

    @classmethod
    def from_strings(
        cls, template: str | None, bos: str, eos: str, *, now: datetime | None = None
    ) -> ChatTemplate:
        """Build from the template text (None -> ChatML fallback) and BOS/EOS token texts."""
        return cls(template, bos, eos, now=now)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        **extra: Any,
    ) -> str:
        """Render ``messages`` to prompt text; raises :class:`ChatTemplateError` on failure."""
        context: dict[str, Any] = dict(extra)
        context.update(
            messages=_normalize_messages(messages),
            bos_token=self.bos_token,
            eos_token=self.eos_token,
            add_generation_prompt=add_generation_prompt,
        )
        if tools is not None:
            context["tools"] = [dict(t) for t in tools]
        previous = sys.gettrace()
        sys.settrace(_LineBudget(MAX_RENDER_LINES))
        try:
            parts, size = [], 0
            for part in self._compiled.generate(**context):
                size += len(part)
                _too_big(size, "the prompt")
                parts.append(part)
            return "".join(parts)
        except _TemplateRaised as exc:
            raise ChatTemplateError(str(exc)) from exc
        except ChatTemplateError:
            raise
        except TemplateTooCostly as exc:
            raise ChatTemplateError(f"chat template stopped: {exc}") from exc
        except Exception as exc:  # whatever a template does wrong (RecursionError too), it is the template's
            raise ChatTemplateError(f"chat template failed to render: {type(exc).__name__}: {exc}") from exc
        finally:
            sys.settrace(previous)

    def starts_with_bos(self, rendered: str) -> bool:
        """True if ``rendered`` already begins with the BOS text (tokenize it with add_special=False).

        If False, follow the model's own add-BOS setting when tokenizing.
        """
        return bool(self.bos_token) and rendered.startswith(self.bos_token)

    def stop_strings(self) -> list[str]:
        """End-of-turn markers found in the template text, to stop on if EOS is not emitted as a token.

        Includes the EOS text when the template uses ``eos_token`` and it looks like a special
        token (``<|...|>``), so that plain-text EOS such as ``</s>`` is not treated as a stop.
        Harmony (gpt-oss) templates get ``<|return|>``/``<|call|>`` only, since ``<|end|>`` there
        closes intermediate messages.
        """
        text = self.source
        if "<|channel|>" in text:
            found = list(_HARMONY_END_MARKERS)
        else:
            found = [m for m in KNOWN_END_MARKERS if m in text]
        eos = self.eos_token
        if eos and "eos_token" in text and _SPECIAL_LOOKING.match(eos) and eos not in found:
            found.append(eos)
        return found

    def __repr__(self) -> str:
        kind = "fallback ChatML" if self.is_fallback else f"{len(self.source)} chars"
        return f"ChatTemplate({kind}, bos={self.bos_token!r}, eos={self.eos_token!r})"
