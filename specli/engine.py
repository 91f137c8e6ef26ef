"""The generation loop: propose, verify, commit, emit. Yields events; owns no I/O and no models.

State between rounds: the target's cache holds exactly `context[:-1]`; `context[-1]` (the last
committed token) is pending. A round asks the proposer for drafts d1..dk, verifies [pending, d1..dk]
in one target decode (k + 1 rows of logits), lets `verify` accept a prefix d1..dn and add one token
of the target's own, and truncates the target's cache back to the new `context[:-1]`. Nothing
already cached is evaluated again. What to draft (k, gates, shadows, learning) is the proposer's.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

from specli.costs import CostModel
from specli.drafters.base import Draft, Drafter
from specli.events import DoneEvent, Event, Origin, PromptEvent, RejectedEvent, RoundEvent, TokenEvent
from specli.llama import GraphFilters, Model, check_prompt_fits
from specli.native import native
from specli.policy import Learned, regime
from specli.proposer import Proposer, RoundResult, make_proposer
from specli.sampling import Noise, Sampler, SamplingParams
from specli.settings import DEFAULTS, SAMPLING_ON, RunSettings, random_seed
from specli.stats import GenerationStats
from specli.textstream import TextStream
from specli.verify import Verdict, verify


@dataclass
class GenerationParams:
    """One generation's parameters; the defaults are specli.settings' (DEFAULTS), with the plain sampler."""

    max_tokens: int = DEFAULTS.max_tokens
    sampling: SamplingParams = field(default_factory=SamplingParams)
    seed: int | None = DEFAULTS.seed  # None: a random one (random_seed)
    stop: Sequence[str] = DEFAULTS.stop
    draft_max: int | str = DEFAULTS.draft_max  # tokens drafted per round, or AUTO
    ignore_eos: bool = DEFAULTS.ignore_eos  # never sample end-of-generation tokens (benchmarks, soak tests)
    # Verify drafts against the target's own keyed draw, so a seeded run prints exactly what plain
    # decoding prints with that seed (see sampling.Sampler); False: the rejection rule.
    same_as_plain: bool = DEFAULTS.same_as_plain
    # Stop a round's draft where the draft's top probability falls below this (--draft-p-min); None:
    # what the drafter was built with (api.load's draft_p_min).
    draft_p_min: float | None = None
    # Where the filters run (--sampling-on): "backend" (in llama.cpp's graph, only the survivors cross to
    # Python), "host" (numpy over the whole row), or AUTO (see sampling_path).
    sampling_on: str = DEFAULTS.sampling_on

    @classmethod
    def of(cls, settings: RunSettings, seed_offset: int = 0) -> GenerationParams:
        """The parameters of one generation with a run's settings (the one place front ends build them):
        the `seed_offset`-th of a series (RunSettings.seed_at); without a seed, a random one."""
        return cls(
            max_tokens=settings.max_tokens, sampling=SamplingParams.of(settings),
            seed=settings.seeded().seed_at(seed_offset), stop=settings.stop, draft_max=settings.draft_max,
            ignore_eos=settings.ignore_eos, same_as_plain=settings.same_as_plain,
            draft_p_min=settings.draft_p_min, sampling_on=settings.sampling_on,
        )


def sampling_path(target: Model, sampling: SamplingParams, choice: str) -> tuple[GraphFilters | None, str]:
    """Where a generation filters the target's rows: in llama.cpp's graph (the filters) or on the host
    (None), and why, in a few words. auto: the host, on a CPU and on a GPU alike: the graph's sampler
    nodes (a copy of the logits, the bias, the top-k or argmax) measured dearer than crossing the row
    and filtering it in C, on this CPU (+0.6 ms a token at 152k) and on an H200 (host faster in 17 of
    18 paired runs, docs/performance.md). A generation never mixes the two for the target's rows."""
    if choice not in SAMPLING_ON:
        raise ValueError(f"sampling_on must be one of {', '.join(SAMPLING_ON)}, got {choice!r}")
    if choice == "host":
        return None, "asked for (--sampling-on host)"
    filters, problem = GraphFilters.of(sampling, target.n_vocab)
    if filters is None:
        return None, problem
    if choice == "backend":
        return filters, "asked for (--sampling-on backend)"
    return None, "auto: the host's filters measured faster than the graph's, on a CPU and on a GPU"


