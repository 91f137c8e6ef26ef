"""What decodes cost, kept from one process to the next (specli.costcache), on real llama.cpp models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specli import costcache
from specli.api import load
from specli.costs import CostModel
from specli.engine import GenerationParams
from specli.policy import regime
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
        # Before any decode: the verify curve and the draft step as the first process left them,
        # carried until this process measures each size.
        assert {m: list(s) for m, s in spec.engine.costs.carried.items()} == measured
        assert spec.engine.costs.verify == {}
        assert spec.engine.costs.draft_seconds_per_token("draft") == pytest.approx(draft_cost)
        assert spec.engine.costs.verify_seconds(4) is not None


def test_costs_are_kept_apart_by_thread_count_and_drafter(fixture_models, cache_dir: Path) -> None:
    with load(fixture_models.target, fixture_models.draft, n_ctx=512, n_threads=1) as spec:
        _generate(spec)
    for other in ({"draft": fixture_models.draft, "n_threads": 2}, {"draft": "ngram", "n_threads": 1}):
        with load(fixture_models.target, n_ctx=512, **other) as spec:
            assert spec.engine.costs.verify == {} and spec.engine.costs.carried == {}, other
            _generate(spec)
    assert len(list(cache_dir.iterdir())) == 3


def test_a_damaged_cost_file_is_ignored_and_replaced(fixture_models, cache_dir: Path) -> None:
    with load(fixture_models.target, fixture_models.draft, n_ctx=512, n_threads=1) as spec:
        _generate(spec)
    [file] = cache_dir.iterdir()
    for damage in ("{not json", json.dumps({"format": 1, "costs": {"verify": {"2": [-1.0]}}}), "[]"):
        file.write_text(damage)
        with load(fixture_models.target, fixture_models.draft, n_ctx=512, n_threads=1) as spec:
            assert spec.engine.costs.verify == {} and spec.engine.costs.carried == {}
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
    samples = ((1, 0.010, 0), (1, 0.010, 50), (1, 0.011, 300), (4, 0.020, 10), (4, 0.022, 90))
    for m, seconds, position in samples:
        measured.observe_verify(m, seconds, position)
    measured.observe_draft("draft", 2, 0.002)
    measured.observe_draft("draft", 2, 0.002)
    later = CostModel()
    later.restore(json.loads(json.dumps(measured.to_record())))
    assert later.verify_seconds(4) == measured.verify_seconds(4)
    assert later.draft_seconds_per_token("draft") == measured.draft_seconds_per_token("draft")
    later.observe_verify(1, 5.0)  # this process's first decode of a size builds its graph: not a cost
    assert later.verify_seconds(1) == measured.verify_seconds(1)
    for bad in ({"verify": {"0": [[0.01, 0]]}}, {"verify": {"2": []}}, {"verify": {"2": [["x", 0]]}},
                {"verify": {"2": [0.01]}}, {"verify": {"2": [[0.01, -1]]}},
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


def test_a_new_process_starts_from_the_draft_calibration_the_last_one_learned(fixture_models,
                                                                              cache_dir: Path) -> None:
    """A draft model's acceptance by confidence describes the pair of models: kept per sampling regime
    with the costs, and a later process's first generation in that regime starts from it. n-gram
    lookup's, which describes the text, is not kept."""
    sampled = GenerationParams(max_tokens=24, draft_max="auto", ignore_eos=True, seed=7,
                               sampling=SamplingParams(temperature=1.0))
    hot = regime(sampled.sampling, sampled.same_as_plain)
    with load(fixture_models.target, fixture_models.draft, n_ctx=512, n_threads=1) as spec:
        spec.generate("Once upon a time", sampled).complete()
        learned = spec.engine.learned.calibration["draft"].to_record()
    with load(fixture_models.target, fixture_models.draft, n_ctx=512, n_threads=1) as spec:
        restored = spec.engine.learned.others[hot]["draft"]
        assert restored.to_record() == learned
        _generate(spec)  # greedy: another regime, which starts from nothing learned
        assert spec.engine.learned.calibration["draft"] is not restored
        spec.generate("Once upon a time", sampled).complete()
        assert spec.engine.learned.calibration["draft"] is restored
    [file] = cache_dir.iterdir()
    assert set(json.loads(file.read_text())["learned"]) == {hot, "greedy"}

    with load(fixture_models.target, "ngram", n_ctx=512, n_threads=1) as spec:
        spec.generate("the cat sat on the mat. the cat sat on the", sampled).complete()
        assert spec.engine.learned.calibration["ngram"].seen.sum() > 0
    [ngram_file] = [f for f in cache_dir.iterdir() if f != file]
    assert json.loads(ngram_file.read_text())["learned"] == {}

    # A damaged calibration costs the calibration only.
    record = json.loads(file.read_text())
    record["learned"][hot]["draft"]["seen"] = [0.0] * len(learned["seen"])
    file.write_text(json.dumps(record))
    with load(fixture_models.target, fixture_models.draft, n_ctx=512, n_threads=1) as spec:
        assert spec.engine.learned.others == {} and spec.engine.costs.carried
