"""Token ids to text events: never splits a UTF-8 character, and never shows a stop string."""

from __future__ import annotations

import codecs
from collections.abc import Sequence

from specli.events import TokenEvent
from specli.llama import Model


class TextStream:
    """Turns token ids into text events: never splits a UTF-8 character, and holds back text that
    could be the start of a stop string, so a stop string is never shown."""

    def __init__(self, model: Model, stop: Sequence[str]) -> None:
        self.model = model
        self.stop = [s for s in stop if s]
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._held: list[TokenEvent] = []
        self.text_parts: list[str] = []
        self.tokens: list[int] = []
        self.stopped = False

    def push(self, event: TokenEvent) -> list[TokenEvent]:
        """Add one token's event; return the events now safe to release."""
        event.text = self._decoder.decode(self.model.token_bytes(event.token))
        if not self.stop:  # nothing is ever held
            return self._released([event])
        self._held.append(event)
        held_text = "".join(e.text for e in self._held)
        hits = [i for i in (held_text.find(s) for s in self.stop) if i >= 0]
        if hits:
            self.stopped = True
            return self._release_chars(min(hits))
        # Hold back the longest suffix that is a prefix of a stop string.
        hold = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(held_text)), hold, -1):
                if held_text.endswith(s[:n]):
                    hold = n
                    break
        return self._release_chars(len(held_text) - hold, keep_rest=True)

    def push_all(self, events: list[TokenEvent]) -> None:
        """push() for a round's events when no stop string is watched: each gets its text, and all
        are released."""
        assert not self.stop
        decode, piece = self._decoder.decode, self.model.token_bytes
        for e in events:
            e.text = decode(piece(e.token))
        self.text_parts.extend([e.text for e in events])
        self.tokens.extend([e.token for e in events])

    def _release_chars(self, n_chars: int, keep_rest: bool = False) -> list[TokenEvent]:
        out, used = [], 0
        while self._held:
            e = self._held[0]
            if used + len(e.text) <= n_chars:
                used += len(e.text)
                out.append(self._held.pop(0))
            elif not keep_rest:
                # The token in which the stop string starts keeps the text before it; one that the
                # stop string starts at the very beginning of is not part of the output at all.
                if n_chars > used:
                    e.text = e.text[: n_chars - used]
                    out.append(self._held.pop(0))
                break
            else:
                break
        if not keep_rest:
            self._held.clear()
        return self._released(out)

    def _release(self, n_events: int) -> list[TokenEvent]:
        out, self._held = self._held[:n_events], self._held[n_events:]
        return self._released(out)

    def _released(self, events: list[TokenEvent]) -> list[TokenEvent]:
        for e in events:
            self.text_parts.append(e.text)
            self.tokens.append(e.token)
        return events

    def flush(self) -> list[TokenEvent]:
        """End of generation: release what is held (it did not become a stop string)."""
        tail = self._decoder.decode(b"", final=True)
        if tail and self._held:
            self._held[-1].text += tail
        return self._release(len(self._held))

    @property
    def text(self) -> str:
        return "".join(self.text_parts)
