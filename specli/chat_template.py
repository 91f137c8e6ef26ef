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
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = [
    "CHATML_TEMPLATE",
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
_KNOWN_END_MARKERS: tuple[str, ...] = (
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
    line = " ".join(str(text).split())
    if len(line) > _MAX_ERROR_LEN:
        line = line[: _MAX_ERROR_LEN - 3] + "..."
    return line


def _make_environment(now: datetime) -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        loader=jinja2.BaseLoader(),
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationTag, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
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
        try:
            return self._compiled.render(**context)
        except _TemplateRaised as exc:
            raise ChatTemplateError(str(exc)) from exc
        except ChatTemplateError:
            raise
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
            raise ChatTemplateError(f"chat template failed to render: {type(exc).__name__}: {exc}") from exc

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
            found = [m for m in _KNOWN_END_MARKERS if m in text]
        eos = self.eos_token
        if eos and "eos_token" in text and _SPECIAL_LOOKING.match(eos) and eos not in found:
            found.append(eos)
        return found

    def __repr__(self) -> str:
        kind = "fallback ChatML" if self.is_fallback else f"{len(self.source)} chars"
        return f"ChatTemplate({kind}, bos={self.bos_token!r}, eos={self.eos_token!r})"
