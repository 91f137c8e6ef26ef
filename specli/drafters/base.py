"""The one small interface every drafter shares (like llama.cpp's common_speculative begin/draft/accept).

A new drafter is a new file implementing `Drafter`; the engine does not change.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from specli.sampling import SamplingParams


@dataclass
class Draft:
    """Tokens a drafter proposes for the positions after the committed context.

    probs: the drafter's processed distribution q for each proposed position, shape (k, target
    vocab), or None for a deterministic proposal (a point mass, as n-gram lookup makes).
    """

    tokens: list[int]
    probs: np.ndarray | None
    drafter: str

    @staticmethod
    def empty(drafter: str) -> Draft:
        return Draft([], None, drafter)


class Drafter(ABC):
    """Proposes tokens. The engine calls begin() once per generation, then draft()/accept() per round."""

    name: str = "drafter"

    def begin(self, context: list[int], sampling: SamplingParams, rng: np.random.Generator) -> None:
        """A generation starts over `context` (the prompt): prefill, reset indexes."""

    def next_source(self, context: list[int]) -> str:
        """Which proposer the next draft() will use (the policy keeps acceptance estimates per source)."""
        return self.name

    @abstractmethod
    def draft(self, context: list[int], k: int) -> Draft:
        """Propose up to k tokens to follow `context` (committed tokens; the last is pending)."""

    def accept(self, context: list[int]) -> None:
        """The round committed: `context` is the new committed sequence (roll back what was not)."""

    def reset(self) -> None:
        """Forget any cached state (the next begin() starts from nothing)."""

    @property
    def decode_seconds(self) -> float:
        """Seconds this drafter spent inside llama_decode (0 for drafters without a model)."""
        return 0.0

    def close(self) -> None:
        """Free what the drafter holds."""
