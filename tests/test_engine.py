"""The engine on real llama.cpp inference: greedy equivalence, rollback, events, vocabulary check.

Exact sampling (the output distribution) is tested in test_exactness.py."""

from __future__ import annotations

import numpy as np
import pytest
from support import PROMPT, plain_greedy

from specli import Generation, GenerationParams, SamplingParams, TokenEvent, load
from specli.compat import VocabMismatchError, check_vocab
from specli.events import DoneEvent, Origin, RejectedEvent, RoundEvent
from specli.llama import Model, ModelOptions
from specli.sampling import Noise, Sampler

GREEDY = SamplingParams(temperature=0.0)


def generate(spec, prompt, **kw) -> tuple[list[int], list, Generation]:
    generation = spec.generate(prompt, GenerationParams(**kw))
    events = list(generation)
    return [e.token for e in events if isinstance(e, TokenEvent)], events, generation


@pytest.mark.parametrize("draft_max", [1, 2, 4, 8, "auto"])
@pytest.mark.parametrize("drafter", ["model", "ngram", "combined"])
def test_greedy_speculative_equals_plain_greedy(fixture_models, draft_max, drafter) -> None:
    expected = plain_greedy(fixture_models.target, PROMPT, 80)
    draft = "ngram" if drafter == "ngram" else fixture_models.draft
    with load(fixture_models.target, draft, n_ctx=512, ngram=drafter == "combined", n_threads=1) as spec:
        got, events, gen = generate(spec, PROMPT, max_tokens=80, sampling=GREEDY, draft_max=draft_max)
        assert got == expected
        # Both caches hold exactly the committed context minus the pending token.
        assert spec.target.tokens == gen.context[:-1]
        if drafter == "model" and draft_max != "auto":
            assert gen.stats.drafted > 0 and gen.stats.accepted > 0
            origins = {e.origin for e in events if isinstance(e, TokenEvent)}
            assert Origin.ACCEPTED in origins


def test_greedy_equivalence_on_real_trained_pair(shared_models) -> None:
    target, draft = shared_models.target, shared_models.draft
    expected = plain_greedy(target, PROMPT, 64)
    for k in (1, 3, 4, "auto"):
        with load(target, draft, n_ctx=512, n_threads=1) as spec:
            got, _, gen = generate(spec, PROMPT, max_tokens=64, sampling=GREEDY, draft_max=k)
            assert got == expected, f"k={k}"
    with load(target, draft, n_ctx=512, n_threads=1) as spec:
        text = "".join(
            e.text
            for e in spec.generate(PROMPT, GenerationParams(max_tokens=20, sampling=GREEDY))
            if isinstance(e, TokenEvent)
        )
    assert text.startswith(", there was a little girl named Lily.")


def test_rollback_gives_the_logits_of_a_fresh_evaluation(fixture_models) -> None:
    opts = ModelOptions(n_ctx=256, n_threads=1)
    with Model(fixture_models.target, opts) as m, Model(fixture_models.target, opts) as fresh:
        prompt = m.tokenize(PROMPT)
        m.decode(prompt, outputs="none")
        m.decode([5, 6, 7, 8, 9], outputs="all")  # a "draft" that will be rejected
        m.truncate(len(prompt) + 1)  # keep the first of them
        after = m.decode([42], outputs="last").copy()
        reference = fresh.decode([*prompt, 5, 42], outputs="last").copy()
        assert m.tokens == [*prompt, 5, 42]
        np.testing.assert_allclose(after, reference, rtol=1e-4, atol=1e-4)


def test_events_describe_each_round(fixture_models) -> None:
    with load(fixture_models.target, fixture_models.draft, n_ctx=512, n_threads=1) as spec:
        _, events, gen = generate(spec, PROMPT, max_tokens=40, sampling=GREEDY, draft_max=3)
    rounds = [e for e in events if isinstance(e, RoundEvent)]
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    assert isinstance(events[-1], DoneEvent) and events[-1].stop_reason == "length"
    assert sum(r.emitted for r in rounds) == len(tokens) == 40
    for r in rounds:
        assert 0 <= r.accepted <= r.k <= 3
        mine = [t for t in tokens if t.round == r.index]
        assert len(mine) == r.emitted
        assert sum(t.origin is Origin.ACCEPTED for t in mine) == min(r.accepted, r.emitted)
    for rej in (e for e in events if isinstance(e, RejectedEvent)):
        assert rej.tokens
    assert events[-1].text == "".join(t.text for t in tokens)


