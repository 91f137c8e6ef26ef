"""N-gram lookup when a confident match exists, the draft model otherwise."""

from __future__ import annotations

from specli.drafters.base import Draft, Drafter, DraftGate
from specli.drafters.model import DraftModelDrafter
from specli.drafters.ngram import NGramDrafter
from specli.llama import Model
from specli.sampling import Sampler


class CombinedDrafter(Drafter):
    """A match of at least `min_match` tokens is confident enough to skip the draft model's work;
    copying text (code edits, quoting the prompt) is where such matches appear and where they pay.
    `name`: the registry's for the combination (its sources are its parts')."""

    def __init__(self, model_drafter: DraftModelDrafter, ngram: NGramDrafter, name: str, *,
                 min_match: int = 2) -> None:
        self.name = name
        self.model_drafter = model_drafter
        self.ngram = ngram
        self.min_match = min_match
        self.sources = (*model_drafter.sources, *ngram.sources)

    @property
    def models(self) -> list[Model]:
        return self.model_drafter.models

    def begin(self, context: list[int], sampler: Sampler) -> None:
        self.ngram.begin(context, sampler)
        self.model_drafter.begin(context, sampler)

    def _confident_match(self, context: list[int], k: int) -> list[int]:
        proposal = self.ngram.lookup(context, k)
        return proposal if proposal and self.ngram.last_match_len >= self.min_match else []

    def next_source(self, context: list[int]) -> str:
        if self._confident_match(context, 1):
            return self.ngram.next_source(context)
        return self.model_drafter.name

    def draft(self, context: list[int], k: int, gate: DraftGate | None = None) -> Draft:
        if self._confident_match(context, k):
            return self.ngram.draft(context, k, gate)
        return self.model_drafter.draft(context, k, gate)

    def accept(self, context: list[int]) -> None:
        self.model_drafter.accept(context)

    def reset(self) -> None:
        self.model_drafter.reset()

    def set_p_min(self, p_min: float) -> None:
        self.model_drafter.set_p_min(p_min)

    @property
    def decode_seconds(self) -> float:
        return self.model_drafter.decode_seconds

    def close(self) -> None:
        self.model_drafter.close()
