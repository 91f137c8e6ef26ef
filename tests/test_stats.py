"""GenerationStats: every figure checked against values, never only against the presence of a key.

Hand-built event streams pin each formula; real generations (draft model, n-gram lookup, combined)
check that the figures the stats report are the ones the run's own events imply.
"""

from __future__ import annotations

from collections import Counter
from itertools import product

import pytest
from support import free_drafting

from specli import GenerationParams, SamplingParams, load
from specli.events import DoneEvent, Origin, PromptEvent, RejectedEvent, RoundEvent, TokenEvent
from specli.stats import GenerationStats, expected_tokens_per_round


def test_expected_tokens_per_round_is_the_mean_of_the_truncated_geometric() -> None:
    """The oracle of the predicted speedups, computed independently: a round of k drafts accepts j < k
    with probability alpha^j (1 - alpha) and all k with alpha^k, and emits accepted + 1 tokens."""
    for alpha, k in product((0.0, 0.2, 0.5, 0.9, 0.999), range(0, 9)):
        law = [alpha**j * (1 - alpha) for j in range(k)] + [alpha**k]
        assert sum(law) == pytest.approx(1.0)
        mean = sum((j + 1) * p for j, p in enumerate(law))
        assert expected_tokens_per_round(alpha, k) == pytest.approx(mean, rel=1e-9)
    assert expected_tokens_per_round(1.0, 4) == 5.0  # every draft accepted, plus the bonus
    assert expected_tokens_per_round(0.0, 4) == 1.0  # the first draft fails: the correction only
    assert expected_tokens_per_round(0.7, 0) == 1.0  # a plain round


def _round_events(index: int, k: int, accepted: int, drafter: str | None, draft_s: float,
                  verify_s: float) -> list:
    """The events of one round as the engine emits them (rejected proposals before the correction)."""
    events: list = [
        TokenEvent(100 + i, f"a{index}{i} ", Origin.ACCEPTED, index, drafter) for i in range(accepted)
    ]
    if k and accepted < k:
        events.append(RejectedEvent([7] * (k - accepted), "x", index, drafter))
    last = Origin.PLAIN if k == 0 else (Origin.BONUS if accepted == k else Origin.CORRECTED)
    events.append(TokenEvent(200 + index, f"t{index} ", last, index))
    events.append(
        RoundEvent(index=index, drafter=drafter if k else None, k=k, accepted=accepted, emitted=accepted + 1,
                   draft_seconds=draft_s, verify_seconds=verify_s, other_seconds=0.001)
    )
    return events


def _hand_built() -> GenerationStats:
    stats = GenerationStats()
    stream = [PromptEvent(12, 9, 0.030)]
    rounds = [  # (k, accepted, drafter, draft seconds, verify seconds)
        (0, 0, None, 0.0, 0.010),
        (4, 4, "draft", 0.004, 0.020),
        (4, 1, "ngram", 0.000, 0.020),
        (2, 0, "draft", 0.002, 0.015),
        (0, 0, None, 0.0, 0.012),
        (4, 3, "draft", 0.004, 0.020),
    ]
    for i, r in enumerate(rounds):
        stream += _round_events(i, *r)
    stream.append(DoneEvent("length", ""))
    for event in stream:
        stats.observe(event)
    stats.generation_seconds = 0.2
    stats.decode_seconds = 0.15
    stats.stop_reason = "length"
    return stats


