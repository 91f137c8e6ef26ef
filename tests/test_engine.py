"""The engine on real llama.cpp inference: greedy equivalence, exact sampling, rollback, vocabulary check."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from specli import GenerationParams, SamplingParams, TokenEvent, load
from specli.compat import VocabMismatchError, check_vocab
from specli.events import DoneEvent, Origin, RejectedEvent, RoundEvent
from specli.llama import Model, ModelOptions
from specli.sampling import process_logits

PROMPT = "Once upon a time"
GREEDY = SamplingParams(temperature=0.0)


def generate(spec, prompt, **kw) -> tuple[list[int], list]:
    events = list(spec.generate(prompt, GenerationParams(**kw)))
    return [e.token for e in events if isinstance(e, TokenEvent)], events


def plain_greedy(model_path, prompt: str, n: int) -> list[int]:
    """Reference: the target's own greedy decoding, one token per llama_decode, no engine involved."""
    with Model(model_path, ModelOptions(n_ctx=512, n_threads=1)) as m:
        tokens = m.tokenize(prompt)
        rows = m.decode(tokens, outputs="last")
        out = []
        for _ in range(n):
            t = int(np.argmax(rows[0]))
            if m.is_eog(t):
                break
            out.append(t)
            rows = m.decode([t], outputs="last")
        return out


def pairs(fixture_models):
    return [(fixture_models.target, fixture_models.draft)]


@pytest.mark.parametrize("draft_max", [1, 2, 4, 8, "auto"])
@pytest.mark.parametrize("drafter", ["model", "ngram", "combined"])
def test_greedy_speculative_equals_plain_greedy(fixture_models, draft_max, drafter) -> None:
    expected = plain_greedy(fixture_models.target, PROMPT, 80)
    draft = "ngram" if drafter == "ngram" else fixture_models.draft
    with load(fixture_models.target, draft, n_ctx=512, ngram=drafter == "combined", n_threads=1) as spec:
        got, events = generate(spec, PROMPT, max_tokens=80, sampling=GREEDY, draft_max=draft_max)
        assert got == expected
        # Both caches hold exactly the committed context minus the pending token.
        assert spec.target.tokens == spec.engine.context[:-1]
        if drafter == "model" and draft_max != "auto":
            assert spec.stats.drafted > 0 and spec.stats.accepted > 0
            origins = {e.origin for e in events if isinstance(e, TokenEvent)}
            assert Origin.ACCEPTED in origins


def test_greedy_equivalence_on_real_trained_pair(shared_models) -> None:
    target, draft = shared_models.target, shared_models.draft
    expected = plain_greedy(target, PROMPT, 64)
    for k in (1, 3, 4, "auto"):
        with load(target, draft, n_ctx=512, n_threads=1) as spec:
            got, _ = generate(spec, PROMPT, max_tokens=64, sampling=GREEDY, draft_max=k)
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
        _, events = generate(spec, PROMPT, max_tokens=40, sampling=GREEDY, draft_max=3)
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
        full, events = generate(spec, PROMPT, max_tokens=60, sampling=GREEDY, draft_max=4)
        text = events[-1].text
        stop = text[10:14]
        _, stopped = generate(spec, PROMPT, max_tokens=60, sampling=GREEDY, draft_max=4, stop=[stop])
        assert stopped[-1].stop_reason == "stop"
        assert stopped[-1].text == text[: text.index(stop)]
        assert stop not in "".join(e.text for e in stopped if isinstance(e, TokenEvent))
        for n in (1, 2, 7):
            got, _ = generate(spec, PROMPT, max_tokens=n, sampling=GREEDY, draft_max=4)
            assert got == full[:n]


def test_reproducible_with_a_seed(fixture_models) -> None:
    params = dict(max_tokens=40, sampling=SamplingParams(temperature=1.0), seed=123, draft_max=3)
    with load(fixture_models.target, fixture_models.draft, n_ctx=512, n_threads=1) as spec:
        a, _ = generate(spec, PROMPT, **params)
        b, _ = generate(spec, PROMPT, **params)
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


# -- exact sampling on real models ------------------------------------------------------------------


def _tv(a: np.ndarray, b: np.ndarray) -> float:
    return 0.5 * float(np.abs(a - b).sum())


def _null_threshold(p: np.ndarray, n: int) -> float:
    sims = np.random.default_rng(5).multinomial(n, p / p.sum(), size=400) / n
    return float(np.quantile(0.5 * np.abs(sims - p).sum(axis=1), 0.999))


