"""The speculative round and the generation loop. Yields events; owns no I/O.

State between rounds: the target's cache holds exactly `context[:-1]`; `context[-1]` (the last
committed token) is pending. A round drafts d1..dk, verifies [pending, d1..dk] in one target decode
(k + 1 rows of logits), accepts a prefix d1..dn by the exact rule, appends one token sampled by the
target (a correction after a rejection, a bonus after full acceptance), and truncates the target's
cache back to `context[:-1]`. Nothing already cached is evaluated again.
"""

from __future__ import annotations

import codecs
import secrets
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from specli.drafters.base import Draft, Drafter
from specli.events import DoneEvent, Event, Origin, PromptEvent, RejectedEvent, RoundEvent, TokenEvent
from specli.llama import Model
from specli.policy import AutoK, CostModel, DraftPolicy, FixedK
from specli.sampling import (
    ACCEPT,
    RESIDUAL,
    Dist,
    Noise,
    Sampler,
    SamplingParams,
    distribution,
    greedy_token,
    mask_banned,
    proposal_acceptance,
)
from specli.stats import GenerationStats


@dataclass
class GenerationParams:
    max_tokens: int = 256
    sampling: SamplingParams = field(default_factory=SamplingParams)
    seed: int | None = None
    stop: Sequence[str] = ()
    draft_max: int | str = "auto"  # tokens drafted per round, or "auto"
    ignore_eos: bool = False  # never sample end-of-generation tokens (benchmarks, soak tests)
    # Verify drafts against the target's own keyed draw, so a seeded run prints exactly what plain
    # decoding prints with that seed (see sampling.Sampler); False: the rejection rule.
    same_as_plain: bool = True

    def policy(self, costs: CostModel | None = None) -> DraftPolicy:
        """The draft-length policy; auto learns with `costs` (the engine's, kept across generations)."""
        if self.draft_max == "auto":
            return AutoK(costs or CostModel())
        return FixedK(int(self.draft_max))


@dataclass
class Verdict:
    """What the target made of a round: the tokens to commit (accepted drafts, then its own token),
    how many drafts it accepted, and its processed rows as far as it needed them (None when greedy),
    so nothing processes a row twice."""

    tokens: list[int]
    n_accepted: int
    dists: list[Dist | None]


def verify(target_rows: np.ndarray, draft: Draft, sampler: Sampler, position: int) -> Verdict:
    """One round's decision from the target's k + 1 logits rows; row i predicts sequence `position + i`.

    Greedy, and sampling with `same_as_plain`: the target draws its own token at each position (argmax,
    or the Gumbel-max draw with the position's noise, which plain decoding draws too) and accepts
    drafts while they equal it, so the output is plain decoding's whatever was drafted.
    Otherwise the rejection rule: accept d_i while u_i < p_i(d_i) / q_i(d_i); at the first rejection
    draw from norm(max(p - q, 0)); after k acceptances draw a bonus token from p_(k+1).
    """
    d = draft.tokens
    k = len(d)
    params, noise = sampler.params, sampler.noise
    if params.banned:
        mask_banned(target_rows, params.banned)  # once, in place; then nothing checks them again
        params = params.unbanned
    dists: list[Dist | None] = []
    if params.greedy or sampler.same_as_plain:
        for i in range(k + 1):
            if params.greedy:
                own, p = greedy_token(target_rows[i], params.banned), None
            else:
                p = distribution(target_rows[i], params)
                own = p.draw(noise, position + i)
            dists.append(p)
            if i == k or own != d[i]:
                return Verdict([*d[:i], own], i, dists)
    qs = _proposal_dists(draft)
    for i in range(k):
        p = distribution(target_rows[i], params)
        dists.append(p)
        q = qs[i] if qs is not None else None
        q_d = q.prob(d[i]) if q is not None else 1.0
        if not noise.uniform(position + i, ACCEPT) * q_d < p.prob(d[i]):
            return Verdict([*d[:i], p.residual(q, d[i]).draw(noise, position + i, RESIDUAL)], i, dists)
    p = distribution(target_rows[k], params)
    dists.append(p)
    return Verdict([*d, p.draw(noise, position + k)], k, dists)


def _proposal_dists(draft: Draft) -> list[Dist] | None:
    if draft.probs is None or not isinstance(draft.probs, np.ndarray):
        return draft.probs
    width = draft.probs.shape[1]  # dense rows (k, vocab), as tests build them
    return [Dist.from_probs(None, row.astype(np.float64), width) for row in draft.probs]