def test_figures_of_a_hand_built_stream() -> None:
    stats = _hand_built()
    d = stats.as_dict()
    # 6 rounds emitting 1, 5, 2, 1, 1, 4 tokens
    assert (d["generated_tokens"], d["rounds"], d["drafted"], d["accepted"]) == (14, 6, 14, 8)
    assert (d["prompt_tokens"], d["prompt_tokens_evaluated"], d["prompt_seconds"]) == (12, 9, 0.03)
    assert d["acceptance_rate"] == pytest.approx(8 / 14, abs=1e-4)
    # Three rounds stopped at a rejection: 8 accepted of 8 + 3 positions examined.
    assert d["alpha"] == pytest.approx(8 / 11, abs=1e-4)
    assert d["tokens_per_round"] == pytest.approx(14 / 6, abs=1e-4)
    # Drafting rounds only: accepted 4, 1, 0, 3 once each.
    assert d["accepted_per_round_histogram"] == {"0": 1, "1": 1, "3": 1, "4": 1}
    assert stats.drafting_rounds == 4
    assert d["k_per_round"] == [0, 4, 4, 2, 0, 4]
    assert d["origins"] == {"plain": 2, "accepted": 8, "bonus": 1, "corrected": 3}
    assert d["accepted_by_drafter"] == {"draft": 7, "ngram": 1}
    assert d["draft_ms_per_token"] == pytest.approx(1000 * 0.010 / 14, abs=1e-3)
    assert d["verify_ms_per_round"] == pytest.approx(1000 * 0.097 / 6, abs=1e-3)
    assert d["verify_ms_by_batch_size"] == {"1": 11.0, "3": 15.0, "5": 20.0}
    assert d["tokens_per_second"] == pytest.approx(70.0)
    assert d["overhead_fraction"] == pytest.approx(0.25)
    # Two rates: the first draft passed in 3 of 4 drafting rounds (a1); later drafts passed 5 times of 7
    # judged (3 in the full round, 0 + the rejected 2nd in the k=4/1 round, 2 + the rejected 4th).
    assert (stats.a1, stats.a2) == (pytest.approx(3 / 4), pytest.approx(5 / 7))
    # The prediction with them and T_v(1) = 11 ms: expected tokens per round over what rounds cost.
    expected = sum(_expected(3 / 4, 5 / 7, k) for k in (0, 4, 4, 2, 0, 4))
    assert d["predicted_speedup"] == pytest.approx(expected * 0.011 / (0.010 + 0.097), abs=1e-3)
    assert d["stop_reason"] == "length"


def test_figures_without_data_are_none_not_zero() -> None:
    d = GenerationStats().as_dict()
    for key in ("acceptance_rate", "alpha", "tokens_per_round", "tokens_per_second", "draft_ms_per_token",
                "verify_ms_per_round", "overhead_fraction", "predicted_speedup"):
        assert d[key] is None, key
    plain = GenerationStats()
    for event in _round_events(0, 0, 0, None, 0.0, 0.01):
        plain.observe(event)
    # Nothing drafted: no acceptance and no prediction, though T_v(1) is known.
    assert plain.alpha is None and plain.predicted_speedup is None and plain.accepted_per_round == Counter()
    drafted_only = GenerationStats()
    for event in _round_events(0, 3, 1, "draft", 0.003, 0.02):
        drafted_only.observe(event)
    assert drafted_only.predicted_speedup is None  # no single-token verify measured to compare with


# -- real generations: the stats agree with the events of their own run ------------------------------------


def _expected(a1: float, a2: float, k: int) -> float:
    """Tokens a round of k drafts yields on average: the target's own, plus draft j when drafts 1..j
    all pass (the first with a1, each later one with a2)."""
    return 1.0 + sum(a1 * a2 ** (j - 1) for j in range(1, k + 1))