def drafts_in_graph(target: Model, sampling: SamplingParams, choice: str) -> bool:
    """Whether a drafter filters its own rows in its graph (only the survivors cross): with the target's
    (backend), and under auto where the target runs on a GPU, where a block drafter's 7-16 rows
    crossing whole measured dearer (an H200: a DFlash block 2.8 ms with its rows on the host, 2.0 in
    the graph). A draft's q is what its path gives; the target's rule is unchanged either way."""
    if choice == "host" or GraphFilters.of(sampling, target.n_vocab)[0] is None:
        return False
    return choice == "backend" or target.offloaded


class Generation:
    """One generation: iterate it for its events. `text`, `tokens` (what was released to the user),
    `stats` (a fold over the events) and `context` (prompt + committed tokens) are current after
    every event. It always ends with a DoneEvent: the last event it yields, or, after Ctrl-C (which
    may land anywhere, in the engine or in the consumer), the one `interrupt()` returns."""

    def __init__(self, rounds: Iterator[Event], stream: TextStream, context: list[int]) -> None:
        self._rounds = rounds
        self._stream = stream
        self.context = context
        self.stats = GenerationStats()
        self.done: DoneEvent | None = None
        self._start: float | None = None

    def __iter__(self) -> Iterator[Event]:
        observe = self.stats.observe
        for event in self._rounds:
            kind = type(event)
            if kind is PromptEvent:
                self._start = time.perf_counter()
            elif kind is DoneEvent:
                self.done = event
            observe(event)
            yield event

    def _observe(self, event: Event) -> None:
        self.stats.observe(event)
        if isinstance(event, DoneEvent):
            self.done = event

    def interrupt(self) -> DoneEvent:
        """End the generation early (Ctrl-C): its DoneEvent, with what was released so far. The
        models' caches stay consistent (each Model knows what its cache holds) for the next one."""
        self._rounds.close()
        if self.done is None:
            elapsed = time.perf_counter() - self._start if self._start is not None else 0.0
            self._observe(DoneEvent("interrupted", self._stream.text, elapsed))
        assert self.done is not None
        return self.done

    def complete(self) -> Generation:
        """Run to the end without looking at the events (tests, scripts)."""
        for _ in self:
            pass
        return self

    @property
    def text(self) -> str:
        return self._stream.text

    @property
    def tokens(self) -> list[int]:
        return self._stream.tokens


def cannot_roll_back(file_name: str, architecture: str) -> str:
    """Why a recurrent/hybrid target without bounded rollback cannot be speculated on (said by the engine,
    and before loading by runplan)."""
    return (f"{file_name} is a recurrent/hybrid model ({architecture}) whose state this llama.cpp cannot "
            "roll back past a rejected draft, so speculative decoding is not possible; run with --no-draft")