@pytest.mark.parametrize(("drafter", "draft_max"), [("model", 3), ("ngram", 3), ("model", "auto")])
def test_sampled_tokens_follow_the_target_distribution(fixture_models, drafter, draft_max) -> None:
    """Positions 1 and 2 of many seeded generations against the target's exact distributions."""
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    trials = 1500
    with Model(fixture_models.target, ModelOptions(n_ctx=256, n_threads=1)) as ref:
        prompt = ref.tokenize(PROMPT)
        p1 = process_logits(ref.decode(prompt, outputs="last")[0], params)

    firsts, seconds = Counter(), Counter()
    drafted, draft_seconds = 0, 0.0
    draft = "ngram" if drafter == "ngram" else fixture_models.draft
    with load(fixture_models.target, draft, n_ctx=256, n_threads=1) as spec:
        for seed in range(trials):
            got, _ = generate(spec, prompt, max_tokens=4, sampling=params, seed=seed, draft_max=draft_max)
            firsts[got[0]] += 1
            seconds[tuple(got[:2])] += 1
            drafted += spec.stats.drafted
            draft_seconds += spec.stats.draft_seconds
        # the draft model took part: drafts at fixed k; drafts or shadow proposals with auto
        assert drafted > 0 or drafter == "ngram" or (draft_max == "auto" and draft_seconds > 0)
    freq1 = np.zeros_like(p1)
    for t, c in firsts.items():
        freq1[t] = c / trials
    assert _tv(freq1, p1) < _null_threshold(p1, trials)

    # Position 2, given the most frequent first token: against p(. | prompt, t1).
    t1 = max(firsts, key=firsts.get)
    n_cond = firsts[t1]
    with Model(fixture_models.target, ModelOptions(n_ctx=256, n_threads=1)) as ref:
        p2 = process_logits(ref.decode([*prompt, t1], outputs="last")[0], params)
    freq2 = np.zeros_like(p2)
    for (a, b), c in seconds.items():
        if a == t1:
            freq2[b] += c / n_cond
    assert _tv(freq2, p2) < _null_threshold(p2, n_cond)


def test_draft_p_min_keeps_sampling_exact(fixture_models) -> None:
    """A draft that stops on low confidence stays exact only if the stop does not depend on the token
    it would propose. Gating on the sampled token's own probability (the draft's top token has 0.37
    here, its second 0.15) biased position 1 by 0.047 in total variation, 3x the null threshold at
    6000 trials; gating on the top probability leaves it exact."""
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    trials = 6000
    with Model(fixture_models.target, ModelOptions(n_ctx=256, n_threads=1)) as ref:
        prompt = ref.tokenize("Hello")
        p1 = process_logits(ref.decode(prompt, outputs="last")[0], params)
    firsts: Counter = Counter()
    drafted = 0
    with load(fixture_models.target, fixture_models.draft, n_ctx=256, n_threads=1, draft_p_min=0.1) as spec:
        for seed in range(trials):
            got, events = generate(spec, prompt, max_tokens=2, sampling=params, seed=seed, draft_max=1)
            firsts[got[0]] += 1
            drafted += next(e.k for e in events if isinstance(e, RoundEvent))
    assert drafted > trials // 2  # the draft took part
    freq1 = np.zeros_like(p1)
    for t, c in firsts.items():
        freq1[t] = c / trials
    assert _tv(freq1, p1) < _null_threshold(p1, trials)


def test_draft_distribution_differs_from_target(fixture_models) -> None:
    """Power check for the test above: the draft is far enough from the target to be caught."""
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    opts = ModelOptions(n_ctx=256, n_threads=1)
    with Model(fixture_models.target, opts) as t, Model(fixture_models.draft, opts) as d:
        prompt = t.tokenize(PROMPT)
        p = process_logits(t.decode(prompt, outputs="last")[0], params)
        q = process_logits(d.decode(prompt, outputs="last")[0], params, out_width=p.shape[0])
    assert _tv(p, q) > 3 * _null_threshold(p, 1500)


def test_auto_k_keeps_estimates_per_proposer_when_combined(fixture_models) -> None:
    """Combined drafting: the policy learns n-gram and draft-model acceptance separately."""
    text = "the cat sat on the mat. the cat sat on the mat. the cat sat on the"
    with load(fixture_models.target, fixture_models.draft, n_ctx=512, ngram=True, n_threads=1) as spec:
        got, _ = generate(spec, text, max_tokens=60, sampling=GREEDY, draft_max="auto")
        assert got == plain_greedy(fixture_models.target, text, 60)
        assert {source.split("/")[0] for source in spec.engine.policy.sources} <= {"ngram", "draft"}
        assert spec.engine.policy.sources


def test_auto_gates_the_draft_model_by_its_confidence(fixture_models) -> None:
    """With a draft model, auto learns what each confidence is worth (from verified tokens and from
    positions the gate held back) and still gives the target's own greedy output."""
    with load(fixture_models.target, fixture_models.draft, n_ctx=512, n_threads=1) as spec:
        got, events = generate(spec, PROMPT, max_tokens=80, sampling=GREEDY, draft_max="auto")
        assert got == plain_greedy(fixture_models.target, PROMPT, 80)
        calibration = spec.engine.costs.calibration["draft"]
        # Beyond the prior: at least the first round's shadow and the second round's draft, whatever
        # the timings (which decide how much auto drafts after that).
        assert calibration.seen.sum() > len(calibration.seen) + 1
        assert calibration.first.sum() > 0
        assert spec.target.tokens == spec.engine.context[:-1]