def _from_events(events: list) -> dict:
    """The figures recomputed from a run's events, independently of GenerationStats."""
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    rounds = [e for e in events if isinstance(e, RoundEvent)]
    drafting = [r for r in rounds if r.k]
    accepted = sum(r.accepted for r in rounds)
    examined = accepted + sum(1 for r in drafting if r.accepted < r.k)
    alpha = accepted / examined if examined else None
    plain_verify = [r.verify_seconds for r in rounds if r.k == 0]
    spent = sum(r.draft_seconds + r.verify_seconds for r in rounds)
    if alpha is None or not plain_verify:
        predicted = None
    else:
        a1 = sum(1 for r in drafting if r.accepted) / len(drafting)
        later = sum(r.accepted - 1 + (r.accepted < r.k) for r in drafting if r.accepted)
        a2 = sum(r.accepted - 1 for r in drafting if r.accepted) / later if later else a1
        t1 = sum(plain_verify) / len(plain_verify)
        predicted = sum(_expected(a1, a2, r.k) for r in rounds) * t1 / spent
    return {
        "generated_tokens": len(tokens),
        "rounds": len(rounds),
        "drafted": sum(r.k for r in rounds),
        "accepted": accepted,
        "alpha": alpha,
        "acceptance_rate": accepted / sum(r.k for r in rounds) if drafting else None,
        "tokens_per_round": len(tokens) / len(rounds),
        "accepted_per_round_histogram": {
            str(n): c for n, c in sorted(Counter(r.accepted for r in drafting).items())
        },
        "k_per_round": [r.k for r in rounds],
        "origins": dict(Counter(t.origin.value for t in tokens)),
        "accepted_by_drafter": dict(Counter(t.drafter for t in tokens if t.origin is Origin.ACCEPTED)),
        "predicted_speedup": predicted,
    }


RUNS = {
    # name: (draft, ngram, draft_max, temperature)
    "draft-k3-sampled": ("draft", False, 3, 1.0),
    "ngram-auto-greedy": ("ngram", False, "auto", 0.0),
    "combined-k4-greedy": ("draft", True, 4, 0.0),
}


@pytest.mark.parametrize("name", list(RUNS))
def test_stats_of_a_real_run_are_those_its_events_imply(fixture_models, name) -> None:
    draft, ngram, draft_max, temperature = RUNS[name]
    draft_arg = fixture_models.draft if draft == "draft" else "ngram"
    params = GenerationParams(max_tokens=48, sampling=SamplingParams(temperature=temperature), seed=3,
                              draft_max=draft_max, ignore_eos=True)
    with load(fixture_models.target, draft_arg, n_ctx=256, n_threads=1, ngram=ngram) as spec:
        spec.engine.costs = free_drafting()  # auto drafts from its first rounds
        generation = spec.generate("Once upon a time there was a fox. Once upon a time", params)
        events = list(generation)
        d = generation.stats.as_dict()
    want = _from_events(events)
    assert want["drafted"] > 0, "the run must draft for this test to mean anything"
    assert want["generated_tokens"] == 48  # ignore_eos: exactly max_tokens
    for key in ("generated_tokens", "rounds", "drafted", "accepted", "accepted_per_round_histogram",
                "k_per_round", "origins", "accepted_by_drafter"):
        assert d[key] == want[key], key
    for key in ("alpha", "acceptance_rate", "tokens_per_round"):
        assert d[key] == pytest.approx(want[key], abs=1e-4), key
    if want["predicted_speedup"] is None:
        assert d["predicted_speedup"] is None
    else:
        assert d["predicted_speedup"] == pytest.approx(want["predicted_speedup"], rel=1e-3, abs=1e-3)
    # Without stop strings or EOS, every accepted draft is shown, and each round emits accepted + 1.
    rounds = [e for e in events if isinstance(e, RoundEvent)]
    assert sum(r.emitted for r in rounds) == want["generated_tokens"]
    assert all(r.emitted == r.accepted + 1 for r in rounds)
    assert d["origins"].get("accepted", 0) == d["accepted"]
    # A RejectedEvent carries exactly the proposals after the accepted prefix of its round.
    rejected = {e.round: e for e in events if isinstance(e, RejectedEvent)}
    assert set(rejected) == {r.index for r in rounds if r.k and r.accepted < r.k}
    for r in rounds:
        if r.index in rejected:
            assert len(rejected[r.index].tokens) == r.k - r.accepted
            assert rejected[r.index].drafter == r.drafter
    done = events[-1]
    assert isinstance(done, DoneEvent) and done.stop_reason == d["stop_reason"] == "length"
    assert done.text == "".join(e.text for e in events if isinstance(e, TokenEvent))
    assert d["tokens_per_second"] == pytest.approx(48 / generation.stats.generation_seconds, rel=1e-2)
