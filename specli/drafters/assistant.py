"""Drafting with a Gemma 4 assistant: a separate small GGUF (`gemma4-assistant`) that reads the target's
KV cache and its last hidden state, as llama.cpp's draft-mtp runs it in its shared-memory mode.

A draft starts at the round's pending token x_n (not yet in the target's cache), read with the target's
post-norm hidden state h_{n-1}, which predicted it; each drafted token is then read with the
assistant's own output state, every step at the same position n (the assistant was trained so, and
attends over the target's cache, which holds positions < n). The assistant keeps nothing between
rounds: after a rejection the target's cache is rolled back and so is everything the assistant sees,
so there is no catch-up, no debt, nothing of its own to roll back.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from specli.drafters.base import Draft, Drafter, DraftGate, Source, draft_filters, draft_positions
from specli.heads import AssistantContext, HeadModel
from specli.llama import Model
from specli.sampling import Noise, Sampler, SamplingParams, Survivors


class AssistantDrafter(Drafter):
    """Drafts with the Gemma 4 assistant `head` (a HeadModel it takes over) for `target`, which must be
    loaded recording its hidden states (ModelOptions.load_mtp). p_min: --draft-p-min."""

    def __init__(self, target: Model, head: HeadModel, name: str, *, p_min: float = 0.0) -> None:
        self.name = name
        self.sources = (Source(name),)
        self.target = target
        self.assistant = AssistantContext(head, target)
        self.p_min = p_min
        self._sampler = Sampler(SamplingParams(temperature=0.0), Noise(0))

    def begin(self, context: list[int], sampler: Sampler) -> None:
        self._sampler = sampler
        # Its rows are filtered in llama.cpp's graph where the run filters the target's there.
        self.assistant.set_filters(draft_filters(sampler, self.assistant.n_vocab))

    def warm_up(self) -> tuple[str, ...]:
        # A process's first step costs ~1.5x a later one here: paid at load, the first look is a warm
        # one (CostModel.warmed), which alone settles a declined verdict. Position 0 reads nothing of
        # the target's cache (empty at load) and the assistant keeps nothing: no state to restore.
        if self.target.n_past:
            return ()
        self.assistant.step(max(0, self.target.vocab_info().bos), 0, None)
        return tuple(source.name for source in self.sources)

    def draft(self, context: list[int], k: int, gate: DraftGate | None = None) -> Draft:
        target, assistant = self.target, self.assistant
        pos = len(context) - 1  # the pending token's position
        if target.n_past != pos:
            # Its attention reads the target's cache, which must hold exactly the tokens before it.
            raise RuntimeError(f"the assistant drafts at position {pos}, the target's cache holds "
                               f"{target.n_past}")
        row, h = assistant.step(context[-1], pos, target.hidden_rows(pos - 1, pos)[0] if pos else None)

        def next_row(token: int) -> np.ndarray | Survivors:
            nonlocal h
            next_logits, h = assistant.step(token, pos, h)
            return next_logits

        return draft_positions(row, next_row, k, len(context), self._sampler, width=target.n_vocab,
                               p_min=self.p_min, gate=gate, name=self.name, catch_up_seconds=0.0)

    def set_p_min(self, p_min: float) -> None:
        self.p_min = p_min

    @property
    def head_files(self) -> list[Path]:
        return [self.assistant.head.path]

    @property
    def decode_seconds(self) -> float:
        return self.assistant.decode_seconds

    def close(self) -> None:
        self.assistant.close()
