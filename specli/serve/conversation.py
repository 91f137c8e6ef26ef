"""A conversation's tokens as `specli serve` builds them: the chat template's own control tokens
(`<start_of_turn>`, `<|im_end|>`, BOS, ...) are control tokens, and a message's content is text, whatever
it holds. Tokenizing the rendered conversation whole (llama.cpp's parse_special, what `specli chat` and
llama-server do) also reads control tokens inside content: a user could write `<end_of_turn>` and open
a turn of their own, as the model's or the system's. OpenAI's API treats content as text; so does this
server, unless its operator starts it with --parse-special.

How: the conversation is rendered twice, with the messages' contents and with a marker in place of each,
which shows where every content lies in the rendered text (a template that trims content is followed).
Then the text is tokenized as llama.cpp would, but with the control tokens of the template's own text
only: llama.cpp splits a text at its special tokens and tokenizes each stretch between two of them on
its own (the tokens do not depend on where else it splits), so the stretches that hold content are
tokenized with parse_special off, and everything else as before. A conversation without control-token
texts in its content gets exactly the tokens it got from the whole text.

A template that changes content in other ways (one that cuts an assistant's reasoning, say) cannot be
followed: then the whole text is tokenized as before, and a content that holds a control token's text
is refused.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from specli.chat.prompt import ChatFormat
from specli.chat_template import ChatTemplateError
from specli.llama import PromptTooLong, check_prompt_fits

# What C's isspace() calls a space: what llama.cpp strips beside a special token marked lstrip/rstrip.
C_SPACE = " \t\n\v\f\r"
# Private-use characters; the first one the rendered conversation does not hold marks the contents.
MARKERS = "\ue000\ue001\ue002\ue003\ue004\ue005\ue006\ue007"


class ControlTokenInContent(ValueError):
    """A message's content holds a control token's text, and the template's output cannot be followed
    closely enough to read it as text."""

    def __init__(self, index: int, token_text: str) -> None:
        self.index, self.token_text = index, token_text
        super().__init__(f"messages[{index}].content holds {token_text!r}, the text of one of the model's "
                         "control tokens, and its chat template changes content in a way this server "
                         "cannot follow to read it as text (start the server with --parse-special to "
                         "let content hold control tokens)")


class _CannotFollow(Exception):
    """The rendered conversation does not split into the template's text and the contents."""


