"""Prompt-lookup decoding: propose what followed the most recent earlier occurrence of the last n tokens.

No draft model: the proposal is deterministic (a point mass), so the engine accepts a token with
probability p(x) and, on rejection, samples from p with x removed; greedy accepts while x is argmax.
Matches are looked up in dictionaries updated incrementally as the context grows, so a round costs
O(n_max), not a scan of the context.
"""

from __future__ import annotations

import numpy as np

from specli.drafters.base import Draft, Drafter, DraftGate
from specli.sampling import SamplingParams


class NGramDrafter(Drafter):
    name = "ngram"

    def __init__(self, n_max: int = 3, n_min: int = 1) -> None:
        if not 1 <= n_min <= n_max:
            raise ValueError("need 1 <= n_min <= n_max")
        self.n_max, self.n_min = n_max, n_min
        # _last_end[n][ngram] = the position just after the most recent occurrence of ngram.
        self._last_end: dict[int, dict[tuple[int, ...], int]] = {}
        self._indexed = 0  # positions whose preceding n-grams are indexed
        self.last_match_len = 0  # n of the last successful lookup (0: none), for combined drafting
        self._last_lookup: tuple[int, int | None, int] | None = None  # (context length, start, n)

    def begin(self, context: list[int], sampling: SamplingParams, rng: np.random.Generator) -> None:
        self._last_end = {n: {} for n in range(self.n_min, self.n_max + 1)}
        self._indexed = 0
        self._last_lookup = None

    def _index(self, context: list[int]) -> None:
        # Index n-grams ending before the final position only: the final n-gram is the query itself.
        end = len(context) - 1
        for pos in range(max(self._indexed, 1), end + 1):
            for n in range(self.n_min, self.n_max + 1):
                if pos >= n:
                    self._last_end[n][tuple(context[pos - n : pos])] = pos
        self._indexed = end + 1

    def lookup(self, context: list[int], k: int) -> list[int]:
        """The continuation after the longest (n_max..n_min) most recent match of the context's tail."""
        if self._last_lookup is not None and self._last_lookup[0] == len(context):
            # The context only grows within a generation, so the same length is the same context as
            # the last call (next_source, then draft): reuse its match.
            _, start, self.last_match_len = self._last_lookup
            return context[start : start + k] if start is not None else []
        self._index(context)
        for n in range(self.n_max, self.n_min - 1, -1):
            if len(context) < n:
                continue
            start = self._last_end[n].get(tuple(context[-n:]))
            if start is not None and start < len(context):
                self.last_match_len = n
                self._last_lookup = (len(context), start, n)
                return context[start : start + k]
        self.last_match_len = 0
        self._last_lookup = (len(context), None, 0)
        return []

    def next_source(self, context: list[int]) -> str:
        """"ngram/n" for a match of n tokens ("ngram/0": none): longer matches are accepted more
        often, so the policy keeps an acceptance estimate for each length."""
        self.lookup(context, 1)
        return f"{self.name}/{self.last_match_len}"

    def draft(self, context: list[int], k: int, gate: DraftGate | None = None) -> Draft:
        return Draft(self.lookup(context, k), None, self.name)  # no confidence: the gate has no say