class SpeculativeEngine:
    """Generates with a target model and an optional drafter (None: plain decoding, the baseline).
    The models belong to the caller (api.Speculator), which closes them."""

    def __init__(self, target: Model, drafter: Drafter | None = None) -> None:
        if drafter is not None and target.max_rollback < 1:
            raise ValueError(cannot_roll_back(target.path.name, target.architecture))
        self.target = target
        self.drafter = drafter
        # What decodes cost on this machine and what auto learned of the pair: kept across generations.
        self.costs = CostModel.for_device(target.offloaded)
        self.learned = Learned()
        # The host filters are compiled on a machine's first use, and a drafter's first pass is dear:
        # both with the models' loading, not inside a generation (and its rate).
        native()
        if drafter is not None:
            for source in drafter.warm_up():
                self.costs.warmed(source)
            for source, seconds in drafter.watch_costs().items():
                self.costs.observe_watch(source, seconds)
            for source, (positions, seconds) in drafter.catch_up_costs().items():
                self.costs.timed_catch_up(source, positions, seconds)

    def generate(self, prompt: Sequence[int], params: GenerationParams) -> Generation:
        """A generation that continues `prompt` (token ids, BOS included), as an iterable of events.

        The target's cache is reused up to its longest common prefix with the prompt (a chat's
        earlier turns are not evaluated again).
        """
        if not prompt:
            raise ValueError("the prompt is empty: nothing to continue")
        check_prompt_fits(len(prompt), self.target.n_ctx)  # PromptTooLong, a ValueError
        context = list(prompt)
        if self.drafter is not None and params.draft_p_min is not None:
            self.drafter.set_p_min(params.draft_p_min)
        stream = TextStream(self.target, params.stop)
        self.learned.enter(regime(params.sampling, params.same_as_plain))
        proposer = make_proposer(self.drafter, params.draft_max, self.costs, self.learned)
        return Generation(self._rounds(context, params, proposer, stream), stream, context)

    def _rounds(
        self, context: list[int], params: GenerationParams, proposer: Proposer, stream: TextStream
    ) -> Iterator[Event]:
        target = self.target
        sampler, seed, filters, why = self._sampler(params)
        # The most rows one verify may have: llama.cpp's graph filters at most FILTERED_ROWS a decode.
        most_rows = target.filtered_rows if filters is not None else target.n_ctx

        # Prompt: evaluate everything but the last token, which the first round's verify decodes.
        t0 = time.perf_counter()
        proposer.prepare()
        cached = target.keep_common_prefix(context)
        if len(context) - 1 > cached:
            target.decode(context[cached:-1], outputs="none")
        proposer.begin(context, sampler)
        yield PromptEvent(len(context), len(context) - cached, time.perf_counter() - t0, seed, sampler.mode,
                          "backend" if filters is not None else "host", why)

        # The round's work is the same every time: its calls looked up once (a fast model's token
        # leaves a few tens of microseconds for all of it).
        clock, propose, batch_size = time.perf_counter, proposer.propose, proposer.batch_size
        decode = target.decode_filtered if filters is not None else target.decode
        # Plain decoding's proposer learns nothing from a round: no report is made for it.
        observe = proposer.observe if type(proposer).observe is not Proposer.observe else None
        max_tokens, rollback = params.max_tokens, min(target.max_rollback, most_rows - 1)
        gen_start = clock()
        stop_reason, n_emitted, index = "length", 0, 0
        while n_emitted < max_tokens and stop_reason == "length":
            n_context = len(context)
            room = target.n_ctx - n_context  # drafts that fit beside the pending token
            if room < 0:
                stop_reason = "context"
                break
            decoded = target.decode_seconds + proposer.decode_seconds
            t_start = clock()
            # A round emits up to k + 1 tokens: no drafts past max_tokens or the context, and no more
            # than a recurrent/hybrid target can roll back (all k when every draft is rejected).
            limit = min(max_tokens - n_emitted - 1, room, rollback)
            draft = propose(context, limit, left=min(max_tokens - n_emitted, room + 1))
            t_drafted = clock()
            batch = [context[-1], *draft.tokens]
            # Where a larger batch costs less on this machine (a CPU kernel's threshold), pad to it:
            # causal attention keeps the rows of the batch's own tokens as they were.
            padding = batch_size(len(batch), min(room, rollback) + 1) - len(batch)
            if filters is not None:
                rows = decode(batch + [batch[-1]] * padding if padding else batch)
            elif padding:
                rows = decode(batch + [batch[-1]] * padding, outputs="all")[: len(batch)]
            else:
                rows = decode(batch, outputs="all")
            t_verified = clock()
            verdict = verify(rows, draft, sampler, n_context)
            target.truncate(n_context + verdict.n_accepted)  # the cache holds the new context[:-1]
            context.extend(verdict.tokens)
            if observe is not None:
                observe(RoundResult(context, draft, verdict, t_drafted - t_start, t_verified - t_drafted,
                                    padding))
            events, emitted, stop_reason, used = _emit(target, stream, draft, verdict, index,
                                                       max_tokens - n_emitted)
            n_emitted += emitted
            t_end = clock()
            yield from events
            k = len(draft.tokens)
            yield RoundEvent(
                index=index, drafter=draft.drafter if k else None, k=k, accepted=verdict.n_accepted,
                emitted=emitted, draft_seconds=t_drafted - t_start, verify_seconds=t_verified - t_drafted,
                other_seconds=t_end - t_verified,
                decode_seconds=target.decode_seconds + proposer.decode_seconds - decoded,
                elapsed_seconds=t_end - gen_start, used=used if used < len(verdict.tokens) else None)
            index += 1

        if not stream.stopped:
            yield from stream.flush()
        yield DoneEvent(stop_reason, stream.text, time.perf_counter() - gen_start, proposer.holdback())

    def _sampler(self, params: GenerationParams) -> tuple[Sampler, int, GraphFilters | None, str]:
        """A generation's sampler, its seed, and where it filters (the target's graph filters, set on
        the target, or None: the host) and why."""
        sampling = params.sampling
        if params.ignore_eos:
            sampling = replace(sampling, banned=(*sampling.banned, *self.target.eog_tokens()))
        seed = params.seed if params.seed is not None else random_seed()
        filters, why = sampling_path(self.target, sampling, params.sampling_on)
        self.target.set_filters(filters)
        sampler = Sampler(sampling, Noise(seed), params.same_as_plain,
                          drafts_in_graph=drafts_in_graph(self.target, sampling, params.sampling_on))
        return sampler, seed, filters, why

    def reset(self) -> None:
        """Empty both caches (the next generation evaluates its whole prompt)."""
        self.target.reset()
        if self.drafter:
            self.drafter.reset()


