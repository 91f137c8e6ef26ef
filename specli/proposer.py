"""The engine's one question each round, "what do we draft?", and the one report it gives back.

A `Proposer` puts a drafter and a draft-length policy behind that interface. Everything adaptive
lives here or in the policy: the k of each round, the gate that stops a confident drafter on doubt,
shadow proposals (at k = 0 the drafter still looks at the next position, unverified, so the policy
learns when drafting pays again), held positions (where a gate stopped, scored when the target gets
there anyway), calibration, and what drafting cost. The engine sees a `Draft` and reports a
`RoundResult`; it never learns what a shadow is.
"""

from __future__ import annotations

from dataclasses import dataclass

from specli.costs import CostModel
from specli.drafters.base import Draft, Drafter
from specli.policy import AutoK, DraftPolicy, FixedK, Learned
from specli.sampling import Sampler
from specli.verify import Verdict, acceptance_of


@dataclass
class RoundResult:
    """What became of a draft: the committed context after the round, the target's verdict, and what
    drafting and verifying took."""

    context: list[int]
    draft: Draft
    verdict: Verdict
    draft_seconds: float
    verify_seconds: float


class Proposer:
    """Plain decoding: never drafts. The base of the drafting proposer, and the engine's proposer
    when there is no drafter."""

    name = "plain"

    def begin(self, context: list[int], sampler: Sampler) -> None:
        """A generation starts over `context` (the prompt; its last token is pending)."""

    def propose(self, context: list[int], limit: int) -> Draft:
        """Tokens to verify after `context` this round: at most `limit` (what fits the output, the
        context and the target's rollback)."""
        return Draft.empty(self.name)

    def observe(self, result: RoundResult) -> None:
        """The round is committed: learn from it."""

    @property
    def decode_seconds(self) -> float:
        """Seconds the drafter spent inside llama_decode, over its lifetime."""
        return 0.0


class DraftingProposer(Proposer):
    """A drafter and a policy: each round the policy chooses k (and a gate), the drafter drafts."""

    def __init__(self, drafter: Drafter, policy: DraftPolicy) -> None:
        self.drafter = drafter
        self.policy = policy
        self.name = drafter.name
        self._same_as_plain = False
        self._source: str | None = None
        self._shadow: Draft | None = None

    def begin(self, context: list[int], sampler: Sampler) -> None:
        self._same_as_plain = sampler.same_as_plain
        self.drafter.begin(context, sampler)

    def propose(self, context: list[int], limit: int) -> Draft:
        drafter, policy = self.drafter, self.policy
        self._source = source = drafter.next_source(context)
        k = max(0, min(policy.choose_k(source), limit))
        # A shadow: at k = 0 the drafter may still look at the next position without the target
        # verifying anything there (it decodes only the pending token). How likely that proposal
        # was to be accepted tells the policy whether drafting pays again.
        shadow = k == 0 and policy.wants_shadow(source)
        self._shadow = None
        if k == 0 and not shadow:
            return Draft.empty(drafter.name)
        draft = drafter.draft(context, k or 1, policy.gate(source, k or 1, shadow=shadow))
        if shadow and draft.tokens:
            # A drafter without a gate still proposed: set the proposal aside, unverified.
            self._shadow, draft = draft, Draft.empty(draft.drafter)
        return draft

    def observe(self, result: RoundResult) -> None:
        self.drafter.accept(result.context)
        source, policy, draft, verdict = self._source, self.policy, result.draft, result.verdict
        if source is None:
            return
        if self._shadow is not None:
            shadow = self._shadow
            q = shadow.probs[0] if shadow.probs is not None else None
            policy.observe_shadow(
                source, acceptance_of(verdict, 0, shadow.tokens[0], q, self._same_as_plain),
                result.draft_seconds,
            )
        k = len(draft.tokens)
        # What a draft position costs: a catch-up after plain rounds is left out, with the first
        # position where the drafter evaluated it in the same decode.
        catch_up = draft.catch_up_seconds
        policy.observe(
            source,
            k,
            verdict.n_accepted,
            result.draft_seconds - catch_up,
            result.verify_seconds,
            draft.confidence,
            k + (draft.held is not None) - draft.first_in_catch_up,
        )
        held = draft.held
        if held is not None and verdict.n_accepted == k:
            # The target's row at the position the gate stopped at is here anyway (the bonus row,
            # or the only row of a plain round): score what the draft would have proposed.
            accepted = acceptance_of(verdict, k, held.token, held.probs, self._same_as_plain)
            policy.observe_held(source, k, held.confidence, accepted)

    @property
    def decode_seconds(self) -> float:
        return self.drafter.decode_seconds


def make_proposer(
    drafter: Drafter | None, draft_max: int | str, costs: CostModel, learned: Learned
) -> Proposer:
    """The proposer for one generation: plain without a drafter; a fixed k; or auto, which learns with
    the engine's `costs` and `learned` (kept across generations)."""
    if drafter is None:
        return Proposer()
    if draft_max == "auto":
        confident = [s.name for s in drafter.sources if s.confident]
        return DraftingProposer(drafter, AutoK(costs, learned, confident=confident))
    return DraftingProposer(drafter, FixedK(int(draft_max)))