def speculative_step(
    target_rows: np.ndarray,
    draft: Draft,
    sampling: SamplingParams,
    rng: np.random.Generator | Noise,
    position: int = 0,
    *,
    same_as_plain: bool = False,
) -> tuple[list[int], int]:
    """verify() as (tokens to commit, n accepted); a numpy Generator stands for fresh noise."""
    noise = rng if isinstance(rng, Noise) else Noise(int(rng.integers(2**62)))
    verdict = verify(target_rows, draft, Sampler(sampling, noise, same_as_plain), position)
    return verdict.tokens, verdict.n_accepted


def _acceptance(verdict: Verdict, i: int, token: int, q: Dist | None, same_as_plain: bool) -> float:
    """How likely the target would have accepted `token` as a draft at row i, a row it reached with
    every draft before it accepted (so verdict.tokens[i] is its own draw there). Greedy, or
    same-as-plain with a draft model (whose `token` is the draft's own keyed draw): whether the two
    draws agree, the rule itself. Otherwise the expectation over the draw: sum min(p, q), or p(token)
    for a point mass (as it is under same-as-plain too)."""
    p = verdict.dists[i]
    if p is None or (same_as_plain and q is not None):
        return float(token == verdict.tokens[i])
    return proposal_acceptance(p, token, q)


class _TextStream:
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
        self._held.append(event)
        if not self.stop:
            return self._release(len(self._held))
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