def test_max_tokens_and_stop_strings(fixture_models) -> None:
    with load(fixture_models.target, fixture_models.draft, n_ctx=512, n_threads=1) as spec:
        full, events, gen = generate(spec, PROMPT, max_tokens=60, sampling=GREEDY, draft_max=4)
        text = events[-1].text
        stop = text[10:14]
        _, stopped, gen = generate(spec, PROMPT, max_tokens=60, sampling=GREEDY, draft_max=4, stop=[stop])
        assert stopped[-1].stop_reason == "stop"
        assert stopped[-1].text == text[: text.index(stop)]
        assert stop not in "".join(e.text for e in stopped if isinstance(e, TokenEvent))
        for n in (1, 2, 7):
            got, _, gen = generate(spec, PROMPT, max_tokens=n, sampling=GREEDY, draft_max=4)
            assert got == full[:n]


def test_a_stop_string_at_a_token_boundary_releases_no_empty_token(fixture_models) -> None:
    """A stop string that begins exactly where a token begins: that token is not part of the output
    (no event with its id and no text), so tokens, text and stats agree."""
    with load(fixture_models.target, None, n_ctx=512, n_threads=1) as spec:
        full, events, gen = generate(spec, PROMPT, max_tokens=30, sampling=GREEDY)
        pieces = [e.text for e in events if isinstance(e, TokenEvent)]
        text_before = ["".join(pieces[:i]) for i in range(len(pieces))]
        i = next(i for i in range(5, len(pieces)) if pieces[i].strip() and pieces[i] not in text_before[i])
        got, stopped, gen = generate(spec, PROMPT, max_tokens=30, sampling=GREEDY, stop=[pieces[i]])
        released = [e for e in stopped if isinstance(e, TokenEvent)]
        assert got == full[:i] and all(e.text for e in released)
        assert stopped[-1].text == "".join(pieces[:i]) and gen.stats.n_generated == i


def test_reproducible_with_a_seed(fixture_models) -> None:
    params = dict(max_tokens=40, sampling=SamplingParams(temperature=1.0), seed=123, draft_max=3)
    with load(fixture_models.target, fixture_models.draft, n_ctx=512, n_threads=1) as spec:
        a, _, gen = generate(spec, PROMPT, **params)
        b, _, gen = generate(spec, PROMPT, **params)
    assert a == b


def test_vocabulary_mismatch_is_refused(fixture_models) -> None:
    with pytest.raises(VocabMismatchError, match="cannot draft for"):
        load(fixture_models.target, fixture_models.other_vocab, n_ctx=256, n_threads=1)
    with (
        Model(fixture_models.target, ModelOptions(n_ctx=64, n_threads=1)) as t,
        Model(fixture_models.draft, ModelOptions(n_ctx=64, n_threads=1)) as d,
    ):
        report = check_vocab(t, d)
        assert report.ok and report.checked_token_texts > 0


def test_auto_k_keeps_estimates_per_proposer_when_combined(fixture_models) -> None:
    """Combined drafting: the policy learns n-gram and draft-model acceptance separately."""
    text = "the cat sat on the mat. the cat sat on the mat. the cat sat on the"
    with load(fixture_models.target, fixture_models.draft, n_ctx=512, ngram=True, n_threads=1) as spec:
        got, _, gen = generate(spec, text, max_tokens=60, sampling=GREEDY, draft_max="auto")
        assert got == plain_greedy(fixture_models.target, text, 60)
        # What auto learned per source (each generation's calibration is the next one's start).
        assert set(spec.engine.learned.calibration) <= {"ngram", "draft"}
        assert spec.engine.learned.calibration


def test_auto_gates_the_draft_model_by_its_confidence(fixture_models) -> None:
    """With a draft model, auto learns what each confidence is worth (from verified tokens and from
    positions the gate held back) and still gives the target's own greedy output."""
    with load(fixture_models.target, fixture_models.draft, n_ctx=512, n_threads=1) as spec:
        got, events, gen = generate(spec, PROMPT, max_tokens=80, sampling=GREEDY, draft_max="auto")
        assert got == plain_greedy(fixture_models.target, PROMPT, 80)
        calibration = spec.engine.learned.calibration["draft"]
        # Beyond the prior: at least the first round's shadow and the second round's draft, whatever
        # the timings (which decide how much auto drafts after that).
        assert calibration.seen.sum() > len(calibration.seen) + 1
        assert calibration.first.sum() > 0
        assert spec.target.tokens == gen.context[:-1]


class _StopAt:
    """A gate that drafts every position before `stop`; `before_step` says whether it stops there
    before the draft model's step (`look`) or after, seeing the confidence (then it is held)."""

    def __init__(self, stop: int, before_step: bool) -> None:
        self.stop, self.before_step = stop, before_step

    def __call__(self, position: int, confidence: float) -> bool:
        return position < self.stop

    def best_prefix(self, confidences) -> int:
        return min(self.stop, len(confidences))

    def look(self, position: int) -> bool:
        return not (self.before_step and position >= self.stop)


