"""A smaller llama.cpp model as the drafter: the classic speculative decoding setup."""

from __future__ import annotations

import time

import numpy as np

from specli.drafters.base import Draft, Drafter, DraftGate, HeldPosition
from specli.llama import Model
from specli.sampling import SamplingParams, greedy_token, process_logits, sample


class DraftModelDrafter(Drafter):
    """Drafts autoregressively with a second model sharing the target's vocabulary.

    Its cache lags the committed context by whatever it has not seen (the pending token, a bonus
    token, tokens another drafter proposed); draft() catches up in one batch before drafting.

    p_min: stop drafting in a round when the draft's top probability for the next position falls
    below it (llama.cpp's --draft-p-min); nothing is proposed for that position.
    """

    name = "draft"

    def __init__(self, model: Model, target_vocab: int, *, p_min: float = 0.0) -> None:
        self.model = model
        self.target_vocab = target_vocab
        self.p_min = p_min
        self._sampling = SamplingParams(temperature=0.0)
        self._rng = np.random.default_rng(0)
        self._known_good = 0  # cache positions known to agree with the committed context

    def begin(self, context: list[int], sampling: SamplingParams, rng: np.random.Generator) -> None:
        self._sampling = sampling
        self._rng = rng
        self._known_good = self.model.keep_common_prefix(context)
        if self.model.n_past < len(context) - 1:
            self.model.decode(context[self.model.n_past : -1], outputs="none")
        self._known_good = self.model.n_past

    def draft(self, context: list[int], k: int, gate: DraftGate | None = None) -> Draft:
        m, params, width = self.model, self._sampling, self.target_vocab
        behind = len(context) - m.n_past  # usually the pending token, and a bonus token before it
        t0 = time.perf_counter()
        rows = m.decode(context[m.n_past :], outputs="last")
        catch_up = time.perf_counter() - t0 if behind > 2 else 0.0
        m.checkpoint()  # a recurrent draft returns here when drafts are rejected (no-op otherwise)
        tokens: list[int] = []
        probs: list[np.ndarray] = []
        confidence: list[float] = []
        held = None
        for i in range(k):
            row = rows[0] if rows.shape[1] <= width else rows[0, :width]
            # Confidence is the draft's top probability, known before its token is drawn: a stop
            # that depended on the drawn token would bias what gets proposed away from q, and the
            # output away from the target's distribution.
            q = None if params.greedy else process_logits(row, params, out_width=width)
            top = None  # greedy: a softmax over the vocabulary, only when something looks at it
            if q is not None or self.p_min or gate is not None:
                top = float(q.max()) if q is not None else _top_probability(row)
                if top < self.p_min:
                    break
                if gate is not None and not gate(i, top):
                    held = HeldPosition(greedy_token(row, params.banned), q, top)
                    break
                confidence.append(top)
            if q is None:
                token = greedy_token(row, params.banned)
            else:
                token = sample(q, self._rng)
                probs.append(q)
            tokens.append(token)
            if i + 1 < k:
                rows = m.decode([token], outputs="last")
        q_rows = np.stack(probs) if probs else None
        return Draft(tokens, q_rows, self.name, confidence, held, catch_up)

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

    @property
    def decode_seconds(self) -> float:
        return self.model.decode_seconds

    def close(self) -> None:
        self.model.close()


def _top_probability(row: np.ndarray) -> float:
    """max softmax(row): the draft's confidence in its greedy token."""
    m = row.max()
    return float(1.0 / np.exp(row - m).sum())
