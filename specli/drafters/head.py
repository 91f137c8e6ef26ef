"""What the trained drafters (EAGLE-3, DFlash/DSpark) share: a head's context beside the target, the
target's features it reads, and a state that follows the committed context (kept across generations
up to the first token that differs)."""

from __future__ import annotations

from pathlib import Path

from specli.drafters.base import CatchingUpDrafter, Source
from specli.heads import HeadContext, TargetFeatures
from specli.llama import Model
from specli.sampling import Noise, Sampler, SamplingParams


def common_prefix(a: list[int], b: list[int]) -> int:
    i, limit = 0, min(len(a), len(b))
    while i < limit and a[i] == b[i]:
        i += 1
    return i


class HeadDrafter(CatchingUpDrafter):
    """A drafter over `head` (a context it owns) that reads `target`'s layer inputs; `name` is its
    registry entry's."""

    def __init__(self, target: Model, head: HeadContext, name: str, *, p_min: float = 0.0) -> None:
        self.name = name
        self.sources = (Source(name),)
        self.target = target
        self.head = head
        try:
            self.features = TargetFeatures(target, head.head.facts.target_layers)
        except BaseException:
            head.close()
            raise
        self.p_min = p_min
        self._sampler = Sampler(SamplingParams(temperature=0.0), Noise(0))
        self._seen: list[int] = []  # the context tokens the head's state was computed from

    def set_resting(self, resting: bool) -> None:
        # At rest the target hands out no features: a later begin() has the target decode again what
        # it decoded meanwhile (TargetFeatures.rows), once, instead of every decode paying for them.
        if resting:
            self.features.pause()
        else:
            self.features.resume()

    @property
    def resting(self) -> bool:
        """Whether it rests (`set_resting`): begin() then leaves the state as it is, the features unread."""
        return self.features.paused

    def watch_costs(self) -> dict[str, float]:
        # Where they cost a share of a token, -k auto rests a declined head rather than watch it
        # (policy.WATCH_SHARE): on an H200 a declined head that was watched cost 13-22 % of plain
        # decoding, the features' part of it not separated yet (lab/feature_tax.py).
        tax = self.features.tax()
        return {} if tax is None else {source.name: tax for source in self.sources}

    def _kept(self, context: list[int]) -> int:
        """How many leading tokens of `context` the state was computed from (a new generation may
        share a prefix with the last)."""
        keep = common_prefix(self._seen, context)
        del self._seen[keep:]
        return keep

    @property
    def head_files(self) -> list[Path]:
        return [self.head.head.path]

    def reset(self) -> None:
        self.head.reset()
        self._seen = []
        self._forget_debt()

    @property
    def decode_seconds(self) -> float:
        return self.head.decode_seconds

    def close(self) -> None:
        self.head.close()