def test_a_gate_that_stops_before_a_step_saves_the_draft_model_that_decode(fixture_models) -> None:
    """A position the gate refuses after seeing its confidence cost the draft model a decode (the
    last drafted token's) and is held for scoring; one it refuses before the step costs nothing and
    holds nothing. The drafted tokens are the same either way."""
    greedy = Sampler(SamplingParams(temperature=0.0), Noise(0))
    with load(fixture_models.target, fixture_models.draft, n_ctx=256, n_threads=1) as spec:
        drafter = spec.drafter
        context = spec.target.tokenize(PROMPT)
        drafts = {}
        for before_step in (False, True):
            drafter.reset()
            drafter.begin(context, greedy)
            drafts[before_step] = drafter.draft(context, 8, _StopAt(2, before_step))
            # The draft model's cache: the context, then each drafted token it went on from.
            assert drafter.model.n_past == len(context) + 2 - before_step
        assert drafts[False].tokens == drafts[True].tokens and len(drafts[True].tokens) == 2
        assert drafts[False].held is not None and drafts[True].held is None


def test_a_batch_padded_to_a_cheaper_size_verifies_as_the_draft_alone(fixture_models) -> None:
    """Where a larger verify batch is measured cheaper (a CPU kernel's threshold), the round pads to it:
    the rows of the draft's own tokens, the output and the cache are those of the unpadded round."""
    expected = plain_greedy(fixture_models.target, PROMPT, 48)
    with load(fixture_models.target, fixture_models.draft, n_ctx=512, n_threads=1) as spec:
        costs = spec.engine.costs
        # As if verifying were dear next to a draft step, and every batch of 2 to 23 tokens dearer than
        # one of 24: each drafting round verifies 24 rows.
        costs.prime_verify({1: 1e-2, 2: 5e-2, 23: 5e-2, 24: 1.2e-2}, weight=9)
        got, events, gen = generate(spec, PROMPT, max_tokens=48, sampling=GREEDY, draft_max="auto")
        assert got == expected
        assert spec.target.tokens == gen.context[:-1]
        drafted = [e for e in events if isinstance(e, RoundEvent) and e.k]
        assert len(drafted) >= 2 and all(e.k + 1 < 24 for e in drafted)
        # Each padded round was timed as the 24-row batch it ran (the first, the largest yet, is cold).
        assert set(costs.verify) == {1, 2, 23, 24}
        assert any(s != 1.2e-2 for s in costs.verify[24])


def test_drafts_past_a_stop_text_count_neither_as_drafted_nor_accepted(fixture_models) -> None:
    """A round verifies drafts beyond where a stop text ends the reply; they never were part of it, so the
    figures leave them out (a one-token reply once reported eight accepted drafts). Greedy on F32, the
    rounds of a run with a stop text are those of the run without it, up to the stop."""
    with load(fixture_models.target, fixture_models.draft, n_ctx=512, n_threads=1) as spec:
        tokens, events, full = generate(spec, PROMPT, max_tokens=120, sampling=GREEDY, draft_max=8)
        origins = [e.origin for e in events if isinstance(e, TokenEvent)]
        rounds = [e for e in events if isinstance(e, RoundEvent)]
        # A round with accepted drafts left after its second token: the stop text ends there.
        start = 0
        for r in rounds:
            if r.accepted >= 4:
                end = start + 2  # the reply ends with the round's second token
                pieces = [spec.target.detokenize(tokens[:i]) for i in range(end + 1)]
                # The shortest text ending there that appears nowhere before.
                found = (pieces[end][len(pieces[i]):] for i in range(start, -1, -1))
                stop = next((t for t in found if pieces[end].find(t) == len(pieces[end]) - len(t)), "")
                if stop.strip():
                    break
            start += r.emitted
        else:
            pytest.skip("no round of this run accepts 4 drafts with a stop text that first appears there")
        cut = generate(spec, PROMPT, max_tokens=120, sampling=GREEDY, draft_max=8, stop=[stop])[2]
    assert cut.stats.stop_reason == "stop" and full.text.startswith(cut.text)
    expected_accepted = sum(o is Origin.ACCEPTED for o in origins[:end])
    expected_drafted, position = 0, 0
    for r in rounds:
        if position >= end:
            break
        # A round the reply ends inside counts the drafts up to that point; the others count all of theirs.
        expected_drafted += r.k if position + r.emitted < end else min(r.k, end - position)
        position += r.emitted
    assert cut.stats.accepted == expected_accepted < full.stats.accepted
    assert cut.stats.drafted == expected_drafted
    assert cut.stats.accepted <= cut.stats.drafted
