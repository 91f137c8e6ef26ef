"""A model's chat format: its chat template (ChatML when it has none or it does not work), how a rendered
conversation is tokenized, and the texts that end a reply. `specli chat` and `specli serve` both render
prompts through this, so a conversation reaches the model the same way from either."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from specli.chat_template import ChatTemplate, ChatTemplateError
from specli.llama import Model
from specli.settings import RunSettings
from specli.text import printable


def special_text(model: Model, token: int) -> str:
    """A special token's raw text (token_bytes renders special tokens as nothing); "" for none."""
    if not 0 <= token < model.n_vocab:  # models without a BOS/EOS report -1
        return ""
    return model.token_text(token).decode("utf-8", errors="replace")


def build_chat_template(model: Model) -> tuple[ChatTemplate, str | None]:
    """The model's chat template (ChatML if it has none or it does not work) and a notice if fallen back.

    BOS/EOS are the vocabulary's raw texts: token_bytes renders special tokens as nothing.
    """
    vocab = model.vocab_info()
    bos, eos = special_text(model, vocab.bos), special_text(model, vocab.eos)
    source = model.chat_template()
    name = printable(model.path.name)
    if source is None or not source.strip():
        return (ChatTemplate.from_strings(None, bos, eos),
                f"{name} has no chat template: using ChatML (<|im_start|>role ... <|im_end|>)")
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
    template: ChatTemplate
    notice: str | None  # why the template is a fallback, for the user; None: the model's own
    stops: tuple[str, ...]

    @classmethod
    def for_model(cls, model: Model, template: ChatTemplate | None = None) -> ChatFormat:
        notice = None
        if template is None:
            template, notice = build_chat_template(model)
        eos = special_text(model, model.vocab_info().eos)
        stops = tuple(dict.fromkeys(s for s in [*template.stop_strings(), eos] if s))
        return cls(model, template, notice, stops)

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
