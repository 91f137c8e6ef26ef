"""The draft-length policy's arithmetic: cost prediction, the gate, shadows, calibration (no model needed)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sampling_reference import acceptance_probability

from specli.costs import SETTLED_SAMPLES, CostModel
from specli.policy import (
    CARRIED_WEIGHT,
    HORIZON,
    QUIET_ROUNDS,
    RATE_DECAY,
    RATE_SETTLED,
    AutoK,
    Calibration,
    Decision,
    Learned,
    RoundReport,
    regime,
)
from specli.sampling import SamplingParams

# A 2-core CPU's verify staircase (ms, from `specli bench` on the demo target): m = 2 costs 1.7x m = 1,
# m = 3..6 little more, then another step.
CPU_STAIRCASE = {1: 30.8, 2: 53.3, 3: 61.8, 4: 64.3, 5: 70.8, 6: 72.3, 7: 90.7, 8: 100.1, 9: 102.1}


def _free_ngram(policy: AutoK, confidence: float = 0.5, accepted: int = 0) -> AutoK:
    """`policy` with an n-gram source whose draft step costs next to nothing (two measured: the first
    is left out as cold) and whose calibration has seen `accepted` positions accepted at `confidence`."""
    for _ in range(2):
        policy.costs.observe_draft("ngram", 1, 0.00001)
    cal = policy.learned.calibration.setdefault("ngram", Calibration())
    for _ in range(accepted):
        cal.observe(confidence, 1.0)
    return policy


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
    assert AutoK(costs).decide("draft", 8) == Decision(0, look=True)  # a plain round measures T_v(1)


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


def test_a_flat_step_of_the_staircase_does_not_make_larger_batches_free() -> None:
    """Two sizes measured at one cost (a stair) extrapolate flat past the largest measured size; a
    position there still costs the draft step that evaluates the next one, so a weak draft (accepted 4
    times in 5) stops where that step no longer pays instead of drafting to the limit (64 at once on a
    150k-vocabulary target at T 1: 440 ms for 1-5 accepted tokens)."""
    stair = _costs({1: 47.0, 2: 62.0, 3: 62.0, 4: 78.0})
    curve = stair.verify_seconds(65)
    assert curve is not None and curve[64] == pytest.approx(0.078)  # optimistic: larger ones get tried
    for _ in range(2):
        stair.observe_draft("draft", 1, 0.0025)
    policy = AutoK(stair)
    cal = policy.learned.calibration.setdefault("draft", Calibration())
    for _ in range(40):
        cal.observe(0.5, 0.8)
    assert _run_gate(policy, [0.5] * 64, 64) < 24


# T_v(m) in seconds at an empty cache, and each row's attention per cached token (a 630M Qwen2-shaped
# target on 2 cores: T_v(4) 60 ms after 16 tokens, 86 after 512, 164 after 2048; but T_v(64) 389 ms
# after 16 and 464 after 1024, another kernel).
SHORT = {1: 0.040, 2: 0.047, 4: 0.060, 8: 0.085}
ATTENTION = 13e-6


def test_a_decode_costs_more_with_every_cached_token_as_each_size_measured() -> None:
    costs = CostModel()
    for position in (16, 900, 128, 2048, 256, 512, 1024, 300, 40):
        for m, seconds in SHORT.items():
            costs.observe_verify(m, seconds + ATTENTION * m * position, position)
        costs.observe_verify(64, 0.389 + 0.075 * position / 1008, position)
    costs.observe_verify(2, 0.5, 700)  # a burst of load: the fit is a median
    assert costs.verify_seconds(64) is not None  # refits
    for m in SHORT:
        assert costs.slopes[m] == pytest.approx(ATTENTION * m, rel=0.02)
    for position in (0, 700, 2048):
        curve = costs.verify_seconds(64, position)
        assert curve is not None
        for m, seconds in SHORT.items():
            assert curve[m - 1] == pytest.approx(seconds + ATTENTION * m * position, rel=0.02)
        assert curve[63] == pytest.approx(0.389 + 0.075 * position / 1008, rel=0.02)


def test_samples_a_burst_of_load_slowed_are_left_out_even_when_they_are_most() -> None:
    """A size measured mostly while something else ran (2.5 times its quiet cost) is priced by its quiet
    samples, in the process that measured it and in the next one that restores them: priced at the
    burst, auto stopped verifying the size, and nothing ever replaced those samples."""
    costs, quiet = CostModel(), {1: 0.047, 2: 0.056, 3: 0.066, 4: 0.073}
    for position in (100, 700, 800, 900, 1000):  # (the first of each size is left out as cold)
        for m, seconds in quiet.items():
            costs.observe_verify(m, seconds + ATTENTION * m * position, position)
    for position in range(200, 700, 100):  # five samples of sizes 3 and 4 while a build ran
        for m in (3, 4):
            costs.observe_verify(m, 2.5 * (quiet[m] + ATTENTION * m * position), position)
    later = CostModel()
    later.restore(json.loads(json.dumps(costs.to_record())))
    for model, samples in ((costs, costs.verify), (later, later.carried)):
        curve = model.verify_seconds(4, 500)
        assert curve is not None
        for m in (3, 4):
            assert len(samples[m]) == 9
            assert curve[m - 1] == pytest.approx(quiet[m] + ATTENTION * m * 500, rel=0.02)


def test_a_size_measured_at_one_length_is_brought_to_another_as_its_neighbours_say() -> None:
    """Sizes measured on a short prompt are priced for a long one, so auto's choice of k compares like
    with like (it switched from 3 to 1 and back when T_v(2) was a short prompt's, T_v(4) a long one's)."""
    costs = CostModel()
    for position in (10, 400, 800, 1200, 1600, 2000):
        for m in (1, 8):
            costs.observe_verify(m, SHORT[m] + ATTENTION * m * position, position)
    for _ in range(3):
        costs.observe_verify(2, SHORT[2] + ATTENTION * 2 * 100, 100)
        costs.observe_verify(4, SHORT[4] + ATTENTION * 4 * 1000, 1000)
    curve = costs.verify_seconds(8, 1000)
    assert curve is not None
    assert curve[1] == pytest.approx(SHORT[2] + ATTENTION * 2 * 1000, rel=0.02)
    assert curve[3] == pytest.approx(SHORT[4] + ATTENTION * 4 * 1000, rel=0.02)


def test_sizes_each_measured_at_one_length_are_taken_as_measured() -> None:
    """Only the spread of one size's samples says what a cached token costs: two sizes measured at
    different lengths could as well differ by their batch."""
    costs = CostModel()
    for _ in range(4):
        costs.observe_verify(1, 0.040, 100)
        costs.observe_verify(4, 0.090, 1000)
    assert costs.verify_seconds(4) is not None and costs.slopes == {}
    assert costs.verify_seconds(4, 1000) == pytest.approx(costs.verify_seconds(4, 0))


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


# -- calibration and the gate -----------------------------------------------------------------------------


def _gated(c_draft: float = 0.0017, costs: CostModel | None = None) -> AutoK:
    """auto over the CPU staircase (or `costs`) for a draft model whose tokens are accepted when it is
    confident (top probability above 0.9) and rejected when it is not."""
    costs = costs or _costs(CPU_STAIRCASE)
    for _ in range(1 + SETTLED_SAMPLES):  # the first is taken for a cold decode and left out
        costs.observe_draft("draft", 1, c_draft)
    policy = AutoK(costs)
    cal = policy.learned.calibration.setdefault("draft", Calibration())
    for _ in range(30):
        cal.observe(0.99, 1.0)
        cal.observe(0.3, 0.0)
    return policy


def _k(policy: AutoK, source: str = "draft", limit: int = 8) -> int:
    return policy.decide(source, limit).k


def _run_gate(policy: AutoK, confidences: list[float], k: int = 8) -> int:
    gate = policy.gate("draft", Decision(k))
    n = 0  # as a drafter asks it: a step to see each position after the first, then the position
    while n < len(confidences) and (n == 0 or gate.look(n)) and gate(n, confidences[n]):
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
    assert cal.acceptance(0.15) == pytest.approx(0.15)  # what a surer bin learned says nothing of it


def test_a_surer_bin_starts_from_what_a_less_sure_one_learned_until_its_own_rounds_say_otherwise() -> None:
    cal, model = Calibration(borrow=True), Calibration()
    for _ in range(50):
        cal.observe(0.55, 1.0)  # n-gram lookup's copies of one earlier sighting: all accepted
        model.observe(0.55, 1.0)
    assert cal.acceptance(0.65) > 0.95  # two sightings of a copy after a fork: not the prior's 0.65
    assert model.acceptance(0.65) == pytest.approx(0.65)  # a draft model's bins learn on their own
    assert AutoK(text_sources=frozenset({"ngram"}))._calibration("ngram").borrow
    cal.observe(0.65, 0.0)
    cal.observe(0.65, 0.0)
    assert cal.acceptance(0.65) < 0.4  # its own failures outweigh the borrowed prior


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
        assert _k(policy) == k


def test_the_gate_pays_a_draft_step_only_where_what_it_may_find_could_pay() -> None:
    """Learning a position's confidence costs a draft step. After a sure position the gate takes it
    while sure positions are taken to come in runs; when this draft's sure positions turn out to be
    followed by unsure ones (accepted never), it stops before the step. Nothing past k is looked at."""
    policy = _gated()
    gate = policy.gate("draft", Decision(8))
    assert gate(0, 0.99) and gate.look(1)
    assert not policy.gate("draft", Decision(1)).look(1)
    for _ in range(100):  # rounds of one sure draft, then an unsure position the gate held
        policy.observe(RoundReport("draft", 1, 1, 0.004, 0.0533, 1, confidence=[0.99],
                                   first_confidence=0.99, held=(0.3, 0.0)))
    cal = policy.learned.calibration["draft"]
    assert cal.next_bins()[cal.bin(0.99), cal.bin(0.3)] > 0.99
    gate = policy.gate("draft", Decision(8))
    assert gate(0, 0.99) and not gate.look(1)


def test_a_drafter_that_looks_ahead_gets_the_best_prefix() -> None:
    """n-gram lookup knows every position's confidence before it drafts any: a doubtful position that
    sure ones follow (the turn of a repeated passage) is worth drafting through, though judged on its
    own, position by position, it is not; doubtful positions at the end are left out."""
    policy = _gated()
    cal = policy.learned.calibration["draft"]
    for _ in range(30):
        cal.observe(0.6, 0.5)  # this pair: accepted half the time at confidence 0.6
    gate = policy.gate("draft", Decision(8))
    assert gate.best_prefix([0.99] * 8) == 8
    assert gate.best_prefix([0.6] + [0.99] * 7) == 8
    assert _run_gate(policy, [0.6] + [0.99] * 7) == 0
    assert gate.best_prefix([0.99] * 3 + [0.3] * 5) == 3
    assert gate.best_prefix([0.3] * 8) == 0
    assert gate.best_prefix([]) == 0
    assert policy.gate("draft", Decision(0, look=True)).best_prefix([0.99] * 8) == 0  # a shadow looks only


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
        assert (_k(policy) > 0) == worth_trying


def test_auto_stops_looking_at_the_draft_when_it_is_never_confident_and_comes_back() -> None:
    """A round's first confidence, drafted or held by the gate, feeds the first-position histogram; when
    it says a draft step does not pay, rounds are plain, and a sure shadow brings drafting back."""
    policy = _gated(c_draft=0.004)
    for _ in range(20):  # the text is hard: the draft is unsure at every first position
        decision = policy.decide("draft", 8)
        if decision.k or decision.look:
            held = _run_gate(policy, [0.3], decision.k) == 0
            policy.observe(RoundReport("draft", 0, 0, 0.004, 0.0308, 1, first_confidence=0.3,
                                       held=(0.3, 0.0) if held else None))
    assert _k(policy) == 0
    looked = 0
    for _ in range(21, 40):  # now it is sure (seen in shadows)
        decision = policy.decide("draft", 8)
        if decision.k:
            break
        if decision.look:
            looked += 1
            assert not policy.gate("draft", decision)(0, 0.99)  # a shadow holds position 0
            policy.observe(RoundReport("draft", 0, 0, 0.004, 0.0308, 1, first_confidence=0.99,
                                       held=(0.99, 1.0)))
        else:
            policy.observe(RoundReport(None, 0, 0, 0.0, 0.0308, 0))
    assert looked >= 1 and _k(policy) == 8


def test_no_shadows_when_even_a_sure_draft_could_not_pay() -> None:
    """Each shadow must catch the draft up on every plain token since the last one: with a draft as
    dear as the target that costs more than the speculation it could bring back, so auto stops. One
    shadow re-measures the draft in the generation that finds it hopeless, and then in one later
    generation out of 16; the others do not look at all (a shadow costs a target token there)."""
    policy = _gated(c_draft=0.030)
    policy.learned.calibration["draft"].observe_first(0.99)
    shadows = []
    for _ in range(1, 40):
        decision = policy.decide("draft", 8)
        assert decision.k == 0
        shadows.append(decision.look)
        policy.observe(RoundReport(None, 0, 0, 0.0, 0.0308, 0))
    assert policy.hopeless and shadows[0] and not any(shadows[1:])
    shadowed_generations = []
    for generation in range(1, 33):
        later = AutoK(policy.costs, policy.learned)
        looks = []
        for _ in range(20):
            decision = later.decide("draft", 8)
            assert decision.k == 0
            looks.append(decision.look)
        assert sum(looks) <= 1
        if any(looks):
            shadowed_generations.append(generation)
    assert shadowed_generations == [16, 32]
    cheap = _gated(c_draft=0.004)
    cheap.learned.calibration["draft"].observe_first(0.3)
    assert _k(cheap) == 0 and not cheap.hopeless


# An H100's verify curve for a 630M target with a 152k vocabulary (ms, `specli bench`): nearly flat.
H100_CURVE = {1: 1.49, 2: 1.58, 3: 1.65, 4: 1.75, 5: 1.87, 6: 1.94, 7: 2.05, 8: 2.03, 9: 3.54}


def test_a_few_cold_draft_steps_do_not_make_a_cheap_draft_look_hopeless() -> None:
    """A cold step (on a GPU, a new shape's CUDA graph built: several ms against a warm 0.33) is not the
    draft's cost: that is the median of this process's steps, and no verdict that stops the looks is
    reached before SETTLED_SAMPLES of them. A 39M draft of a 630M target, both on an H100, was found
    hopeless that way and auto decoded plain for the rest of the process."""
    costs = _costs(H100_CURVE)
    policy = AutoK(costs)
    cal = policy.learned.calibration.setdefault("draft", Calibration())
    for _ in range(5):
        cal.observe(0.2, 1.0)  # an underconfident draft: accepted where it says 0.2
        cal.observe_first(0.2)
    looks = 0
    for step in (0.008, 0.006, 0.00033, 0.00033, 0.00033):  # the first left out; two more cold
        decision = policy.decide("draft", 8)
        if decision.k:
            break
        assert decision.look and not policy.hopeless  # each plain round looks, which times a step
        looks += 1
        policy.observe(RoundReport("draft", 0, 0, step, 0.0015, 1, first_confidence=0.2, held=(0.2, 1.0)))
    assert costs.draft_seconds_per_token("draft") == pytest.approx(0.00033)
    assert looks >= 3 and _k(policy) == 8 and not policy.hopeless
    # A draft truly as dear as the target is still found hopeless, once its steps are settled.
    dear = AutoK(_costs(H100_CURVE))
    dear.learned.calibration["draft"] = cal
    for _ in range(1 + SETTLED_SAMPLES):
        dear.costs.observe_draft("draft", 1, 0.0015)
    assert _k(dear) == 0 and dear.hopeless


def test_the_draft_cost_kept_for_the_next_process_is_the_median_of_this_ones() -> None:
    costs = CostModel()
    for seconds in (0.050, 0.020, 0.0003, 0.0003, 0.0003):  # cold, one more cold, then warm steps
        costs.observe_draft("draft", 1, seconds)
    assert costs.draft_seconds_per_token("draft") == pytest.approx(0.0003)
    later = CostModel()
    later.restore(json.loads(json.dumps(costs.to_record())))
    assert later.draft_seconds_per_token("draft") == pytest.approx(0.0003)
    assert not later.draft_settled("draft")  # a restored cost prices drafts, but stops nothing alone
    later.observe_draft("draft", 1, 0.050)  # this process's first step: cold, left out
    later.observe_draft("draft", 1, 0.0009)  # a warm one three times the record: not confirmed
    assert not later.draft_settled("draft")
    confirmed = CostModel()
    confirmed.restore(json.loads(json.dumps(costs.to_record())))
    confirmed.observe_draft("draft", 1, 0.050)
    confirmed.observe_draft("draft", 1, 0.0004)  # within CONFIRMS of the record: it holds here now
    assert confirmed.draft_settled("draft")


def _lately_unsure(policy: AutoK, source: str) -> None:
    """`source` right where it is sure (0.99) and wrong where it is not (0.3), and lately unsure at the
    first position: drafting does not pay now, and a shadow may show when it would again."""
    cal = policy.learned.calibration.setdefault(source, Calibration())
    for _ in range(30):
        cal.observe(0.99, 1.0)
        cal.observe(0.3, 0.0)
        cal.observe_first(0.3)


def _declined_rounds(policy: AutoK, source: str, rounds: int, c_look: float, *, limit: int = 8,
                     total: int | None = None) -> list[int]:
    """`rounds` plain rounds of a text `source` stays unsure on, each look timed at `c_look` seconds
    (`total`: the generation's tokens, so `left` counts down to its end); the rounds that looked."""
    looks = []
    for i in range(rounds):
        decision = policy.decide(source, limit, left=None if total is None else total - i)
        assert decision.k == 0
        if decision.look:
            looks.append(i)
            policy.observe(RoundReport(source, 0, 0, c_look, 0.0308, 1, first_confidence=0.3,
                                       held=(0.3, 0.0)))
        else:
            policy.observe(RoundReport(None, 0, 0, 0.0, 0.0308, 0))
    return looks


def test_shadows_are_rationed_when_drafting_is_expensive() -> None:
    """While plain rounds are right, a source that costs a third of a target token per draft step looks
    every ~33rd round (~1 % of plain decoding's time); a free one is never plain: the gate judges it
    every round."""
    costs = _costs(CPU_STAIRCASE)
    for _ in range(1 + SETTLED_SAMPLES):  # the first is taken for a cold decode and left out
        costs.observe_draft("slow", 1, 0.010)
        costs.observe_draft("free", 1, 0.0001)
    looks, drafted = {}, {}
    for source in ("slow", "free"):
        policy = AutoK(costs)
        _lately_unsure(policy, source)
        looks[source] = drafted[source] = 0
        for _ in range(100):
            decision = policy.decide(source, 8)
            looks[source] += decision.look
            drafted[source] += decision.k > 0
            if decision.look:
                policy.observe(RoundReport(source, 0, 0, 0.010, 0.0308, 1, first_confidence=0.3,
                                           held=(0.3, 0.0)))
            else:
                policy.observe(RoundReport(None, 0, 0, 0.0, 0.0308, 0))
    assert 2 <= looks["slow"] <= 4 and drafted["slow"] == 0, looks
    assert drafted["free"] == 100


def test_no_shadow_watches_fewer_tokens_than_its_gap() -> None:
    """A shadow is bought for the gap's tokens (SHADOW_SHARE of their time): with fewer left before the
    output ends (the generation's max_tokens) and no round of the generation drafted, none is due; with
    as many or more, or where drafting came back earlier (a shadow may bring it back again), they come
    as before. (A random DFlash head of the 152k bench target shadowed at round 217-244 of a 256-token
    generation, ~1 % of it, for the 12-39 tokens left.)"""
    costs = _costs(CPU_STAIRCASE)
    for _ in range(1 + SETTLED_SAMPLES):
        costs.observe_draft("slow", 1, 0.010)  # a third of a target token: a shadow every ~33 rounds

    def looks_at(total: int | None, drafted_before: bool = False) -> list[int]:
        policy = AutoK(costs)
        policy.tally["drafted"] = int(drafted_before)
        _lately_unsure(policy, "slow")
        return _declined_rounds(policy, "slow", 100, 0.010, total=total)

    unbounded = looks_at(None)
    gap = unbounded[-1] - unbounded[-2]
    assert 25 <= gap <= 40 and len(unbounded) >= 3, unbounded
    ending = looks_at(100)
    assert ending == [i for i in unbounded if 100 - i >= gap], (ending, unbounded)
    assert ending != unbounded  # the last one was left out
    assert looks_at(1000) == unbounded
    assert looks_at(100, drafted_before=True) == unbounded


def test_a_declined_verdict_is_priced_again_less_often_as_plain_rounds_go_on() -> None:
    """Pricing a round takes ~250 us right after a decode here: a declined verdict holds QUIET_ROUNDS
    plain rounds while the rounds that drafted still weigh in the reference rate, then as many as have
    been plain since (RATE_SETTLED on), at most to the next shadow; from then on it holds unpriced while
    nothing it rested on changes, and the round after a shadow that showed a position prices it again
    (the same shadows as when the shadow's round and the one before it were priced too). Near the
    output's end, where the tokens left are priced as such (END_SHARE), every QUIET_ROUNDS again."""
    costs = _costs(CPU_STAIRCASE)
    for _ in range(1 + SETTLED_SAMPLES):
        costs.observe_draft("slow", 1, 0.020)  # two thirds of a target token: a shadow every ~65 rounds

    def priced_and_looks(total: int | None) -> tuple[list[int], list[int]]:
        policy = AutoK(costs)
        _lately_unsure(policy, "slow")
        priced, inputs = [], policy.inputs

        def counted(source: str):
            priced.append(sum(policy.tally.values()))  # the round: each observed one is tallied once
            return inputs(source)

        policy.inputs = counted
        return priced, _declined_rounds(policy, "slow", 300, 0.020, total=total)

    priced, looks = priced_and_looks(None)
    assert RATE_DECAY ** RATE_SETTLED < 0.05 <= RATE_DECAY ** (RATE_SETTLED - 1)  # 29
    assert priced[:6] == [0, 8, 16, 24, 32, 66] and looks[:3] == [65, 130, 195], (priced, looks)
    assert len(priced) <= 2 * len(looks) + 6, (priced, looks)  # a shadow and the round after it
    priced, looks = priced_and_looks(300)
    end = [p for p in priced if p >= 300 - HORIZON]
    assert len(end) >= 3 and all(b - a == QUIET_ROUNDS for a, b in zip(end, end[1:], strict=False)), priced


def test_a_look_is_priced_with_the_catch_up_it_costs() -> None:
    """A shadow's look costs more than a draft step: the draft first catches up on the plain tokens
    since the last look, its weights read back after the target's evicted them (a weak draft of a
    150k-vocabulary target at T 1: ~20 % of a target token per look, where a step is ~3 %). Looks are
    rationed by what they were measured to cost, so shadows stay ~1 % of plain decoding's time."""
    costs = _costs(CPU_STAIRCASE)
    for _ in range(1 + SETTLED_SAMPLES):
        costs.observe_draft("draft", 1, 0.001)  # a draft step: 3 % of a target token
    policy = AutoK(costs)
    _lately_unsure(policy, "draft")
    looks = 0
    for _ in range(96):
        decision = policy.decide("draft", 8)
        assert decision.k == 0
        if decision.look:
            looks += 1
            policy.observe(RoundReport("draft", 0, 0, 0.001, 0.0308, 0, first_confidence=0.3,
                                       held=(0.3, 0.0), catch_up_seconds=0.005))
        else:
            policy.observe(RoundReport(None, 0, 0, 0.0, 0.0308, 0))
    assert 3 <= looks <= 6, looks  # every ~20th round; priced by the step alone, every ~4th


def _watch(policy: AutoK, rounds: int, per_position: float, fixed: float = 0.004) -> list[bool]:
    """`rounds` rounds of a text the draft never knows (unsure at every first position), each look
    catching the draft up on the tokens since the last one at `per_position` seconds each (and `fixed`
    seconds, a decode's own cost, once); whether each round looked."""
    looks, since = [], 0
    for _ in range(rounds):
        decision = policy.decide("draft", 8)
        assert decision.k == 0
        looks.append(decision.look)
        since += 1
        if decision.look:
            policy.observe(RoundReport("draft", 0, 0, 0.004, 0.0308, 1, first_confidence=0.3,
                                       held=(0.3, 0.0), catch_up_seconds=fixed + per_position * since))
            since = 0
        else:
            policy.observe(RoundReport(None, 0, 0, 0.0, 0.0308, 0))
    return looks


def test_a_source_whose_catch_up_alone_costs_more_than_shadows_may_rests() -> None:
    """A trained head catches up on every committed position before it looks (on this CPU a random
    EAGLE-3 head: ~0.6 ms a position against a 10 ms target token): spaced however far apart, looks
    cost that share of plain decoding. Once it is measured, a declined source rests: no shadow for the
    rest of the generation, and in later generations only one in 16 wakes it. A draft whose catch-up
    is cheap (a draft model's batch) keeps its shadows."""
    dear = _gated(c_draft=0.004)
    for _ in range(30):
        dear.learned.calibration["draft"].observe_first(0.3)
    looks = _watch(dear, 300, per_position=0.0025)  # 8 % of a 30.8 ms target token
    assert dear.resting() == {"draft"} and 2 <= sum(looks) <= 6, sum(looks)
    assert dear.holdback().text.endswith("watching it would cost 8 % of a token (its catch-up), so it rests")
    last_look = max(i for i, look in enumerate(looks) if look)
    assert last_look <= 160 and dear.learned.resting == {"draft": 0}
    woken = []
    for generation in range(1, 33):
        later = AutoK(dear.costs, dear.learned)
        if not later.resting():
            woken.append(generation)
            assert any(_watch(later, 20, per_position=0.0025))  # it looks, then rests again
            assert later.resting() == {"draft"}
        else:
            assert not any(_watch(later, 20, per_position=0.0025))
    assert woken == [16, 32]
    # The catch-up's cost per position (less a draft step) is what the next process starts from.
    restored = CostModel()
    restored.restore(json.loads(json.dumps(dear.costs.to_record())))
    assert restored.catch_up_seconds_per_position("draft") == pytest.approx(0.0025)
    cheap = _gated(c_draft=0.004)
    for _ in range(30):
        cheap.learned.calibration["draft"].observe_first(0.3)
    looks = _watch(cheap, 300, per_position=0.0003)  # 1 % of a target token
    assert not cheap.resting() and sum(looks[100:]) >= 2


def test_a_catch_up_timed_at_load_rests_a_dear_source_before_any_shadow() -> None:
    """A trained head's drafter times a catch-up at load (Drafter.catch_up_costs): a declined source
    whose catch-up is dear rests at its first verdict, before a shadow has caught it up on the plain
    tokens since the last look (a random EAGLE-3 head's first generation here paid two such catch-ups,
    ~2 % of it, when only a shadow's priced them and the first counted as cold). A cheap timed catch-up
    keeps the shadows."""
    dear, cheap = _gated(c_draft=0.004), _gated(c_draft=0.004)
    dear.costs.timed_catch_up("draft", 16, 16 * 0.0025)  # 8 % of a 30.8 ms target token a position
    cheap.costs.timed_catch_up("draft", 16, 16 * 0.0003)
    for policy in (dear, cheap):
        for _ in range(30):
            policy.learned.calibration["draft"].observe_first(0.3)
    looks = _watch(dear, 300, per_position=0.0025)
    assert dear.resting() == {"draft"} and not any(looks)  # its steps timed already: not one shadow
    assert dear.costs.catch_up_seconds_per_position("draft") == pytest.approx(0.0025)
    untimed = _gated(c_draft=0.004)  # priced from shadows alone: two catch-ups, the first cold
    for _ in range(30):
        untimed.learned.calibration["draft"].observe_first(0.3)
    untimed_looks = _watch(untimed, 300, per_position=0.0025)
    assert untimed.resting() == {"draft"} and sum(untimed_looks) == 2, sum(untimed_looks)
    assert not cheap.resting() and sum(_watch(cheap, 300, per_position=0.0003)[100:]) >= 2


def _state(policy: AutoK) -> tuple:
    return (dict(policy.tally), dict(policy.asked), policy.emitted, policy.plain_rounds, tuple(policy.rate),
            dict(policy._unread), policy._since_recheck, {m: list(w) for m, w in policy.costs.verify.items()},
            policy.resting(), policy.hopeless)


class _Uncached(dict):
    """A `_look_price` that keeps nothing: every recheck priced from the costs afresh."""

    def __setitem__(self, key, value) -> None:
        pass


@pytest.mark.parametrize(("c_draft", "per_position"), [(0.004, 0.0025), (0.004, 0.0001), (0.03, 0.0001)],
                         ids=["rests", "shadows", "hopeless-rechecks"])
def test_a_plain_rounds_lean_report_teaches_what_its_report_did(c_draft: float, per_position: float) -> None:
    """A round that asked the drafter nothing is reported without a RoundReport (`observe_plain`; a
    rested one without `decide` either): the policy ends in the state the full report left it in,
    round after round, through a rest, declined shadows and hopeless rechecks; and the recheck's
    price, kept between looks, decides as one priced afresh every round."""
    full, lean, uncached = (_gated(c_draft=c_draft) for _ in range(3))
    uncached._look_price = _Uncached()
    for policy in (full, lean, uncached):
        policy.costs.timed_catch_up("draft", 16, 16 * per_position)
        for _ in range(30):
            policy.learned.calibration["draft"].observe_first(0.3)
    since, looks = 0, 0
    for i in range(400):
        rested = lean.resting() == {"draft"}
        position, verify = 100 + i, 0.0308 + 1e-5 * (i % 7)
        decision = full.decide("draft", 8, position=position)
        assert uncached.decide("draft", 8, position=position) == decision, i
        if not rested:
            assert lean.decide("draft", 8, position=position) == decision, i
        since += 1
        if decision.k or decision.look:
            assert not rested
            looks += 1  # each look costs another amount: a price kept past it would be stale
            report = RoundReport("draft", 0, 0, c_draft * (1 + looks % 3), verify, 1, first_confidence=0.3,
                                 held=(0.3, 0.0), catch_up_seconds=per_position * since, position=position)
            for policy in (full, lean, uncached):
                policy.observe(report)
            since = 0
        else:
            for policy in (full, uncached):
                policy.observe(RoundReport(None, 0, 0, 2e-6, verify, 0, position=position))
            lean.observe_plain("draft", 2e-6, verify, position, None, rested)
        assert _state(full) == _state(lean), i
    assert full.holdback() == lean.holdback() and full.holdback() is not None
    assert (full.resting() == {"draft"}) == (per_position > 0.001) and looks >= (per_position < 0.001)


def test_a_source_whose_features_make_watching_dear_rests() -> None:
    """Watching a trained head also costs what its features add to every plain token (the target hands
    out its layer inputs at each decode; its drafter times them at load, Drafter.watch_costs): a
    declined head whose catch-up is cheap (1 % of a target token a position) but whose features add
    1.5 % rests, and its holdback says why; the same head without that figure keeps its shadows."""
    policies = []
    for features in (0.00045, None):
        policy = _gated(c_draft=0.004)
        if features is not None:
            policy.costs.observe_watch("draft", features)
        for _ in range(30):
            policy.learned.calibration["draft"].observe_first(0.3)
        policies.append((policy, _watch(policy, 300, per_position=0.0003)))
    (taxed, looks), (untaxed, untaxed_looks) = policies
    assert taxed.resting() == {"draft"} and sum(looks) <= 6, sum(looks)
    assert taxed.holdback().text.endswith(
        "watching it would cost 2 % of a token (its catch-up and its features), so it rests")
    assert not untaxed.resting() and sum(untaxed_looks[100:]) >= 2


def test_each_source_keeps_its_own_calibration() -> None:
    policy = AutoK(_costs(CPU_STAIRCASE))
    for _ in range(40):
        policy.observe(RoundReport("ngram", 4, 4, 0.0, 0.064, 4, confidence=[0.5] * 4, first_confidence=0.5))
        policy.observe(RoundReport("draft", 4, 0, 0.0, 0.064, 4, confidence=[0.5] * 4, first_confidence=0.5))
    assert policy.learned.calibration["ngram"].acceptance(0.5) > 0.9
    assert policy.learned.calibration["draft"].acceptance(0.5) < 0.1


def test_a_sure_source_drafts_as_far_as_the_limit() -> None:
    """No ceiling below the drafter's own limit: where a long verify batch costs far less than several
    short ones (a CPU that batches well, a GPU), a sure proposal of 64 positions is drafted whole; the
    round's limit (the context, max tokens, a recurrent target's rollback) caps it."""
    flat = {m: 30.0 + 0.5 * (m - 1) for m in (1, 2, 3, 5, 9, 17, 33, 65)}
    policy = _free_ngram(AutoK(_costs(flat)), 0.99, 50)
    assert policy.decide("ngram", 64) == Decision(64)
    assert policy.gate("ngram", Decision(64)).best_prefix([0.99] * 64) == 64
    assert policy.decide("ngram", 16) == Decision(16)  # e.g. a hybrid target's rollback bound
    # On the steep CPU staircase the same sure source still drafts past the old ceiling of 12.
    steep = _free_ngram(AutoK(_costs(CPU_STAIRCASE), policy.learned))
    assert steep.gate("ngram", Decision(64)).best_prefix([0.99] * 64) > 12


def test_a_rounds_confidences_calibrate_up_to_the_first_rejection() -> None:
    policy = AutoK(_costs(CPU_STAIRCASE))
    cal = policy.learned.calibration.setdefault("draft", Calibration())
    before_seen, before_accepted = cal.seen.copy(), cal.accepted.copy()
    # Four drafts, two accepted: positions 0 and 1 passed, 2 failed, 3 was never examined.
    policy.observe(RoundReport("draft", 4, 2, 0.004, 0.06, 4, confidence=[0.99, 0.85, 0.45, 0.15],
                               first_confidence=0.99))
    changed = {Calibration.bin(c) for c in (0.99, 0.85, 0.45)}
    for b in range(len(cal.seen)):
        if b in changed:
            assert cal.seen[b] == pytest.approx(0.98 * before_seen[b] + 1.0)
        else:
            assert cal.seen[b] == before_seen[b]
    sure, doubtful = Calibration.bin(0.99), Calibration.bin(0.45)
    assert cal.accepted[sure] == pytest.approx(0.98 * before_accepted[sure] + 1.0)  # passed
    assert cal.accepted[doubtful] == pytest.approx(0.98 * before_accepted[doubtful])  # failed
    assert cal.first[sure] == 1.0  # the round's first confidence, for the first-position histogram


def test_a_held_position_scored_by_the_target_calibrates_too() -> None:
    policy = AutoK(_costs(CPU_STAIRCASE))
    policy.observe(RoundReport("draft", 0, 0, 0.002, 0.03, 1, first_confidence=0.45, held=(0.45, 1.0)))
    cal = policy.learned.calibration["draft"]
    b = Calibration.bin(0.45)
    assert cal.seen[b] == pytest.approx(0.98 + 1.0) and cal.first[b] == 1.0
    assert cal.acceptance(0.45) > 0.7


def test_the_calibration_carries_to_the_next_generation() -> None:
    costs, learned = _costs(CPU_STAIRCASE), Learned()
    first = AutoK(costs, learned)
    for _ in range(30):
        first.observe(RoundReport("draft", 4, 4, 0.008, 0.064, 4, confidence=[0.45] * 4,
                                  first_confidence=0.45))
    second = AutoK(costs, learned)  # the next generation on the same models
    assert second.learned.calibration["draft"].acceptance(0.45) > 0.9
    assert "draft" not in AutoK(costs).learned.calibration


def test_each_sampling_regime_keeps_its_own_calibration_and_a_record_restores_it() -> None:
    costs, learned = _costs(CPU_STAIRCASE), Learned()
    hot, cold = regime(SamplingParams(temperature=1.0), True), regime(SamplingParams(temperature=0.0), True)
    assert hot != regime(SamplingParams(temperature=1.0), False) and cold == "greedy"
    learned.enter(hot)
    policy = AutoK(costs, learned, text_sources=frozenset({"ngram"}))
    for source in ("draft", "ngram"):
        for _ in range(30):
            policy.observe(RoundReport(source, 4, 4, 0.008, 0.064, 4, confidence=[0.45] * 4,
                                       first_confidence=0.45))
    learned.enter(cold)  # greedy acceptance is another matter: learned from nothing
    assert AutoK(costs, learned).learned.calibration == {}
    learned.enter(hot)
    assert learned.calibration["draft"].acceptance(0.45) > 0.9

    record = json.loads(json.dumps(learned.to_record()))
    assert set(record) == {hot} and set(record[hot]) == {"draft"}  # not n-gram's: that is the text's
    later = Learned()
    later.restore(record)
    later.enter(hot)
    restored = later.calibration["draft"]
    assert restored.to_record() == learned.calibration["draft"].to_record()
    assert AutoK(costs, later).learned.calibration["draft"].acceptance(0.45) > 0.9
    older = {key: value for key, value in record[hot]["draft"].items() if key != "after"}
    assert Calibration.from_record(older).to_record()["after"] == Calibration().to_record()["after"]
    for bad in ({hot: {"draft": {**record[hot]["draft"], "seen": [0.0] * 12}}},
                {hot: {"draft": {**record[hot]["draft"], "accepted": [0.5] * 3}}},
                {hot: {"draft": {"accepted": []}}}, {hot: []},
                {hot: {"draft": {**record[hot]["draft"], "after": [-1.0] * 144}}},
                {hot: {"draft": {**record[hot]["draft"], "after": [1.0] * 12}}}):
        with pytest.raises((ValueError, KeyError, AttributeError, TypeError)):
            Learned().restore(bad)


def test_what_the_text_taught_starts_the_next_generation_as_a_light_prior() -> None:
    costs, learned = _costs(CPU_STAIRCASE), Learned()
    first = AutoK(costs, learned, text_sources=frozenset({"ngram"}))
    for source in ("ngram", "draft"):
        for _ in range(60):  # a copy-edit's copies, all accepted
            first.observe(RoundReport(source, 4, 4, 0.0, 0.064, 4, confidence=[0.55] * 4,
                                      first_confidence=0.55))
    deep = learned.calibration["draft"].seen.max()
    AutoK(costs, learned, text_sources=frozenset({"ngram"}))  # the next prompt
    ngram, draft = learned.calibration["ngram"], learned.calibration["draft"]
    assert ngram.acceptance(0.55) > 0.99 and ngram.seen.max() == pytest.approx(CARRIED_WEIGHT)
    assert draft.seen.max() == pytest.approx(deep)  # a model's confidence describes the models: kept whole
    for _ in range(3):  # code whose recurring lines go on otherwise
        ngram.observe(0.55, 0.0)
    assert ngram.acceptance(0.55) < 0.6


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




def test_a_batch_is_padded_only_to_a_size_measured_clearly_cheaper() -> None:
    """A 150k-vocabulary Q8_0 target on a 2-core Xeon: 33 tokens 351 ms, 63 643 ms, 64 399 ms (ggml's
    kernel changes at 64 rows)."""
    costs = _costs({1: 45.0, 33: 351.0, 63: 643.0, 64: 399.0})
    assert costs.cheapest_batch(63, 65) == 64
    assert costs.cheapest_batch(50, 65) == 64  # unmeasured: 33 and 63 interpolated
    assert costs.cheapest_batch(63, 63) == 63  # no room (the context, a recurrent target's rollback)
    assert costs.cheapest_batch(33, 65) == 33  # 64 costs more than 33
    assert costs.cheapest_batch(1, 65) == 1
    near = _costs({1: 45.0, 40: 420.0, 64: 399.0})
    assert near.cheapest_batch(40, 65) == 40  # 5 % is noise, not a kernel threshold


def test_a_new_smaller_batch_size_is_timed_at_once_a_larger_than_ever_one_is_not() -> None:
    costs = CostModel()
    costs.observe_verify(8, 5.0)  # grows llama.cpp's buffers: cold
    costs.observe_verify(3, 0.020)
    costs.observe_verify(1, 0.010)
    assert set(costs.verify) == {1, 3}
    costs.observe_verify(8, 0.030)
    assert list(costs.verify[8]) == [(0.030, 0)]


def test_the_last_tokens_of_a_copy_are_drafted_however_fast_the_copy_went() -> None:
    """Near the output's end the time to come is only that of the tokens left: priced at the recent
    rate (64-token copies, several times plain decoding), a draft of the last 45 looked dear, and a
    150k-vocabulary target decoded them one by one (10 plain rounds, a fifth of its generation)."""
    policy = _free_ngram(AutoK(_costs({1: 45.0, 13: 183.0, 35: 500.0, 65: 465.0})), 0.5, 64)
    policy.rate = [65.0, 0.465]  # the last round: a copy of 64, all accepted
    assert policy.decide("ngram", 45) == Decision(45)
    assert policy.gate("ngram", Decision(45)).best_prefix([0.5] * 45) == 0  # mid-generation: dear
    assert policy.decide("ngram", 45, left=46) == Decision(45)
    assert policy.gate("ngram", Decision(45)).best_prefix([0.5] * 45) == 45


def test_a_reference_rate_above_every_option_does_not_make_a_sure_copy_go_plain() -> None:
    """The reference rate is at most what a round can be expected to give: after a 64-token copy
    faster than the verify curve's medians (a 150k-vocabulary target: 65 tokens in 450 ms, curve
    487), every length looked dear at that rate and the next round of the copy went plain (47 ms for
    one token)."""
    curve = {1: 50.0, 2: 58.0, 4: 83.0, 8: 133.0, 16: 235.0, 32: 437.0, 65: 487.0}
    policy = _free_ngram(AutoK(_costs(curve)), 0.5, 64)
    policy.rate = [65.0, 0.450]
    inputs = policy.inputs("ngram")
    assert inputs is not None and inputs.rate < 65.0 / 0.450
    assert policy.gate("ngram", Decision(64)).best_prefix([0.5] * 64) == 64


def test_a_text_sources_first_rounds_weigh_more_against_its_prior_than_a_models() -> None:
    """N-gram lookup's confidence is the text's: in a new process its bins start from a prior of half
    an observation, so a long copy's first fully accepted round lets the next draft much further (a
    152k-vocabulary target's copy ramped 2, 20, 64 tokens a round rather than 2, 11, 64)."""
    policy = AutoK(_costs(CPU_STAIRCASE), text_sources=frozenset({"ngram"}))
    for source in ("ngram", "draft"):
        policy.observe(RoundReport(source, 2, 2, 0.0, 0.064, 2, confidence=[0.55] * 2, first_confidence=0.55))
    ngram, draft = policy.learned.calibration["ngram"], policy.learned.calibration["draft"]
    prior = 0.98**2  # what is left of the prior's weight after two observations
    assert ngram.acceptance(0.55) == pytest.approx((0.55 * 0.5 * prior + 0.98 + 1) / (0.5 * prior + 0.98 + 1))
    assert draft.acceptance(0.55) == pytest.approx((0.55 * prior + 0.98 + 1) / (prior + 0.98 + 1))
    assert ngram.acceptance(0.55) > draft.acceptance(0.55) + 0.05


def _block(c_pass: float, block: int = 7) -> AutoK:
    """auto over the CPU staircase for a block drafter (one pass proposes `block` positions, costs
    c_pass) whose positions are accepted when it is confident."""
    costs = _costs(CPU_STAIRCASE)
    for _ in range(1 + SETTLED_SAMPLES):
        costs.observe_draft("dflash", 1, c_pass)
    policy = AutoK(costs, block_sources={"dflash": block})
    cal = policy.learned.calibration.setdefault("dflash", Calibration())
    for _ in range(30):
        cal.observe(0.99, 1.0)
        cal.observe(0.3, 0.0)
    return policy


def test_a_warmed_up_drafter_is_declined_after_its_first_warm_look() -> None:
    """A drafter that ran a pass of its shape at load (Drafter.warm_up) times warm steps from its first
    look: a declined verdict, whose shadows time more, needs no more (without the warm-up, the first
    step is left out as cold and SETTLED_SAMPLES more are timed first: four looks, which cost a random
    DSpark head of the 152k bench target ~3 % of its first 256-token generation here). A verdict that
    stops the looks still waits for the median: a pass that could not pay even at the surest
    confidence (hopeless) is looked at until it is settled."""
    def looks(c_pass: float, warmed: bool) -> tuple[int, bool]:
        costs = _costs(CPU_STAIRCASE)
        if warmed:
            costs.warmed("dflash")
        policy = AutoK(costs, block_sources={"dflash": 7})
        _lately_unsure(policy, "dflash")
        count = len(_declined_rounds(policy, "dflash", 12, c_pass, limit=7))
        return count, "dflash" in policy.hopeless

    assert looks(0.010, warmed=True) == (1, False)
    assert looks(0.010, warmed=False) == (1 + SETTLED_SAMPLES, False)
    assert looks(1.0, warmed=True) == (SETTLED_SAMPLES + 1, True)  # and the hopeless verdict's own look


def test_a_block_drafters_pass_is_priced_once_and_its_positions_by_their_verify() -> None:
    """A DFlash/DSpark pass proposes a block at once: auto prices the pass when it decides to draft and
    then keeps the prefix whose acceptance beats its share of the verify, charging no draft step per
    position (a per-position drafter at the same cost a position would draft far less)."""
    block = _block(c_pass=0.025)
    block.learned.calibration["dflash"].observe_first(0.99)
    assert _k(block, "dflash") == 8
    gate = block.gate("dflash", Decision(8))
    assert gate.best_prefix([0.99] * 7) == 7
    assert gate.best_prefix([0.99] * 3 + [0.3] * 4) == 3
    per_position = _gated(c_draft=0.025)
    assert per_position.gate("draft", Decision(8)).best_prefix([0.99] * 7) < 7
    # The pass itself is what decide prices: one dearer than what a sure block gains is not drafted.
    dear = _block(c_pass=0.2)
    dear.learned.calibration["dflash"].observe_first(0.99)
    assert _k(dear, "dflash") == 0
    # A round's draft cost is one pass, however many positions were kept (the proposer's report).
    inputs = block.inputs("dflash")
    assert inputs is not None and inputs.c_draft == 0.0 and inputs.pass_cost == pytest.approx(0.025)
    assert inputs.n_max == 7


def test_a_look_again_verdict_is_not_priced_again_until_something_it_rested_on_changes() -> None:
    """A source whose step is not settled is looked at each round before any verdict. N-gram lookup on
    text without repeats times a step only where it finds something, so that state lasts: pricing every
    such round cost ~40 us a round on a 1 ms token, three times the lookup. The verdict holds, unpriced,
    while nothing it rested on changes; a proposal (or a step timed) prices the next round again."""
    costs = _costs(CPU_STAIRCASE)
    for _ in range(2):  # the first is left out as cold: one warm step, not settled
        costs.observe_draft("ngram", 1, 0.002)
    policy = AutoK(costs, text_sources=frozenset({"ngram"}))
    cal = policy._calibration("ngram")
    for _ in range(3):
        cal.observe_first(0.05)  # lately unsure: drafting is not expected to pay
    for _ in range(RATE_SETTLED):  # plain rounds: the reference rate has settled
        policy.observe(RoundReport(None, 0, 0, 0.0, 0.0308, 0))
    priced = []
    real_inputs = policy.inputs
    policy.inputs = lambda source: priced.append(source) or real_inputs(source)

    def look_that_found(confidence: float | None) -> None:
        policy.observe(RoundReport("ngram", 0, 0, 0.00001, 0.0308, int(confidence is not None),
                                   first_confidence=confidence, position=100))

    assert policy.decide("ngram", 8, 500, 100) == Decision(0, look=True) and policy._plan == "unmeasured"
    assert len(priced) == 1
    for _ in range(5):
        look_that_found(None)
        assert policy.decide("ngram", 8, 500, 100) == Decision(0, look=True)
        assert policy._plan == "unmeasured"
    assert len(priced) == 1  # nothing changed: not priced again
    look_that_found(0.1)  # a proposal: a step timed and a first position seen
    assert policy.decide("ngram", 8, 500, 100) == Decision(0, look=True)
    assert len(priced) == 2


def test_a_confidences_bin_is_the_edges_searchsorted_right() -> None:
    """Calibration.bin bisects a list (a drafting round asks for ~30 bins, searchsorted costs ~0.9 us
    each): the same bin as np.searchsorted(side="right") at the edges, between them, outside [0, 1], for
    numpy scalars and for NaN."""
    from specli.policy import _CONFIDENCE_EDGES

    rng = np.random.default_rng(7)
    values = [*_CONFIDENCE_EDGES, *np.nextafter(_CONFIDENCE_EDGES, 0), -0.5, 0.0, 1.0, 1.5, float("nan"),
              *rng.random(200), *rng.random(50).astype(np.float32)]
    for value in values:
        assert Calibration.bin(value) == int(np.searchsorted(_CONFIDENCE_EDGES, value, side="right")), value
