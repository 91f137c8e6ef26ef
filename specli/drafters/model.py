"""A smaller llama.cpp model as the drafter: the classic speculative decoding setup."""

from __future__ import annotations

import time

import numpy as np

from specli.drafters.base import Draft, Drafter, DraftGate, Source, draft_filters, draft_positions
from specli.llama import Model
from specli.sampling import Noise, Sampler, SamplingParams, Survivors


class DraftModelDrafter(Drafter):
    """Drafts autoregressively with a second model sharing the target's vocabulary.

    Its cache lags the committed context by whatever it has not seen (the pending token, a bonus
    token, tokens another drafter proposed); draft() catches up in one batch before drafting.

    p_min: stop drafting in a round when the draft's top probability for the next position falls
    below it (llama.cpp's --draft-p-min); nothing is proposed for that position. `name`: its registry
    entry's.
    """

    def __init__(self, model: Model, target_vocab: int, name: str, *, p_min: float = 0.0) -> None:
        self.name = name
        self.sources = (Source(name),)
        self.model = model
        self.target_vocab = target_vocab
        self.p_min = p_min
        self._sampler = Sampler(SamplingParams(temperature=0.0), Noise(0))
        self._known_good = 0  # cache positions known to agree with the committed context

    def begin(self, context: list[int], sampler: Sampler) -> None:
        self._sampler = sampler
        # The draft's rows are filtered where the target's are when the run filters in llama.cpp's
        # graph and this model can (its ids all within the target's vocabulary).
        fits = self.model.n_vocab <= self.target_vocab
        self.model.set_filters(draft_filters(sampler, self.model.n_vocab) if fits else None)
        self._known_good = self.model.keep_common_prefix(context)
        if self.model.n_past < len(context) - 1:
            self.model.decode(context[self.model.n_past : -1], outputs="none")
        self._known_good = self.model.n_past

    def draft(self, context: list[int], k: int, gate: DraftGate | None = None) -> Draft:
        m, sampler, width = self.model, self._sampler, self.target_vocab
        behind = len(context) - m.n_past  # usually the pending token, and a bonus token before it
        t0 = time.perf_counter()
        if m.filters is not None:
            def next_row(tokens: list[int]) -> Survivors:
                return Survivors(*m.decode_filtered(tokens, outputs="last").survivors(0))
        else:
            def next_row(tokens: list[int]) -> np.ndarray:
                row = m.decode(tokens, outputs="last")[0]
                return row if row.shape[0] <= width else row[:width]
        first = next_row(context[m.n_past :])
        catch_up = time.perf_counter() - t0 if behind > 2 else 0.0
        m.checkpoint()  # a recurrent draft returns here when drafts are rejected (no-op otherwise)
        return draft_positions(
            first, lambda token: next_row([token]), k, len(context),
            sampler, width=width, p_min=self.p_min, gate=gate, name=self.name, catch_up_seconds=catch_up,
        )

    def accept(self, context: list[int]) -> None:
        m = self.model
        i, limit = self._known_good, min(m.n_past, len(context) - 1)
        while i < limit and m.tokens[i] == context[i]:
            i += 1
        m.truncate(i)
        self._known_good = i

    def reset(self) -> None:
        self.model.reset()
        self._known_good = 0

    def set_p_min(self, p_min: float) -> None:
        self.p_min = p_min

    @property
    def decode_seconds(self) -> float:
        return self.model.decode_seconds

    @property
    def models(self) -> list[Model]:
        return [self.model]

    def close(self) -> None:
        self.model.close()