def _emit(
    target: Model, stream: TextStream, draft: Draft, verdict: Verdict, index: int, budget: int
) -> tuple[list[Event], int, str, int]:
    """A round's events: its accepted drafts, the rejected ones (before the target's correction, as
    they were drafted), then the target's own token; at most `budget` tokens, none from EOG on, none
    past a stop string. Returns (events, tokens emitted, "eos" | "stop" | "length", verified tokens
    used: up to the one that ended the output, or all)."""
    k, n_accepted = len(draft.tokens), verdict.n_accepted
    last_origin = Origin.PLAIN if k == 0 else (Origin.BONUS if n_accepted == k else Origin.CORRECTED)
    tokens = verdict.tokens
    if len(tokens) <= budget and not stream.stop and not any(map(target.is_eog, tokens)):
        # The usual round: every token goes out, nothing can end the output: its text in one pass.
        drafter = draft.drafter
        out = [TokenEvent(token, "", Origin.ACCEPTED, index, drafter) for token in tokens[:n_accepted]]
        out.append(TokenEvent(tokens[-1], "", last_origin, index, None))
        stream.push_all(out)
        if n_accepted < k:
            rejected = draft.tokens[n_accepted:]
            out.insert(n_accepted, RejectedEvent(rejected, target.detokenize(rejected), index, drafter))
        return out, len(tokens), "length", len(tokens)
    events: list[Event] = []
    emitted = 0
    for i, token in enumerate(tokens):
        if i == n_accepted < k:
            rejected = draft.tokens[n_accepted:]
            events.append(RejectedEvent(rejected, target.detokenize(rejected), index, draft.drafter))
        if target.is_eog(token):
            return events, emitted, "eos", i + 1
        origin = Origin.ACCEPTED if i < n_accepted else last_origin
        drafter = draft.drafter if origin is Origin.ACCEPTED else None
        events.extend(stream.push(TokenEvent(token, "", origin, index, drafter)))
        emitted += 1
        if stream.stopped:
            return events, emitted, "stop", i + 1
        if emitted >= budget:
            return events, emitted, "length", i + 1
    return events, emitted, "length", len(tokens)
