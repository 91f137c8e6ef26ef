"""A model's chat format: its chat template (ChatML when it has none or it does not work), how a rendered
conversation is tokenized, and the texts that end a reply. `specli chat` and `specli serve` both render
prompts through this, so a conversation reaches the model the same way from either."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from specli.builtin_templates import builtin_chat_template
from specli.chat_template import KNOWN_END_MARKERS, ChatTemplate, ChatTemplateError
from specli.llama import LlamaError, Model
from specli.settings import RunSettings
from specli.text import printable


def special_text(model: Model, token: int) -> str:
    """A special token's raw text (token_bytes renders special tokens as nothing); "" for none."""
    if not 0 <= token < model.n_vocab:  # models without a BOS/EOS report -1
        return ""
    return model.token_text(token).decode("utf-8", errors="replace")


# Turn formats llama.cpp knows by name (llama_chat_builtin_templates), for a GGUF without a chat template:
# the first whose turn markers are each one special token of the vocabulary is the model's family's.
FAMILY_FORMATS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("gemma", ("<start_of_turn>", "<end_of_turn>")),
    ("llama3", ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")),
    ("phi3", ("<|user|>", "<|assistant|>", "<|end|>")),
    ("chatml", ("<|im_start|>", "<|im_end|>")),
)
NO_TEMPLATE = ("{name} has no chat template, as base models (not tuned to chat) usually do: it continues "
               "text more than it answers; ")


class BuiltinTemplate:
    """A chat format llama.cpp renders itself (its built-in `name`), for a GGUF that carries no template:
    what ChatTemplate offers, over builtin_templates.builtin_chat_template."""

    is_fallback = False

    def __init__(self, name: str, markers: tuple[str, ...]) -> None:
        self.name, self.markers = name, markers
        self.source = f"llama.cpp's built-in {name!r} format"

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True) -> str:
        try:
            return builtin_chat_template(self.name, [(str(m["role"]), str(m["content"])) for m in messages],
                                         add_generation_prompt)
        except LlamaError as e:
            raise ChatTemplateError(str(e)) from None

    def starts_with_bos(self, rendered: str) -> bool:
        return False  # llama.cpp's formats leave BOS to the tokenizer

    def stop_strings(self) -> list[str]:
        return [m for m in self.markers if m in KNOWN_END_MARKERS]


def family_format(model: Model) -> BuiltinTemplate | None:
    """The turn format of the model's family, where its vocabulary has that format's markers as special
    tokens (Gemma 3 270M, a base model, has <start_of_turn> and <end_of_turn>); None if none fits."""
    for name, markers in FAMILY_FORMATS:
        if all(len(model.tokenize(m, add_special=False, parse_special=True)) == 1 for m in markers):
            return BuiltinTemplate(name, markers)
    return None


def build_chat_template(model: Model) -> tuple[ChatTemplate | BuiltinTemplate, str | None]:
    """The model's chat template and a notice when it is not the GGUF's own: without one, the turn
    format of the model's family that llama.cpp knows, else ChatML; ChatML too when the GGUF's does not
    work.

    BOS/EOS are the vocabulary's raw texts: token_bytes renders special tokens as nothing.
    """
    vocab = model.vocab_info()
    bos, eos = special_text(model, vocab.bos), special_text(model, vocab.eos)
    source = model.chat_template()
    name = printable(model.path.name)
    if source is None or not source.strip():
        family = family_format(model)
        if family is not None and family.name != "chatml":
            return family, NO_TEMPLATE.format(name=name) + f"using its family's turn format ({family.source})"
        return (ChatTemplate.from_strings(None, bos, eos),
                NO_TEMPLATE.format(name=name) + "using ChatML (<|im_start|>role ... <|im_end|>)")
    try:
        template = ChatTemplate.from_strings(source, bos, eos)
        # A trial render catches templates that only fail when used (unknown filters, bad globals).
        template.render([{"role": "user", "content": "hi"}], add_generation_prompt=True)
        return template, None
    except ChatTemplateError as e:
        notice = f"{name}'s chat template does not work ({e}): using ChatML"
        return ChatTemplate.from_strings(None, bos, eos), notice


@dataclass(frozen=True)
class ChatFormat:
    """The target's chat template with what goes with it. `stops`: the template's end-of-turn markers and
    the EOS text, where a reply ends even when the model writes them as text."""

    model: Model
    template: ChatTemplate | BuiltinTemplate
    notice: str | None  # why the template is not the GGUF's own, for the user; None: the model's own
    stops: tuple[str, ...]
    base_model: bool = False  # the GGUF carries no chat template: most likely a base model

    @classmethod
    def for_model(cls, model: Model, template: ChatTemplate | None = None) -> ChatFormat:
        notice = None
        if template is None:
            template, notice = build_chat_template(model)
        eos = special_text(model, model.vocab_info().eos)
        stops = tuple(dict.fromkeys(s for s in [*template.stop_strings(), eos] if s))
        source = model.chat_template()
        return cls(model, template, notice, stops, base_model=source is None or not source.strip())

    @property
    def template_kind(self) -> str:
        """What renders the turns: "gguf" (the model's own), llama.cpp's built-in format, or ChatML."""
        if isinstance(self.template, BuiltinTemplate):
            return f"llama.cpp's {self.template.name} (the GGUF has none)"
        return "fallback ChatML" if self.template.is_fallback else "gguf"

    def render(self, messages: Sequence[Mapping[str, Any]]) -> str:
        """The conversation with the assistant's turn opened; ChatTemplateError when it cannot render."""
        return self.template.render(messages, add_generation_prompt=True)

    def tokenize(self, text: str, *, fit: int | None = None) -> list[int]:
        """Tokens of a rendered prompt: BOS added only if the template did not write it already.
        fit: PromptTooLong if they cannot fit a context of that many tokens (Model.tokenize)."""
        add_special = not self.template.starts_with_bos(text)
        tokens = self.model.tokenize(text, add_special=add_special, parse_special=True, fit=fit)
        vocab = self.model.vocab_info()
        if add_special and vocab.add_eos and tokens and tokens[-1] == vocab.eos:
            tokens.pop()  # an EOS after the generation prompt would end the reply before it starts
        return tokens

    def reply_settings(self, settings: RunSettings) -> RunSettings:
        """`settings` for a reply: also stopping where the template ends a turn."""
        return replace(settings, stop=tuple(dict.fromkeys((*settings.stop, *self.stops))))