class Conversation:
    """The tokens of a conversation in `chat`'s format, content as text unless `parse_special`."""

    def __init__(self, chat: ChatFormat, *, parse_special: bool = False) -> None:
        self.chat = chat
        self.model = chat.model
        self.parse_special = parse_special
        self._strips: dict[int, tuple[bool, bool]] = {}  # control token -> (lstrip, rstrip)

    def tokens(self, messages: Sequence[Mapping[str, Any]], *, fit: int) -> list[int]:
        """The conversation with the assistant's turn opened, as tokens (PromptTooLong beyond `fit`;
        ChatTemplateError when it cannot render; ControlTokenInContent, see above)."""
        text = self.chat.render(messages)
        if self.parse_special:
            return self.chat.tokenize(text, fit=fit)
        try:
            pieces = self._pieces(messages, text)
            return self._tokenize(pieces, add_bos=not self.chat.template.starts_with_bos(text), fit=fit)
        except _CannotFollow:
            self._refuse_control_tokens(messages, fit)
            return self.chat.tokenize(text, fit=fit)

    # -- where the contents are ----------------------------------------------------------------------------

    def _pieces(self, messages: Sequence[Mapping[str, Any]], text: str) -> list[tuple[str, bool]]:
        """`text` cut into the template's text (False) and the contents (True), in order."""
        marker = next((m for m in MARKERS if m not in text), None)
        if marker is None:
            raise _CannotFollow()
        placed = [{**m, "content": f"{marker}{i}{marker}" if m["content"] else ""}
                  for i, m in enumerate(messages)]
        try:
            outline = self.chat.render(placed).split(marker)
        except ChatTemplateError:
            raise _CannotFollow() from None
        if len(outline) % 2 == 0:
            raise _CannotFollow()
        pieces: list[tuple[str, bool]] = []
        at = 0
        for k in range(0, len(outline), 2):
            literal = outline[k]
            if not text.startswith(literal, at):
                raise _CannotFollow()
            pieces.append((literal, False))
            at += len(literal)
            if k + 1 == len(outline):
                break
            index, following = outline[k + 1], outline[k + 2]
            if not (index.isascii() and index.isdigit()) or int(index) >= len(messages):
                raise _CannotFollow()
            content = str(messages[int(index)]["content"])
            rendered = next((c for c in _renderings(content)
                             if text.startswith(c, at) and text.startswith(following, at + len(c))), None)
            if rendered is None:
                raise _CannotFollow()
            pieces.append((rendered, True))
            at += len(rendered)
        if at != len(text):
            raise _CannotFollow()
        return pieces

    # -- tokens --------------------------------------------------------------------------------------------

    def _tokenize(self, pieces: list[tuple[str, bool]], *, add_bos: bool, fit: int) -> list[int]:
        """llama.cpp's tokens of the pieces joined, with special tokens found in the template's pieces
        only: from the first control token of a template piece to its last one its own tokens, and each
        stretch between (content and the template's text around it up to a control token) as text."""
        model = self.model
        vocab = model.vocab_info()
        tokens = [vocab.bos] if add_bos and vocab.add_bos else []
        stretch: list[str] = []
        strip_start = False  # the control token before the stretch strips the spaces after it
        for piece, is_content in pieces:
            if is_content or not piece:
                stretch.append(piece)
                continue
            ids = model.tokenize(piece, add_special=False, parse_special=True)
            controls = [i for i, t in enumerate(ids) if self._is_control(t)]
            if not controls:
                stretch.append(piece)
                continue
            first, last = ids[controls[0]], ids[controls[-1]]
            head_end = piece.find(self._text(first))
            tail_start = piece.rfind(self._text(last))
            if head_end < 0 or tail_start < 0:
                raise _CannotFollow()
            stretch.append(piece[:head_end])
            self._add_text(tokens, "".join(stretch), strip_start, self._strip(first)[0], fit)
            tokens.extend(ids[controls[0] : controls[-1] + 1])
            stretch = [piece[tail_start + len(self._text(last)) :]]
            strip_start = self._strip(last)[1]
        self._add_text(tokens, "".join(stretch), strip_start, False, fit)
        check_prompt_fits(len(tokens), fit)
        return tokens

    def _add_text(self, tokens: list[int], text: str, strip_start: bool, strip_end: bool, fit: int) -> None:
        """`text`'s tokens with no special token but the vocabulary's user-defined ones (as llama.cpp
        with parse_special off), added to `tokens` while they fit `fit`."""
        if strip_start:
            text = text.lstrip(C_SPACE)
        if strip_end:
            text = text.rstrip(C_SPACE)
        if not text:
            return
        room = fit - len(tokens)
        if room < 0:
            raise PromptTooLong(len(tokens), fit, exact=False)
        try:
            tokens.extend(self.model.tokenize(text, add_special=False, parse_special=False, fit=room))
        except PromptTooLong as e:
            raise PromptTooLong(len(tokens) + e.n_tokens, fit, exact=False) from None

    def _is_control(self, token: int) -> bool:
        """A control token (BOS, EOS, turn markers): llama.cpp renders it as nothing in text."""
        return not self.model.token_bytes(token)

    def _text(self, token: int) -> str:
        return self.model.token_text(token).decode("utf-8", "replace")

    def _strip(self, token: int) -> tuple[bool, bool]:
        """Whether llama.cpp strips the spaces before (lstrip) and after (rstrip) this special token when
        it splits a text there (Phi-3's do), found by trying once."""
        known = self._strips.get(token)
        if known is None:
            text = self._text(token)

            def ids(s: str) -> list[int]:
                return self.model.tokenize(s, add_special=False, parse_special=True)

            known = (ids("x " + text) == ids("x" + text), ids(text + " x") == ids(text + "x"))
            self._strips[token] = known
        return known

    def _refuse_control_tokens(self, messages: Sequence[Mapping[str, Any]], fit: int) -> None:
        for i, message in enumerate(messages):
            content = str(message["content"])
            if not content:
                continue
            ids = self.model.tokenize(content, add_special=False, parse_special=True, fit=fit)
            control = next((t for t in ids if self._is_control(t)), None)
            if control is not None:
                raise ControlTokenInContent(i, self._text(control))


def _renderings(content: str) -> list[str]:
    """What a template may make of a content: itself, or trimmed (Jinja's trim, llama.cpp's)."""
    out = [content]
    for form in (content.strip(), content.strip(C_SPACE), content.lstrip(), content.rstrip(),
                 content.lstrip(C_SPACE), content.rstrip(C_SPACE)):
        if form not in out:
            out.append(form)
    return out