class SpeculativeEngine:
    """Generates with a target model and an optional drafter (None: plain decoding, the baseline)."""

    def __init__(self, target: Model, drafter: Drafter | None = None) -> None:
        if drafter is not None and target.max_rollback < 1:
            raise ValueError(
                f"{target.path.name} is a recurrent/hybrid model ({target.architecture}) whose state "
                "this llama.cpp cannot roll back past a rejected draft, so speculative decoding is "
                "not possible; run with --no-draft"
            )
        self.target = target
        self.drafter = drafter
        self.stats = GenerationStats()
        self.policy: DraftPolicy | None = None
        # What verifies and drafts cost on this machine: learned by auto, kept across generations.
        self.costs = CostModel()
        self.context: list[int] = []  # committed tokens of the last generation (prompt + output)
        self._stream: _TextStream | None = None

    @property
    def tokens(self) -> list[int]:
        """Ids of the tokens the last generation released so far (what the user saw)."""
        return self._stream.tokens if self._stream else []

    @property
    def text(self) -> str:
        """Text the last generation released so far (complete after its DoneEvent, or after Ctrl-C)."""
        return self._stream.text if self._stream else ""

    def generate(self, prompt: Sequence[int], params: GenerationParams) -> Iterator[Event]:
        """Stream events for a generation that continues `prompt` (token ids, BOS included).

        The target's cache is reused up to its longest common prefix with the prompt (a chat's
        earlier turns are not evaluated again). `self.stats` is current after every event, so a
        caller interrupted mid-stream (Ctrl-C) still has the figures so far.
        """
        if not prompt:
            raise ValueError("the prompt is empty: nothing to continue")
        target, drafter = self.target, self.drafter
        sampling = params.sampling
        if params.ignore_eos:
            sampling = replace(sampling, banned=(*sampling.banned, *target.eog_tokens()))
        seed = params.seed if params.seed is not None else secrets.randbelow(2**32)
        sampler = Sampler(sampling, Noise(seed), params.same_as_plain)
        self.stats = stats = GenerationStats()
        self._stream = stream = _TextStream(target, params.stop)
        self.policy = policy = params.policy(self.costs) if drafter else FixedK(0)
        context = list(prompt)
        self.context = context
        if len(context) > target.n_ctx:
            raise ValueError(
                f"the prompt has {len(context)} tokens but the context holds {target.n_ctx} (raise --ctx)"
            )

        # Prompt: evaluate everything but the last token, which the first round's verify decodes.
        t0 = time.perf_counter()
        cached = target.keep_common_prefix(context)
        if len(context) - 1 > cached:
            target.decode(context[cached:-1], outputs="none")
        if drafter:
            drafter.begin(context, sampler)
        event: Event = PromptEvent(
            len(context), len(context) - cached, time.perf_counter() - t0, seed, sampler.mode
        )
        stats.observe(event)
        yield event

        decode_base = target.decode_seconds + (drafter.decode_seconds if drafter else 0.0)
        gen_start = time.perf_counter()
        stop_reason = "length"
        n_emitted = 0
        round_index = 0
        while n_emitted < params.max_tokens:
            room = target.n_ctx - len(context)  # drafts that fit beside the pending token
            if room < 0:
                stop_reason = "context"
                break
            t_start = time.perf_counter()
            source = drafter.next_source(context) if drafter else None
            k = policy.choose_k(source, round_index) if drafter else 0
            # A round emits up to k + 1 tokens: do not draft past max_tokens or the context.
            # A recurrent/hybrid target rolls back at most max_rollback positions (k when all rejected).
            k = max(0, min(k, params.max_tokens - n_emitted - 1, room, target.max_rollback))
            # A shadow: at k = 0 the drafter may still look at the next position without the target
            # verifying anything there (it decodes only the pending token). How likely that proposal
            # was to be accepted tells the policy whether drafting pays again, for one draft step.
            shadow = k == 0 and drafter is not None and source is not None and policy.wants_shadow(source)
            if drafter is not None and source is not None and (k > 0 or shadow):
                draft = drafter.draft(context, k or 1, policy.gate(source, k or 1, shadow=shadow))
            else:
                draft = Draft.empty("plain")
            # A drafter without confidence ignores the gate: set its shadow proposal aside, unverified.
            proposal = draft if shadow and draft.tokens else None
            if proposal is not None:
                draft = Draft.empty(draft.drafter)
            t_drafted = time.perf_counter()
            rows = target.decode([context[-1], *draft.tokens], outputs="all")
            t_verified = time.perf_counter()
            verdict = verify(rows, draft, sampler, len(context))
            new_tokens, n_accepted = verdict.tokens, verdict.n_accepted
            if proposal is not None:
                q = proposal.probs[0] if proposal.probs is not None else None
                accepted_p = _acceptance(verdict, 0, proposal.tokens[0], q, sampler.same_as_plain)
                policy.observe_shadow(source, accepted_p, t_drafted - t_start)
            target.truncate(len(context) + n_accepted)  # keep through d_n: cache = new context[:-1]
            context.extend(new_tokens)
            if drafter:
                drafter.accept(context)
            k_drafted = len(draft.tokens)
            # The policy learns what a draft position costs: a catch-up after plain rounds is left out,
            # with the first position, which it evaluated in the same decode.
            catch_up = draft.catch_up_seconds
            policy.observe(
                source,
                k_drafted,
                n_accepted,
                t_drafted - t_start - catch_up,
                t_verified - t_drafted,
                draft.confidence,
                k_drafted + (draft.held is not None) - (catch_up > 0),
            )
            held = draft.held
            if held is not None and n_accepted == k_drafted and source is not None:
                # The target's row at the position the gate stopped at is here anyway (the bonus row,
                # or the only row of a plain round): score what the draft would have proposed.
                accepted_p = _acceptance(verdict, k_drafted, held.token, held.probs, sampler.same_as_plain)
                policy.observe_held(source, k_drafted, held.confidence, accepted_p)

            # Emit: accepted drafts, then the target's own token; stop at EOG or max_tokens.
            last_origin = (
                Origin.PLAIN
                if k_drafted == 0
                else (Origin.BONUS if n_accepted == k_drafted else Origin.CORRECTED)
            )
            events: list[Event] = []
            emitted = 0
            for i, token in enumerate(new_tokens):
                if i == n_accepted < k_drafted:
                    # The rejected proposals come before the target's correction, as they were drafted.
                    rejected = draft.tokens[n_accepted:]
                    events.append(
                        RejectedEvent(rejected, target.detokenize(rejected), round_index, draft.drafter)
                    )
                if target.is_eog(token):
                    stop_reason = "eos"
                    break
                origin = Origin.ACCEPTED if i < n_accepted else last_origin
                drafter_name = draft.drafter if origin is Origin.ACCEPTED else None
                events.extend(stream.push(TokenEvent(token, "", origin, round_index, drafter_name)))
                emitted += 1
                n_emitted += 1
                if stream.stopped:
                    stop_reason = "stop"
                    break
                if n_emitted >= params.max_tokens:
                    break
            t_end = time.perf_counter()
            events.append(
                RoundEvent(
                    round_index,
                    draft.drafter if k_drafted else None,
                    k_drafted,
                    n_accepted,
                    emitted,
                    t_drafted - t_start,
                    t_verified - t_drafted,
                    t_end - t_verified,
                )
            )
            stats.generation_seconds = t_end - gen_start
            stats.decode_seconds = (
                target.decode_seconds + (drafter.decode_seconds if drafter else 0.0) - decode_base
            )
            for event in events:
                stats.observe(event)
                yield event
            round_index += 1
            if stop_reason in ("eos", "stop"):
                break

        if not stream.stopped:
            for event in stream.flush():
                stats.observe(event)
                yield event
        stats.stop_reason = stop_reason
        stats.generation_seconds = time.perf_counter() - gen_start
        yield DoneEvent(stop_reason, stream.text)

    def reset(self) -> None:
        """Empty both caches (the next generation evaluates its whole prompt)."""
        self.target.reset()
        if self.drafter:
            self.drafter.reset()

    def close(self) -> None:
        if self.drafter:
            self.drafter.close()
        self.target.close()
