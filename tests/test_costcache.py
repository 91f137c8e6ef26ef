"""What decodes cost, kept from one process to the next (specli.costcache), on real llama.cpp models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specli import costcache
from specli.api import load
from specli.costs import CostModel
from specli.engine import GenerationParams
from specli.policy import Calibration, Learned, kept_calibration
from specli.sampling import SamplingParams


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SPECLI_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("SPECLI_COST_CACHE", raising=False)
    return tmp_path / "cache" / "costs"


def _generate(spec, k: int | str = "auto") -> None:
    params = GenerationParams(max_tokens=24, draft_max=k, ignore_eos=True, seed=7,
                              sampling=SamplingParams(temperature=0.0))
    spec.generate("Once upon a time", params).complete()


def test_a_new_process_starts_from_the_costs_the_last_one_measured(fixture_models, cache_dir: Path) -> None:
    with load(fixture_models.target, fixture_models.draft, n_ctx=512, n_threads=1) as spec:
        assert spec.engine.costs.verify == {}  # nothing measured before
        _generate(spec)
        _generate(spec)
        measured = {m: list(s) for m, s in spec.engine.costs.verify.items()}
        draft_cost = spec.engine.costs.draft_seconds_per_token("draft")
    assert 1 in measured and draft_cost is not None, (measured, draft_cost)
    [file] = cache_dir.iterdir()
    assert json.loads(file.read_text())["identity"]["target"]["threads"] == 1

    with load(fixture_models.target, fixture_models.draft, n_ctx=256, n_threads=1) as spec:
        # Before any decode: the verify curve and the draft step as the first process left them.
        assert {m: list(s) for m, s in spec.engine.costs.verify.items()} == measured
        assert spec.engine.costs.draft_seconds_per_token("draft") == pytest.approx(draft_cost)
        assert spec.engine.costs.verify_seconds(4) is not None


def test_costs_are_kept_apart_by_thread_count_and_drafter(fixture_models, cache_dir: Path) -> None:
    with load(fixture_models.target, fixture_models.draft, n_ctx=512, n_threads=1) as spec:
        _generate(spec)
    for other in ({"draft": fixture_models.draft, "n_threads": 2}, {"draft": "ngram", "n_threads": 1}):
        with load(fixture_models.target, n_ctx=512, **other) as spec:
            assert spec.engine.costs.verify == {}, other
            _generate(spec)
    assert len(list(cache_dir.iterdir())) == 3


def test_a_damaged_cost_file_is_ignored_and_replaced(fixture_models, cache_dir: Path) -> None:
    with load(fixture_models.target, fixture_models.draft, n_ctx=512, n_threads=1) as spec:
        _generate(spec)
    [file] = cache_dir.iterdir()
    for damage in ("{not json", json.dumps({"format": 1, "costs": {"verify": {"2": [-1.0]}}}), "[]"):
        file.write_text(damage)
        with load(fixture_models.target, fixture_models.draft, n_ctx=512, n_threads=1) as spec:
            assert spec.engine.costs.verify == {}
            _generate(spec)
        assert json.loads(file.read_text())["costs"]["verify"]["1"]


def test_the_cost_cache_can_be_turned_off(fixture_models, cache_dir: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECLI_COST_CACHE", "0")
    with load(fixture_models.target, fixture_models.draft, n_ctx=512, n_threads=1) as spec:
        _generate(spec)
    assert not cache_dir.exists()


def test_an_unwritable_cache_directory_costs_nothing_but_the_cache(fixture_models, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("SPECLI_CACHE_DIR", str(blocker))  # a file where the directory would go
    with load(fixture_models.target, fixture_models.draft, n_ctx=512, n_threads=1) as spec:
        _generate(spec)
    assert blocker.read_text() == ""


def test_a_restored_record_is_checked_and_a_cold_decode_is_still_left_out() -> None:
    measured = CostModel()
    for m, seconds in ((1, 0.010), (1, 0.010), (1, 0.011), (4, 0.020), (4, 0.022)):
        measured.observe_verify(m, seconds)
    measured.observe_draft("draft", 2, 0.002)
    measured.observe_draft("draft", 2, 0.002)
    later = CostModel()
    later.restore(json.loads(json.dumps(measured.to_record())))
    assert later.verify_seconds(4) == measured.verify_seconds(4)
    assert later.draft_seconds_per_token("draft") == measured.draft_seconds_per_token("draft")
    later.observe_verify(1, 5.0)  # this process's first decode of a size builds its graph: not a cost
    assert later.verify_seconds(1) == measured.verify_seconds(1)
    for bad in ({"verify": {"0": [0.01]}}, {"verify": {"2": []}}, {"verify": {"2": ["x"]}},
                {"draft": {"draft": [0.01]}}, {"look": {"ngram": [0.01, float("nan")]}}):
        with pytest.raises(ValueError):
            CostModel().restore(bad)


def test_the_cache_lives_under_the_users_cache_directory(monkeypatch: pytest.MonkeyPatch,
                                                         tmp_path: Path) -> None:
    monkeypatch.delenv("SPECLI_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert costcache.cache_directory() == tmp_path / "specli" / "costs"
    monkeypatch.setenv("SPECLI_COST_CACHE", "off")
    assert costcache.cache_directory() is None


def test_only_free_looks_keep_their_calibration() -> None:
    costs, learned = CostModel(), Learned()
    for _ in range(3):
        costs.observe_verify(1, 0.010)
        costs.observe_draft("ngram", 8, 0.000_08)  # 10 us a position: 0.1 % of a target token
        costs.observe_draft("draft", 2, 0.004)  # a draft model's step: 20 % of one
    for source in ("ngram", "draft", "mtp"):  # mtp: no step measured
        learned.calibration[source] = Calibration()
    assert set(kept_calibration(costs, learned)) == {"ngram"}
    assert kept_calibration(CostModel(), learned) == {}  # nothing measured: nothing is known to be free


def _params(temperature: float) -> GenerationParams:
    return GenerationParams(max_tokens=24, ignore_eos=True, seed=7,
                            sampling=SamplingParams(temperature=temperature))


def test_a_new_process_starts_from_the_kept_calibration_but_corrects_it_quickly(
        fixture_models, cache_dir: Path) -> None:
    with load(fixture_models.target, "ngram", n_ctx=512, n_threads=1) as spec:
        _generate(spec)  # greedy
        for _ in range(spec.engine.costs.window):
            spec.engine.costs.observe_verify(1, 1.0)  # a target token dear enough for looks to be free
        cal = spec.engine.learned.calibration.setdefault("ngram", Calibration())
        for _ in range(200):
            cal.observe(0.5, 1.0)  # as after long copies: one sighting of a passage is copied on
        learned = cal.acceptance(0.5)
    assert learned > 0.99
    with load(fixture_models.target, "ngram", n_ctx=512, n_threads=1) as spec:
        spec.generate("Once upon a time", _params(0.8))  # (not run: the calibration is set up at the call)
        assert "ngram" not in spec.engine.learned.calibration  # greedy's acceptance is not T 0.8's
    with load(fixture_models.target, "ngram", n_ctx=512, n_threads=1) as spec:
        spec.generate("Once upon a time", _params(0.0))
        restored = spec.engine.learned.calibration["ngram"]
        assert restored.acceptance(0.5) == pytest.approx(learned)
        assert restored.seen.max() <= costcache.RESTORED_WEIGHT  # weighs a few rounds, not 200
        for _ in range(4):
            restored.observe(0.5, 0.0)  # a text where such copies fail
        assert restored.acceptance(0.5) < 0.6
        assert restored.first.sum() == 0  # where first positions fall describes the text: not kept
    with load(fixture_models.target, fixture_models.draft, n_ctx=512, n_threads=1) as spec:
        spec.generate("Once upon a time", _params(0.0))
        assert "ngram" not in spec.engine.learned.calibration  # another pair, another file
        _generate(spec)
        assert "draft" in spec.engine.learned.calibration
    records = [json.loads(f.read_text()) for f in cache_dir.iterdir()]
    # A draft model's calibration is not kept; greedy's outlived a process at T 0.8.
    assert sorted(sorted(r["calibration"].get("temp=0", {})) for r in records) == [[], ["ngram"]]


def test_a_damaged_calibration_leaves_the_whole_record_unused() -> None:
    good = Calibration().to_record()
    for bad in ({**good, "seen": good["seen"][:-1]}, {**good, "accepted": [2.0] * len(good["seen"])},
                {**good, "seen": [0.0] * len(good["seen"])}, {"accepted": good["accepted"]}):
        with pytest.raises((ValueError, KeyError)):
            Calibration.restored(bad, 4.0)
