"""EAGLE-3: a trained one-layer head that drafts from three of the target's hidden layers.

As llama.cpp's draft-eagle3 (common/speculative.cpp): the head's position p reads the token at p + 1
with g_p, the encoding of the target's features at p, and its logits there predict the token at
p + 2; a drafted token is read with the head's own pre-norm state one position before in place of g
(the target has not evaluated it). Committed positions are caught up when a draft is asked for, from
the features the target recorded at each decode (verify batches included), so nothing a plain round
decoded is lost and nothing is evaluated twice. Position n - 2 (the pending token with the last
evaluated g) is decoded with each draft, the drafted positions dropped right after: the head's cache
then holds committed pairs only, as a fresh run's would at that position.
"""

from __future__ import annotations

import time

import numpy as np

from specli.drafters.base import (
    CATCH_UP_TIMED,
    Draft,
    DraftGate,
    draft_filters,
    draft_positions,
    timed_catch_up,
)
from specli.drafters.head import HeadDrafter
from specli.heads import Eagle3Context, HeadModel
from specli.llama import Model
from specli.sampling import Sampler


class Eagle3Drafter(HeadDrafter):
    """Drafts with an EAGLE-3 head (HeadModel, which it takes over) beside `target`.

    p_min: stop drafting in a round when the head's top probability falls below it (--draft-p-min)."""

    def __init__(self, target: Model, head: HeadModel, name: str, *, p_min: float = 0.0) -> None:
        super().__init__(target, Eagle3Context(head, target), name, p_min=p_min)
        self._g = np.zeros((64, head.facts.n_embd), np.float32)  # g_p of positions 0..g_count-1
        self._g_count = 0
        # (_seen: g_p depends on tokens 0..p, the cache's pair p on tokens 0..p+1.)

    def begin(self, context: list[int], sampler: Sampler) -> None:
        self._sampler = sampler
        # Its rows are filtered in llama.cpp's graph where the run filters the target's there.
        self.head.set_filters(draft_filters(sampler, self.head.n_vocab))
        if self.resting:
            return
        keep = self._kept(context)
        self._g_count = min(self._g_count, keep)
        self.head.truncate(min(self.head.n_past, keep - 1))
        # The target has evaluated the prompt but its last token: take it in now, as a draft model
        # prefills, so the first draft's catch-up is the pending pair alone.
        self._catch_up(context, len(context) - 2)
        self._forget_debt()

    def _catch_up(self, context: list[int], pairs: int) -> None:
        """g of every position the target evaluated, and the cache's pairs 0..pairs-1."""
        evaluated = len(context) - 1
        if evaluated > self._g_count:
            g = self.head.encode(self.features.rows(self._g_count, evaluated))
            if evaluated > len(self._g):
                grown = np.zeros((max(evaluated, 2 * len(self._g)), self._g.shape[1]), np.float32)
                grown[: self._g_count] = self._g[: self._g_count]
                self._g = grown
            self._g[self._g_count : evaluated] = g
            self._g_count = evaluated
            self.features.release(evaluated)
        start = self.head.n_past
        if pairs > start:
            self.head.decode(context[start + 1 : pairs + 1], self._g[start:pairs], output=False)
        self._seen = list(context[: max(self._g_count, self.head.n_past + 1)])

    def draft(self, context: list[int], k: int, gate: DraftGate | None = None) -> Draft:
        n = len(context)
        if n < 2 or k < 1:
            return Draft.empty(self.name)  # no position the target evaluated: nothing to read yet
        t0 = time.perf_counter()
        self.head.truncate(n - 2)
        self._catch_up(context, n - 2)
        catch_up = self._catch_up_billed(time.perf_counter() - t0)
        row, h = self.head.decode([context[n - 1]], self._g[n - 2 : n - 1], output=True)

        def next_row(token: int) -> np.ndarray:
            nonlocal h
            logits, h = self.head.decode([token], h[None, :], output=True)
            return logits

        try:
            draft = draft_positions(row, next_row, k, n, self._sampler, width=self.target.n_vocab,
                                    p_min=self.p_min, gate=gate, name=self.name, catch_up_seconds=catch_up)
        finally:
            self.head.truncate(n - 1)  # drafted positions read the head's own states, not g
            self._seen = list(context)
        draft.first_in_catch_up = False  # position 0 is a decode of its own, after the catch-up
        return draft

    def warm_up(self) -> tuple[str, ...]:
        # A draft step's shape (one token, its logits) run once at load: the first look is timed warm.
        if self.head.n_past:
            return ()
        try:
            self.head.decode([max(0, self.target.vocab_info().bos)], self._g[:1], output=True)
        finally:
            self.head.truncate(0)
        return tuple(source.name for source in self.sources)

    def catch_up_costs(self) -> dict[str, tuple[int, float]]:
        # Priced from shadows alone (the first left out as cold), a dear catch-up was paid twice in a
        # process's first generation before the head could rest (lab/history.md, 2026-11-28).
        head = self.head
        if head.n_past:
            return {}
        token = max(0, self.target.vocab_info().bos)
        features = np.zeros((CATCH_UP_TIMED, self.features.width), np.float32)
        timing = timed_catch_up(lambda n: head.decode([token] * n, head.encode(features[:n]), output=False),
                                lambda: head.truncate(0))
        return {source.name: timing for source in self.sources}

    def reset(self) -> None:
        super().reset()
        self._g_count = 0
