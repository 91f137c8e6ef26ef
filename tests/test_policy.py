"""The draft-length policy's arithmetic: cost prediction, k choice, probes (no model needed)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from specli.costs import CostModel
from specli.policy import AutoK, Calibration, Learned, _SourceEstimate
from specli.sampling import SamplingParams, acceptance_probability
from specli.stats import expected_tokens_per_round

# A 2-core CPU's verify staircase (ms, from `specli bench` on the demo target): m = 2 costs 1.7x m = 1,
# m = 3..6 little more, then another step.
CPU_STAIRCASE = {1: 30.8, 2: 53.3, 3: 61.8, 4: 64.3, 5: 70.8, 6: 72.3, 7: 90.7, 8: 100.1, 9: 102.1}


def _costs(points: dict[int, float], repeats: int = 3) -> CostModel:
    costs = CostModel()
    for _ in range(repeats):
        for m, ms in points.items():
            costs.observe_verify(m, ms / 1000)
    return costs


def test_nothing_predicted_before_a_single_token_verify_is_measured() -> None:
    costs = CostModel()
    assert costs.verify_seconds(5) is None
    costs.observe_verify(3, 0.05)
    assert costs.verify_seconds(5) is None
    assert AutoK(costs).choose_k("draft") == 0


def test_measured_sizes_give_their_median_and_unmeasured_ones_are_interpolated() -> None:
    costs = _costs({1: 10.0, 2: 20.0, 6: 28.0})
    costs.observe_verify(2, 5.0)  # one burst of load: the median ignores it
    predicted = costs.verify_seconds(6)
    assert predicted is not None
    assert predicted[0] == pytest.approx(0.010)
    assert predicted[1] == pytest.approx(0.020)
    assert predicted[3] == pytest.approx(0.024)  # m = 4, halfway between m = 2 and m = 6
    assert predicted[5] == pytest.approx(0.028)


def test_predictions_never_decrease_with_batch_size() -> None:
    costs = _costs({1: 10.0, 2: 20.0, 3: 18.0, 4: 25.0})
    predicted = costs.verify_seconds(8)
    assert predicted == sorted(predicted)


def test_unmeasured_larger_batches_are_predicted_optimistically() -> None:
    """Above the largest measured size the prediction uses the cheapest slope seen, or a small default,
    so that auto tries a larger k once rather than never learning the staircase."""
    only_two = _costs({1: 30.8, 2: 53.3}).verify_seconds(13)
    assert only_two is not None
    # A straight line through m = 1, 2 would predict 30.8 + 8 * 22.5 = 210.8 ms for m = 9; it costs 102.
    assert only_two[8] < 0.102
    three = _costs({1: 30.8, 2: 53.3, 3: 61.8}).verify_seconds(13)
    assert three is not None
    assert three[8] == pytest.approx(0.0618 + 6 * 0.0085)


def test_auto_explores_past_the_first_step_of_a_cpu_staircase_and_settles() -> None:
    """With a high acceptance, auto starts from m = 1 and 2 measured and ends at a k the true curve
    favours, measuring each size it tries."""
    costs = _costs({1: CPU_STAIRCASE[1], 2: CPU_STAIRCASE[2]})
    policy = AutoK(costs, k_max=8)
    alpha = 0.8
    rng = random.Random(0)
    chosen = []
    for _ in range(60):
        k = policy.choose_k("ngram/3")
        chosen.append(k)
        accepted = 0
        while accepted < k and rng.random() < alpha:  # each draft token accepted with probability alpha
            accepted += 1
        policy.observe("ngram/3", k, accepted, 0.0, CPU_STAIRCASE[k + 1] / 1000)
    true_rate = [expected_tokens_per_round(alpha, k) / CPU_STAIRCASE[k + 1] for k in range(9)]
    best = max(true_rate)
    assert max(chosen) > 1  # it left k = 1 (m = 2), which the two measured points alone would favour
    settled = chosen[-20:]
    assert sum(true_rate[k] for k in settled) / len(settled) >= 0.9 * best


def test_auto_chooses_plain_decoding_when_drafts_are_never_accepted_and_probes_with_backoff() -> None:
    costs = _costs(CPU_STAIRCASE)
    policy = AutoK(costs, probe_every=4)
    probes = []
    for round_index in range(200):
        k = policy.choose_k("draft")
        if k:
            probes.append(round_index)
        policy.observe("draft", k, 0, 0.002 * k, CPU_STAIRCASE.get(k + 1, 0.1) / 1000)
    assert len(probes) >= 3
    gaps = [b - a for a, b in zip(probes[1:], probes[2:], strict=False)]
    assert gaps == sorted(gaps) and gaps[-1] > gaps[0]  # probes grow rarer


def test_each_source_keeps_its_own_acceptance() -> None:
    policy = AutoK(_costs(CPU_STAIRCASE), k_max=8)
    for _ in range(20):
        policy.observe("ngram/3", 4, 4, 0.0, 0.064)
        policy.observe("ngram/1", 4, 0, 0.0, 0.064)
    assert policy.sources["ngram/3"].alpha > 0.9
    assert policy.sources["ngram/1"].alpha < 0.1
    assert policy.choose_k("ngram/3") >= 4
    assert policy.choose_k("ngram/1") == 0


def test_shadow_proposals_teach_acceptance_while_plain_and_bring_drafting_back() -> None:
    """At k = 0 no draft is verified, but shadow proposals (scored against the target's own row) keep
    the estimate current, so auto starts drafting again when the text becomes predictable."""
    policy = AutoK(_costs(CPU_STAIRCASE), k_max=8)
    for _ in range(10):
        policy.observe("draft", 4, 0, 0.008, 0.0643)
    assert policy.choose_k("draft") == 0
    ks = []
    for _ in range(11, 40):
        k = policy.choose_k("draft")
        ks.append(k)
        if k == 0:
            if policy.wants_shadow("draft"):
                policy.observe_shadow("draft", 1.0, 0.002)  # the draft would have been accepted
            policy.observe(None, 0, 0, 0.002, 0.0308)
        else:
            policy.observe("draft", k, k, 0.002 * k, CPU_STAIRCASE[k + 1] / 1000)
    assert ks[-1] >= 3
    # probes alone (k = 1, fully accepted, every 4th round) would get there only after ~23 rounds
    assert next(i for i, k in enumerate(ks) if k >= 3) < 16


def test_shadows_are_rationed_when_drafting_is_expensive() -> None:
    costs = _costs(CPU_STAIRCASE)
    for _ in range(2):  # the first is taken for a cold decode and left out
        costs.observe_draft("slow", 1, 0.010)  # a third of a target token: shadow every ~12th plain round
        costs.observe_draft("free", 1, 0.0)
    policy = AutoK(costs)
    shadows = {"slow": 0, "free": 0}
    for _ in range(48):
        policy.rounds_at_zero += 1
        for source in shadows:
            shadows[source] += policy.wants_shadow(source)
    assert shadows["free"] == 48
    assert 2 <= shadows["slow"] <= 6


# -- drafters that report confidence: calibration and the per-position gate ----------------------------


def _gated(c_draft: float = 0.0017, costs: CostModel | None = None) -> AutoK:
    """auto over the CPU staircase (or `costs`) for a draft model whose tokens are accepted when it is
    confident (top probability above 0.9) and rejected when it is not."""
    costs = costs or _costs(CPU_STAIRCASE)
    for _ in range(2):  # the first is taken for a cold decode and left out
        costs.observe_draft("draft", 1, c_draft)
    policy = AutoK(costs, k_max=8, confident=["draft"])
    cal = policy.learned.calibration["draft"]
    for _ in range(30):
        cal.observe(0.99, 1.0)
        cal.observe(0.3, 0.0)
    return policy


def _run_gate(policy: AutoK, confidences: list[float], k: int = 8) -> int:
    gate = policy.gate("draft", k)
    n = 0
    while n < len(confidences) and gate(n, confidences[n]):
        n += 1
    return n


def test_calibration_starts_from_the_confidence_and_learns_the_pair() -> None:
    cal = Calibration()
    assert cal.acceptance(0.99) == pytest.approx(0.99)
    assert cal.acceptance(0.35) == pytest.approx(0.35)
    for _ in range(50):
        cal.observe(0.35, 1.0)  # this pair agrees even where the draft is unsure
    assert cal.acceptance(0.35) > 0.9
    assert cal.acceptance(0.99) == pytest.approx(0.99)


def test_gate_drafts_while_confident_and_stops_at_a_doubtful_position() -> None:
    policy = _gated()
    assert _run_gate(policy, [0.99] * 8) == 8
    assert _run_gate(policy, [0.99, 0.99, 0.99, 0.3, 0.99]) == 3
    assert _run_gate(policy, [0.3, 0.99]) == 0


def test_gate_weighs_each_position_against_the_verify_staircase() -> None:
    """On this CPU going from m = 1 to m = 2 costs 0.73 of a token. A position accepted 45 % of the
    time is not worth it, even with the run it might start; one accepted 85 % of the time is. When
    drafting a position costs as much as a target token, even a sure draft is not worth looking at."""
    assert _run_gate(_gated(), [0.45, 0.99]) == 0
    assert _run_gate(_gated(), [0.85, 0.3]) == 1
    for c_draft, k in ((0.0017, 8), (0.030, 0)):
        policy = _gated(c_draft=c_draft)
        for _ in range(5):
            policy.learned.calibration["draft"].observe_first(0.99)
        assert policy.choose_k("draft") == k


def test_a_drafter_that_looks_ahead_gets_the_best_prefix() -> None:
    """n-gram lookup knows every position's confidence before it drafts any: a doubtful position that
    sure ones follow (the turn of a repeated passage) is worth drafting through, though judged on its
    own, position by position, it is not; doubtful positions at the end are left out."""
    policy = _gated()
    cal = policy.learned.calibration["draft"]
    for _ in range(30):
        cal.observe(0.6, 0.5)  # this pair: accepted half the time at confidence 0.6
    gate = policy.gate("draft", 8)
    assert gate.best_prefix([0.99] * 8) == 8
    assert gate.best_prefix([0.6] + [0.99] * 7) == 8
    assert _run_gate(policy, [0.6] + [0.99] * 7) == 0
    assert gate.best_prefix([0.99] * 3 + [0.3] * 5) == 3
    assert gate.best_prefix([0.3] * 8) == 0
    assert gate.best_prefix([]) == 0
    assert policy.gate("draft", 8, shadow=True).best_prefix([0.99] * 8) == 0  # a shadow only looks


def test_auto_stops_looking_at_the_draft_when_it_is_never_confident_and_comes_back() -> None:
    policy = _gated(c_draft=0.004)
    for _ in range(20):  # the text is hard: the draft is unsure at every first position
        k = policy.choose_k("draft")
        if k:
            _run_gate(policy, [0.3], k)
    assert policy.choose_k("draft") == 0
    for _ in range(21, 40):  # now it is sure (seen in shadows)
        if policy.choose_k("draft") == 0 and policy.wants_shadow("draft"):
            assert not policy.gate("draft", 1, shadow=True)(0, 0.99)
    assert policy.choose_k("draft") == 8


def test_a_cold_first_draft_decode_is_not_taken_for_the_draft_cost() -> None:
    costs = CostModel()
    costs.observe_draft("draft", 1, 0.050)  # graph building
    assert costs.draft_seconds_per_token("draft") is None
    costs.observe_draft("draft", 2, 0.004)
    assert costs.draft_seconds_per_token("draft") == pytest.approx(0.002)


def test_a_cold_single_token_decode_does_not_make_plain_look_slow() -> None:
    """The first decode of a size builds llama.cpp's graph (on a tiny model 30x a warm one): it is not
    taken for the size's cost. A batch never costs less than a smaller one, so a larger batch measured
    cheaper caps T_v(1) (a burst of load): otherwise plain decoding would look slow, auto would draft
    on, and m = 1 would never be timed again."""
    costs = CostModel()
    costs.observe_verify(1, 0.009)  # graph building
    assert costs.verify_seconds(1) is None
    costs.observe_verify(1, 0.0004)
    assert costs.verify_seconds(1) == pytest.approx([0.0004])
    costs.observe_verify(1, 0.009)  # and a burst of load: the median of two
    for _ in range(4):
        costs.observe_verify(3, 0.0004)
    assert costs.verify_seconds(3) == pytest.approx([0.0004, 0.0004, 0.0004])


def test_batches_are_assumed_dear_on_a_cpu_until_one_is_measured() -> None:
    """With only T_v(1) measured, a CPU batch is assumed to cost half a token more per token (a GPU's
    nearly nothing): a draft at 0.6x the target is not worth trying there, a cheap sure one is."""
    cpu, gpu = CostModel.for_device(offloaded=False), CostModel.for_device(offloaded=True)
    for costs in (cpu, gpu):
        for _ in range(3):
            costs.observe_verify(1, 0.010)
    assert cpu.verify_seconds(3) == pytest.approx([0.010, 0.015, 0.020])
    assert gpu.verify_seconds(3) == pytest.approx([0.010, 0.0105, 0.011])
    for c_draft, worth_trying in ((0.006, False), (0.001, True)):
        only_one = CostModel.for_device(offloaded=False)
        for _ in range(3):
            only_one.observe_verify(1, 0.010)
        policy = _gated(c_draft=c_draft, costs=only_one)
        policy.learned.calibration["draft"].observe_first(0.99)
        assert (policy.choose_k("draft") > 0) == worth_trying


def test_no_shadows_when_even_a_sure_draft_could_not_pay() -> None:
    """Each shadow must catch the draft up on every plain token since the last one: with a draft as
    dear as the target that costs more than the speculation it could bring back, so auto stops. One
    shadow re-measures the draft in the generation that finds it hopeless, and then in one later
    generation out of 16; the others do not look at all (a shadow costs a target token there)."""
    policy = _gated(c_draft=0.030)
    policy.learned.calibration["draft"].observe_first(0.99)
    shadows = []
    for _ in range(1, 40):
        assert policy.choose_k("draft") == 0
        shadows.append(policy.wants_shadow("draft"))
    assert policy.hopeless and shadows[0] and not any(shadows[1:])
    shadowed_generations = []
    for generation in range(1, 33):
        later = AutoK(policy.costs, policy.learned, k_max=8, confident=["draft"])
        looks = []
        for _ in range(20):
            assert later.choose_k("draft") == 0
            looks.append(later.wants_shadow("draft"))
        assert sum(looks) <= 1
        if any(looks):
            shadowed_generations.append(generation)
    assert shadowed_generations == [16, 32]
    cheap = _gated(c_draft=0.004)
    cheap.learned.calibration["draft"].observe_first(0.3)
    assert cheap.choose_k("draft") == 0 and not cheap.hopeless


def test_probes_look_past_the_first_token() -> None:
    """A one-token probe tells nothing about a2: with a2 believed low, probes of one token (fully
    accepted) would repeat for a whole generation and a2 would never be corrected."""
    policy = AutoK(_costs(CPU_STAIRCASE), k_max=8, probe_every=2)
    policy.sources["ngram/3"] = _SourceEstimate([0.6, 1.0], [0.1, 10.0])  # a1 0.6, a2 0.01
    probes = [k for k in (policy.choose_k("ngram/3") for i in range(1, 12)) if k]
    assert probes and min(probes) >= 2


# -- bookkeeping: what one round teaches, the prior carried between generations, probe intervals -------


def test_partial_acceptance_counts_the_first_position_and_the_later_ones_apart() -> None:
    """A round of k drafts with n accepted examined position 1 (passed iff n >= 1), then n - 1 later
    positions that passed and, if n < k, the later one that failed. From the neutral prior (0.5 over
    two positions) with the round decay 0.9 the counts are exactly these."""
    cases = {  # (k, accepted): (first: accepted, examined), (later: accepted, examined)
        (4, 0): ((0, 1), (0, 0)),
        (4, 1): ((1, 1), (0, 1)),
        (4, 2): ((1, 1), (1, 2)),
        (4, 4): ((1, 1), (3, 3)),
        (1, 1): ((1, 1), (0, 0)),
    }
    for (k, accepted), (first, later) in cases.items():
        policy = AutoK(_costs(CPU_STAIRCASE), decay=0.9)
        policy.observe("ngram/3", k, accepted, 0.0, 0.06)
        est = policy.sources["ngram/3"]
        assert est.first == pytest.approx([0.9 * 1.0 + first[0], 0.9 * 2.0 + first[1]]), (k, accepted)
        assert est.later == pytest.approx([0.9 * 1.0 + later[0], 0.9 * 2.0 + later[1]]), (k, accepted)
        # The stats' alpha: accepted over every position examined.
        assert est.alpha == pytest.approx((est.first[0] + est.later[0]) / (est.first[1] + est.later[1]))
    plain = AutoK(_costs(CPU_STAIRCASE))
    plain.observe("ngram/3", 0, 0, 0.0, 0.03)  # a plain round teaches no acceptance
    assert "ngram/3" not in plain.sources


def test_a_rounds_confidences_calibrate_up_to_the_first_rejection() -> None:
    policy = AutoK(_costs(CPU_STAIRCASE), confident=["draft"])
    cal = policy.learned.calibration["draft"]
    before_seen, before_accepted = cal.seen.copy(), cal.accepted.copy()
    # Four drafts, two accepted: positions 0 and 1 passed, 2 failed, 3 was never examined.
    policy.observe("draft", 4, 2, 0.004, 0.06, confidence=[0.99, 0.85, 0.45, 0.15])
    changed = {Calibration.bin(c) for c in (0.99, 0.85, 0.45)}
    for b in range(len(cal.seen)):
        if b in changed:
            assert cal.seen[b] == pytest.approx(0.98 * before_seen[b] + 1.0)
        else:
            assert cal.seen[b] == before_seen[b]
    sure, doubtful = Calibration.bin(0.99), Calibration.bin(0.45)
    assert cal.accepted[sure] == pytest.approx(0.98 * before_accepted[sure] + 1.0)  # passed
    assert cal.accepted[doubtful] == pytest.approx(0.98 * before_accepted[doubtful])  # failed


def test_the_estimate_carries_to_the_next_generation_halfway_back_to_neutral() -> None:
    costs, learned = _costs(CPU_STAIRCASE), Learned()
    first = AutoK(costs, learned)
    for _ in range(30):
        first.observe("ngram/3", 4, 3, 0.0, 0.064)  # three of four: a1 high, a2 lower
    est = first.sources["ngram/3"]
    assert learned.acceptance["ngram/3"] == (est.a1, est.a2)
    assert est.a1 > 0.95 and 0.6 < est.a2 < 0.7
    second = AutoK(costs, learned)  # the next generation on the same models
    carried = second._estimate("ngram/3")
    assert carried.a1 == pytest.approx((est.a1 + 0.5) / 2)
    assert carried.a2 == pytest.approx((est.a2 + 0.5) / 2)
    assert carried.first[1] == carried.later[1] == 2.0  # weighted as two positions: soon outweighed
    fresh = AutoK(_costs(CPU_STAIRCASE))._estimate("ngram/3")
    assert (fresh.a1, fresh.a2) == (0.5, 0.5)
    # What the carried prior is for: the next generation drafts from its first round.
    assert second.choose_k("ngram/3") > 0 == AutoK(_costs(CPU_STAIRCASE)).choose_k("ngram/3")


def test_probe_interval_doubles_after_each_failed_probe_and_resets_after_a_full_one() -> None:
    policy = AutoK(_costs(CPU_STAIRCASE), probe_every=4)
    probes: list[int] = []
    for round_index in range(800):
        k = policy.choose_k("draft")
        if k:
            probes.append(round_index)
            assert k >= 2  # a probe looks past the first token
        policy.observe("draft", k, 0, 0.002 * k, CPU_STAIRCASE.get(k + 1, 0.1) / 1000)  # probes fail
    gaps = [b - a for a, b in zip(probes, probes[1:], strict=False)]
    assert probes[0] == 3  # the 4th round at k = 0
    assert gaps[:7] == [8, 16, 32, 64, 128, 256, 256]
    assert policy.probe_interval == 256

    def next_probe(p: AutoK) -> int:
        while True:
            k = p.choose_k("draft")
            if k:
                return k
            p.observe("draft", 0, 0, 0.0, CPU_STAIRCASE[1] / 1000)

    # A probe whose every draft is accepted may have found predictable text: probe again soon.
    k = next_probe(policy)
    policy.observe("draft", k, k, 0.002 * k, CPU_STAIRCASE[k + 1] / 1000)
    assert policy.probe_interval == policy.probe_every
    # One accepted of more is a failed probe: the interval doubles.
    partial = AutoK(_costs(CPU_STAIRCASE), probe_every=4)
    k = next_probe(partial)
    partial.observe("draft", k, 1, 0.002 * k, CPU_STAIRCASE[k + 1] / 1000)
    assert partial.probe_interval == 8


def test_acceptance_probability_is_the_rule_in_expectation() -> None:
    logits = np.array([2.0, 1.0, 0.5, -1.0, 0.0], dtype=np.float32)
    p = np.exp(logits - logits.max())
    p /= p.sum()
    sampled = SamplingParams(temperature=1.0)
    greedy = SamplingParams(temperature=0.0)
    # Greedy: accepted iff the proposal is the argmax (never a banned token).
    assert acceptance_probability(logits, 0, None, greedy) == 1.0
    assert acceptance_probability(logits, 1, None, greedy) == 0.0
    assert acceptance_probability(logits, 1, None, SamplingParams(temperature=0.0, banned=(0,))) == 1.0
    # A point mass (n-gram proposal): accepted with probability p(x).
    for token in range(5):
        assert acceptance_probability(logits, token, None, sampled) == pytest.approx(p[token], rel=1e-5)
    # A draft distribution q: the expected acceptance of x ~ q is sum_x q(x) min(1, p(x)/q(x)).
    q = np.array([0.1, 0.6, 0.1, 0.1, 0.1], dtype=np.float32)
    expected = float(sum(q[x] * min(1.0, p[x] / q[x]) for x in range(5)))
    assert acceptance_probability(logits, 3, q, sampled) == pytest.approx(expected, rel=1e-5)
    assert acceptance_probability(logits, 3, p.astype(np.float32), sampled) == pytest.approx(1.0, rel=1e-5)
    disjoint = np.array([0, 0, 0, 1.0, 0], dtype=np.float32)  # all of q on token 3
    assert acceptance_probability(logits, 3, disjoint, sampled) == pytest.approx(p[3], rel=1e-5)
    # The filters apply as in sampling: top-k 1 leaves only the argmax.
    top1 = SamplingParams(temperature=1.0, top_k=1)
    assert acceptance_probability(logits, 0, q, top1) == pytest.approx(0.1)
