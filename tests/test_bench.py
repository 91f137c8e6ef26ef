"""`specli bench` internals on the tiny fixture pair: structure and invariants, never speed."""

from __future__ import annotations

import csv
import json
import os
import re
import select
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from specli.bench.aggregate import bench_notes, first_difference
from specli.bench.files import write_csv, write_json
from specli.bench.measure import curve_sizes, run_bench
from specli.bench.prediction import VerifyCurve, VerifyPoint, predicted_speedup
from specli.bench.results import BenchResult, RunRecord, Spread
from specli.bench.suite import (
    BUILTIN_PROMPTS,
    BenchConfig,
    BenchError,
    BenchPrompt,
    PromptFileError,
    load_prompts,
    parse_k_list,
    parse_prompts,
    parse_temp_list,
)
from specli.cli import app
from specli.errors import UsageProblem
from specli.settings import MAX_DRAFT_K, SETTINGS, defaults_for
from specli.stats import expected_tokens_per_round
from specli.ui.bench_view import render_bench

PROMPTS = [
    BenchPrompt("story", "Once upon a time there was a little girl", "story"),
    BenchPrompt("copy", "The dog ran to the park. The dog ran to the park. The dog", "copy"),
]


class RecordingProgress:
    def __init__(self, interrupt_after_runs: int | None = None) -> None:
        self.phases: list[tuple[str, int]] = []
        self.steps: dict[str, int] = {}
        self.interrupt_after_runs = interrupt_after_runs

    def phase(self, name: str, total: int) -> None:
        self.phases.append((name, total))
        self.steps[name] = 0

    def step(self, detail: str = "") -> None:
        name = self.phases[-1][0]
        self.steps[name] += 1
        if name == "runs" and self.steps[name] == self.interrupt_after_runs:
            raise KeyboardInterrupt


def tiny_config(fixture_models, **kw) -> BenchConfig:
    """A small bench; keywords that are settings (max_tokens, ctx, seed ...) go to its RunSettings."""
    options = dict(target=fixture_models.target, draft=fixture_models.draft, ks=[1, 2], temps=[0.0, 1.0],
                   prompts=PROMPTS, repeat=2, curve_repeats=2, warmup_tokens=4)
    settings = dict(max_tokens=16, ctx=256, threads=1, seed=7)
    for key, value in kw.items():
        (settings if key in SETTINGS else options)[key] = value
    return BenchConfig(**options, settings=defaults_for("bench").merged(settings))


@pytest.fixture(scope="module")
def bench(fixture_models) -> tuple[BenchResult, RecordingProgress]:
    progress = RecordingProgress()
    return run_bench(tiny_config(fixture_models), progress=progress), progress


# -- the run ----------------------------------------------------------------------------------------------


def test_every_config_has_repeat_times_prompts_pairs(bench) -> None:
    result, _ = bench
    assert [(c.temperature, c.k) for c in result.configs] == [(0.0, 1), (0.0, 2), (1.0, 1), (1.0, 2)]
    for c in result.configs:
        assert c.pairs == 2 * len(PROMPTS)
        assert c.plain_tps.n == c.spec_tps.n == c.speedup.n == c.pairs
        assert [p.prompt for p in c.per_prompt] == ["story", "copy"]
        assert all(p.speedup.n == 2 for p in c.per_prompt)
    assert len(result.runs) == 4 * 2 * len(PROMPTS) * 2
    assert not result.interrupted


def test_runs_are_interleaved_in_pairs_with_one_seed(bench) -> None:
    result, _ = bench
    runs = result.runs
    assert [r.seq for r in runs] == list(range(len(runs)))
    for first, second in zip(runs[::2], runs[1::2], strict=True):
        assert {first.mode, second.mode} == {"plain", "spec"}
        assert (first.position, second.position) == (0, 1)
        same = ("temperature", "k", "prompt", "repeat", "pair", "seed", "n_prompt")
        assert all(getattr(first, f) == getattr(second, f) for f in same)
    # Which half runs first alternates, so a first-run advantage favours neither side.
    for c in result.configs:
        firsts = [r.mode for r in runs if r.temperature == c.temperature and r.k == c.k and r.position == 0]
        assert firsts.count("plain") == firsts.count("spec")
    # Different repeats of one prompt use different seeds; the same seeds recur across configurations.
    seeds = {(c.temperature, c.k): [r.seed for r in runs if (r.temperature, r.k) == (c.temperature, c.k)]
             for c in result.configs}
    assert len({tuple(v) for v in seeds.values()}) == 1
    assert len(set(next(iter(seeds.values())))) == 2 * len(PROMPTS)


def complete_pairs(result: BenchResult) -> list[tuple[RunRecord, RunRecord]]:
    """(plain, spec) of every complete pair, configuration by configuration, in execution order:
    written here, apart from the aggregation the tests check."""
    out = []
    for temp in result.config.temps:
        for k in result.config.ks:
            by_pair: dict[int, dict[str, RunRecord]] = {}
            for run in result.runs:
                if run.temperature == temp and run.k == k:
                    by_pair.setdefault(run.pair, {})[run.mode] = run
            out += [(modes["plain"], modes["spec"]) for _, modes in sorted(by_pair.items())
                    if "plain" in modes and "spec" in modes]
    return out


def test_speedups_are_paired_ratios_of_the_rates(bench) -> None:
    result, _ = bench
    for plain, spec in complete_pairs(result):
        assert plain.speedup is None
        assert spec.speedup == pytest.approx(spec.tokens_per_second / plain.tokens_per_second)
        assert plain.tokens_per_second == pytest.approx(plain.n_generated / plain.generation_seconds)
        assert plain.drafted == 0 and plain.rounds == plain.n_generated
    for c in result.configs:
        ratios = [s.speedup for _, s in complete_pairs(result)
                  if s.temperature == c.temperature and s.k == c.k]
        assert c.speedup.median == pytest.approx(statistics.median(ratios))
        assert c.speedup.min == pytest.approx(min(ratios)) and c.speedup.max == pytest.approx(max(ratios))
        assert c.wins == sum(1 for x in ratios if x > 1)
        assert c.speedup.p25 <= c.speedup.median <= c.speedup.p75


def test_acceptance_prediction_and_efficiency_are_computed(bench) -> None:
    result, _ = bench
    for c in result.configs:
        assert c.acceptance_rate is not None and 0 <= c.acceptance_rate <= 1
        assert c.tokens_per_round is not None and 1 <= c.tokens_per_round <= c.k + 1
        assert c.predicted_speedup is not None and c.predicted_speedup > 0
        assert c.efficiency == pytest.approx(c.speedup.median / c.predicted_speedup)
        shares = (c.draft_share, c.verify_share, c.other_share)
        assert all(s is not None and 0 <= s <= 1 for s in shares)
        assert sum(shares) == pytest.approx(1.0, abs=1e-6)
    # Same-as-plain (the default) reproduces plain decoding exactly, greedy or sampled, and says so.
    assert result.config.settings.same_as_plain and any(c.temperature > 0 for c in result.configs)
    assert all(c.mismatches == 0 and c.first_forks == [] for c in result.configs)
    assert all(r.first_fork is None for r in result.runs if r.mode == "spec")
    spec_runs = [r for r in result.runs if r.mode == "spec"]
    assert all(r.predicted_speedup is not None for r in spec_runs)
    assert result.best is max(result.configs, key=lambda c: c.speedup.median)


def test_verify_curve_covers_every_batch_size(bench) -> None:
    result, _ = bench
    curve = result.curve
    assert [p.m for p in curve.points] == [1, 2, 3]
    assert all(p.ms > 0 and p.min_ms <= p.ms <= p.max_ms and p.samples >= 1 for p in curve.points)
    assert curve.ratio(1) == 1.0
    assert curve.draft_ms_per_token is not None and curve.draft_ms_per_token > 0
    assert curve.prefix_tokens > 0


def test_progress_phases_and_excluded_timings(bench) -> None:
    result, progress = bench
    assert [name for name, _ in progress.phases] == ["load", "warm-up", "verify cost", "runs"]
    assert progress.steps["runs"] == dict(progress.phases)["runs"] == len(result.runs)
    assert result.load_seconds > 0 and result.warmup_seconds > 0 and result.curve_seconds > 0
    assert result.load_seconds == result.target.load_seconds + result.draft.load_seconds
    assert result.target.load_seconds > 0 and result.draft.load_seconds > 0
    assert result.target.n_params > 0 and result.draft.n_vocab == result.target.n_vocab


def _same(file_value, value) -> bool:
    """A value as written to a file (floats rounded to 6 places) against the run's own."""
    if isinstance(value, float):
        return file_value == pytest.approx(value, abs=1e-6)
    return file_value == value


def test_json_and_csv_hold_every_run(bench, tmp_path) -> None:
    result, _ = bench
    write_json(result, tmp_path / "b.json")
    write_csv(result, tmp_path / "b.csv")
    data = json.loads((tmp_path / "b.json").read_text())
    sections = {"machine", "models", "options", "timings", "verify_curve", "configs", "runs", "prompts"}
    assert sections <= set(data)
    assert data["options"]["ks"] == [1, 2] and data["options"]["repeat"] == 2
    assert data["options"]["temperatures"] == [0.0, 1.0] and data["options"]["max_tokens"] == 16
    assert data["options"]["n_threads"] == 1 and data["interrupted"] is False
    assert data["machine"]["cpu_count"] and data["machine"]["llama_cpp_python"]
    assert data["models"]["target"]["file_bytes"] == result.config.target.stat().st_size
    assert data["models"]["draft"]["file_bytes"] == result.config.draft.stat().st_size
    assert [p["name"] for p in data["prompts"]] == ["story", "copy"]
    assert [p["text"] for p in data["prompts"]] == [p.text for p in PROMPTS]
    assert [(p["m"], p["ms"]) for p in data["verify_curve"]["points"]] == [
        (p.m, pytest.approx(p.ms, abs=1e-6)) for p in result.curve.points]
    # Every run, every field, in the order they ran.
    assert len(data["runs"]) == len(result.runs)
    for written, run in zip(data["runs"], result.runs, strict=True):
        for name, value in asdict(run).items():
            assert _same(written[name], value), name
    # Every configuration's figures are the run's, as aggregated.
    assert len(data["configs"]) == len(result.configs) == 4
    for written, c in zip(data["configs"], result.configs, strict=True):
        assert (written["temperature"], written["k"], written["pairs"]) == (c.temperature, c.k, c.pairs)
        assert _same(written["speedup"]["median"], c.speedup.median)
        assert _same(written["acceptance_rate"], c.acceptance_rate)
        assert _same(written["predicted_speedup"], c.predicted_speedup)
        assert [p["prompt"] for p in written["per_prompt"]] == ["story", "copy"]
    assert data["best"]["k"] == result.best.k and _same(data["best"]["speedup"], result.best.speedup.median)
    with open(tmp_path / "b.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(result.runs)
    for row, run in zip(rows, result.runs, strict=True):
        assert row["mode"] == run.mode and row["prompt"] == run.prompt and int(row["seq"]) == run.seq
        assert float(row["temperature"]) == run.temperature and row["k"] == str(run.k)
        assert int(row["n_generated"]) == run.n_generated and int(row["drafted"]) == run.drafted
        assert int(row["accepted"]) == run.accepted and int(row["output_crc"]) == run.output_crc
        assert float(row["tokens_per_second"]) == pytest.approx(run.tokens_per_second, abs=1e-6)
        assert row["speedup"] == ("" if run.speedup is None else str(round(run.speedup, 6)))
        assert row["target"] == str(result.config.target) and row["drafter"] == "draft"


def test_configs_are_pooled_from_their_runs(bench) -> None:
    """Each configuration's acceptance, alpha and tokens per round, recomputed from its own runs."""
    result, _ = bench
    for c in result.configs:
        spec = [r for r in result.runs if (r.temperature, r.k, r.mode) == (c.temperature, c.k, "spec")]
        accepted, drafted = sum(r.accepted for r in spec), sum(r.drafted for r in spec)
        assert c.acceptance_rate == pytest.approx(accepted / drafted)
        assert c.alpha == pytest.approx(accepted / (accepted + sum(r.rejections for r in spec)))
        generated, rounds = sum(r.n_generated for r in spec), sum(r.rounds for r in spec)
        assert c.tokens_per_round == pytest.approx(generated / rounds)
        assert c.short_runs == 0 and all(r.n_generated == 16 for r in result.runs)  # EOS ignored
        for r in spec:
            assert max(r.k_per_round) <= c.k and sum(r.k_per_round) == r.drafted
            assert r.acceptance_rate == pytest.approx(r.accepted / r.drafted)


def test_render_shows_the_tables(bench) -> None:
    result, _ = bench
    console = Console(record=True, width=120)
    render_bench(result, console)
    text = console.export_text()
    for heading in ("plain", "spec", "speedup", "accept", "pred-", "effi-", "T_v(m)", "speedup by prompt",
                    "1.0×"):
        assert heading in text
    narrow = Console(record=True, width=60)
    render_bench(result, narrow)  # must not crash when squeezed


def test_a_prediction_that_does_not_describe_its_runs_is_not_shown(bench) -> None:
    """A predicted speedup off by more than CREDIBLE either way from the measured one priced the runs
    with a verify curve timed under another load: "predicted 0.00×, efficiency 6622 %" told a user
    nothing, so it is a dash (and the verdict does not quote it)."""
    from dataclasses import replace

    from specli.ui.bench_view import CREDIBLE, credible_prediction, results_table, verdict

    result, _ = bench
    base = result.configs[0]
    off = replace(base, predicted_speedup=0.001, efficiency=66.22)
    fine = replace(base, predicted_speedup=1.2, efficiency=1.1)
    assert not credible_prediction(off) and credible_prediction(fine)
    assert credible_prediction(replace(base, efficiency=CREDIBLE)) and not credible_prediction(
        replace(base, efficiency=1.01 / CREDIBLE - 0.01))
    shown = replace(result, configs=[off, fine])
    console = Console(record=True, width=160)
    console.print(results_table(shown))
    text = console.export_text()
    assert "0.00×" not in text and "6622" not in text and "1.20×" in text and "110 %" in text
    assert "efficiency" not in verdict(replace(result, configs=[off])).plain


# -- other drafters, errors, interruption -----------------------------------------------------------------


def test_ngram_drafter_and_auto_k(fixture_models) -> None:
    result = run_bench(tiny_config(fixture_models, draft="ngram", ks=["auto"], temps=[0.0], repeat=1))
    assert result.draft is None and result.drafter == "ngram"
    assert result.curve.draft_ms_per_token is None
    # auto may draft up to MAX_DRAFT_K, so the curve reaches MAX_DRAFT_K + 1 (sparser past 17 tokens).
    assert [p.m for p in result.curve.points] == curve_sizes(MAX_DRAFT_K + 1)
    assert curve_sizes(MAX_DRAFT_K + 1)[16:] == [17, 25, 33, 41, 49, 57, 65]
    assert result.configs[0].pairs == len(PROMPTS)
    render_bench(result, Console(record=True, width=120))


def test_interrupted_bench_keeps_whole_pairs(fixture_models) -> None:
    progress = RecordingProgress(interrupt_after_runs=5)
    result = run_bench(tiny_config(fixture_models), progress=progress)
    assert result.interrupted
    assert len(result.runs) == 4  # the fifth run's pair was not complete
    assert result.configs[0].pairs == 2
    assert any("interrupted" in message for _, message in bench_notes(result))


def test_an_interrupt_right_after_a_pair_completes_keeps_that_pair(fixture_models) -> None:
    progress = RecordingProgress(interrupt_after_runs=6)  # the third pair's second run has finished
    result = run_bench(tiny_config(fixture_models), progress=progress)
    assert result.interrupted
    assert len(result.runs) == 6


def test_the_pair_is_built_by_api_load(fixture_models) -> None:
    """bench loads through specli.api.load, so it refuses what `load` refuses (here: MTP drafting on a
    target without MTP layers) with load's own message."""
    with pytest.raises(ValueError, match="has no MTP"):
        run_bench(tiny_config(fixture_models, draft="mtp"))


def test_context_too_small_is_a_usage_problem(fixture_models) -> None:
    with pytest.raises(BenchError, match="raise --ctx"):
        run_bench(tiny_config(fixture_models, ctx=256, max_tokens=1000))


@pytest.mark.parametrize("bad", [{"ks": []}, {"ks": [0]}, {"repeat": 0}, {"max_tokens": 0}, {"temps": []}])
def test_bad_options_are_refused(fixture_models, bad) -> None:
    with pytest.raises(BenchError):
        tiny_config(fixture_models, **bad).validate()


# -- pure pieces ------------------------------------------------------------------------------------------


def test_prompt_file_one_per_line(tmp_path) -> None:
    path = tmp_path / "p.txt"
    path.write_text("first prompt\n\n   \nsecond {not json}\n{broken json\n")
    prompts = load_prompts(path)
    assert [p.text for p in prompts] == ["first prompt", "second {not json}", "{broken json"]
    assert [p.name for p in prompts] == ["line-1", "line-4", "line-5"]


def test_prompt_file_jsonl(tmp_path) -> None:
    path = tmp_path / "p.jsonl"
    lines = [{"name": "a", "prompt": "x\ny"}, {"prompt": "z"}, {"name": "a", "prompt": "w", "kind": "code"}]
    path.write_text("\n".join(json.dumps(o) for o in lines[:2]) + "\n\n" + json.dumps(lines[2]) + "\n")
    prompts = load_prompts(path)
    assert [(p.name, p.text, p.kind) for p in prompts] == [
        ("a", "x\ny", "custom"), ("prompt-2", "z", "custom"), ("a-2", "w", "code")]


@pytest.mark.parametrize("content, message", [
    ("", "empty"),
    ("\n  \n\t\n", "empty"),
    ('{"prompt": "ok"}\nplain text line\n', ":2:"),
    ('{"name": "no prompt"}\n', ":1:"),
    ('{"prompt": 3}\n', ":1:"),
])
def test_prompt_file_errors(tmp_path, content, message) -> None:
    path = tmp_path / "p.txt"
    path.write_text(content)
    with pytest.raises(PromptFileError, match=message) as info:
        load_prompts(path)
    assert "\n" not in str(info.value)
    assert isinstance(info.value, ValueError) and isinstance(info.value, UsageProblem)


def test_unreadable_prompt_files(tmp_path) -> None:
    with pytest.raises(PromptFileError, match="cannot read"):
        load_prompts(tmp_path / "missing.txt")
    with pytest.raises(PromptFileError, match="cannot read"):
        load_prompts(tmp_path)  # a directory
    (tmp_path / "bin").write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(PromptFileError, match="UTF-8"):
        load_prompts(tmp_path / "bin")


def test_builtin_suite_spans_the_regimes() -> None:
    assert {p.kind for p in BUILTIN_PROMPTS} == {"code", "copy", "story", "chat"}
    assert "<|im_start|>assistant" in next(p.text for p in BUILTIN_PROMPTS if p.kind == "chat")
    assert parse_prompts("a\nb")[1].name == "line-2"


def test_k_and_temperature_lists() -> None:
    assert parse_k_list("1, 2,4,auto,2") == [1, 2, 4, "auto"]
    assert parse_temp_list("0,0.7, 1") == [0.0, 0.7, 1.0]
    for bad in ("", "0", "65", "x", "1.5"):
        with pytest.raises(BenchError):
            parse_k_list(bad)
    for bad in ("", "-1", "hot", "nan"):
        with pytest.raises(BenchError):
            parse_temp_list(bad)


def _curve(ms: list[float], draft_ms: float | None = None) -> VerifyCurve:
    return VerifyCurve([VerifyPoint(m, t, t, t, 1) for m, t in enumerate(ms, 1)], 10, draft_ms)


def test_predicted_speedup_uses_the_curve() -> None:
    curve = _curve([10.0, 12.0, 14.0])
    alpha, c = 0.6, 0.002
    # Two rounds at k = 2 and one plain round: E tokens for (cost) seconds, against T_v(1) per token.
    expected = 2 * expected_tokens_per_round(alpha, 2) + 1
    cost = 2 * (2 * c + 0.014) + 0.010
    assert predicted_speedup(curve, alpha, alpha, c, [2, 0, 2]) == pytest.approx(expected * 0.010 / cost)
    # Two rates (the model auto chooses k with): the first draft passes with a1, each later with a2.
    two_rate = 2 * (1 + 0.6 + 0.6 * 0.9) + 1
    assert predicted_speedup(curve, 0.6, 0.9, c, [2, 0, 2]) == pytest.approx(two_rate * 0.010 / cost)
    assert predicted_speedup(curve, None, None, None, [0, 0]) == pytest.approx(1.0)
    assert predicted_speedup(curve, None, None, None, [2]) is None
    assert predicted_speedup(curve, 0.5, 0.5, c, []) is None
    # Past the measured sizes the curve extrapolates linearly.
    assert curve.ms(5) == pytest.approx(18.0)


def test_break_even_acceptance() -> None:
    flat = _curve([10.0, 10.0, 10.0])
    assert flat.break_even_alpha(2, 0.0) == pytest.approx(0.0, abs=1e-9)
    steep = _curve([10.0, 20.0, 30.0])
    assert steep.break_even_alpha(2, 0.0) is None  # a round costs as much as 3 plain tokens
    be = _curve([10.0, 12.0, 14.0]).break_even_alpha(2, 1.0)
    assert expected_tokens_per_round(be, 2) * 10.0 == pytest.approx(2 * 1.0 + 14.0, rel=1e-6)


def test_spread() -> None:
    s = Spread.of([3.0, 1.0, None, 2.0, 4.0])
    assert (s.n, s.median, s.min, s.max) == (4, 2.5, 1.0, 4.0)
    assert Spread.of([]).median is None


# -- the `specli bench` command ------------------------------------------------------------------------------

runner = CliRunner()


def bench_cli(fixture_models, tmp_path, *extra: str, draft: str | None = None):
    args = ["bench", "--target", str(fixture_models.target), "--draft", draft or str(fixture_models.draft),
            "-t", "1", "-c", "256", *extra]
    return runner.invoke(app, args, catch_exceptions=False)


def test_bench_command_with_prompts_json_and_csv(fixture_models, tmp_path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"name": "fox", "prompt": "The fox ran to the park."}) + "\n"
                       + json.dumps({"name": "bird", "prompt": "Once upon a time a bird"}) + "\n")
    out_json, out_csv = tmp_path / "r.json", tmp_path / "r.csv"
    result = bench_cli(fixture_models, tmp_path, "-k", "2,auto", "--temp", "0", "-n", "8", "--repeat", "1",
                       "--prompts", str(prompts), "--json", str(out_json), "--csv", str(out_csv))
    assert result.exit_code == 0, result.output
    data = json.loads(out_json.read_text())
    assert [p["name"] for p in data["prompts"]] == ["fox", "bird"]
    assert data["options"]["ks"] == [2, "auto"] and data["options"]["temperatures"] == [0.0]
    runs = data["runs"]
    assert len(runs) == 2 * 2 * 1 * 2  # ks x prompts x repeat x (plain, spec)
    assert {r["prompt"] for r in runs} == {"fox", "bird"}
    assert all(r["n_generated"] == 8 and r["stop_reason"] == "length" for r in runs)  # EOS ignored
    # Greedy: each pair's outputs are identical; the speedup is the pair's ratio of rates.
    for plain, spec in zip(runs[::2], runs[1::2], strict=True):
        plain, spec = (plain, spec) if plain["mode"] == "plain" else (spec, plain)
        assert plain["output_crc"] == spec["output_crc"]
        ratio = spec["tokens_per_second"] / plain["tokens_per_second"]
        assert spec["speedup"] == pytest.approx(ratio, rel=1e-4)
    with open(out_csv, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["seq"], r["mode"], r["prompt"], r["output_crc"]) for r in rows] == [
        (str(r["seq"]), r["mode"], r["prompt"], str(r["output_crc"])) for r in runs]
    # The table on stdout: one row per configuration, with the speedup of that configuration.
    for c in data["configs"]:
        assert f"{c['speedup']['median']:.2f}×" in result.stdout
    assert "speedup by prompt" in result.stdout and "fox" in result.stdout


def test_bench_stop_at_eos_lets_runs_end_early(eos_model, tmp_path) -> None:
    """With --stop-at-eos runs stop at EOS (counted as short runs); by default (as llama-bench) every
    run generates exactly -n tokens, EOS banned."""
    prompts = tmp_path / "p.txt"
    prompts.write_text("Once upon a time\nThe fox\n")
    common = ["bench", "--target", str(eos_model), "--draft", "ngram", "-t", "1", "-c", "256", "-k", "2",
              "--temp", "1", "-n", "40", "--repeat", "2", "--prompts", str(prompts)]
    for flag, name in (("--stop-at-eos", "eos.json"), ("--ignore-eos", "all.json")):
        result = runner.invoke(app, [*common, flag, "--json", str(tmp_path / name)], catch_exceptions=False)
        assert result.exit_code == 0, result.output
    eos = json.loads((tmp_path / "eos.json").read_text())
    full = json.loads((tmp_path / "all.json").read_text())
    assert len(eos["runs"]) == len(full["runs"]) == 2 * 2 * 2
    assert all(r["stop_reason"] == "eos" and r["n_generated"] < 40 for r in eos["runs"])
    assert eos["configs"][0]["short_runs"] == len(eos["runs"])
    assert all(r["stop_reason"] == "length" and r["n_generated"] == 40 for r in full["runs"])
    assert full["configs"][0]["short_runs"] == 0


def test_bench_command_errors_are_one_line(fixture_models, tmp_path) -> None:
    missing = bench_cli(fixture_models, tmp_path, "--prompts", str(tmp_path / "none.txt"))
    assert missing.exit_code == 2 and missing.stderr.startswith("specli: error: ")
    assert len(missing.stderr.strip().splitlines()) == 1
    bad_k = bench_cli(fixture_models, tmp_path, "-k", "0")
    assert bad_k.exit_code == 2 and "-k" in bad_k.stderr
    no_draft = runner.invoke(app, ["bench", "--target", str(fixture_models.target)])
    assert no_draft.exit_code == 2 and "give --draft" in no_draft.stderr


def completed_runs(terminal_output: bytes) -> int:
    """The last count of completed runs the progress display showed ("runs ━━━ 12/2000…")."""
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", terminal_output.decode("utf-8", errors="replace"))
    counts = re.findall(r"runs\s+\S+\s+(\d+)/", plain)
    return int(counts[-1]) if counts else 0


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_ctrl_c_stops_the_bench_with_exit_130_and_keeps_whole_pairs(fixture_models, tmp_path, signum) -> None:
    """SIGINT once the progress display shows a finished run: the completed pairs are reported and
    written, and the exit code is 130. SIGTERM (timeout, systemd, containers) the same, exit 143: it
    used to kill the bench with no report and no file. Stderr is a pseudo-terminal so that the
    progress is shown."""
    pty = pytest.importorskip("pty", reason="needs a POSIX pseudo-terminal")
    exe = shutil.which("specli") or str(Path(sys.executable).with_name("specli"))
    out_json, prompts = tmp_path / "r.json", tmp_path / "p.txt"
    prompts.write_text("Once upon a time a fox\n")
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [exe, "bench", "--target", str(fixture_models.target), "--draft", str(fixture_models.draft),
         "-t", "1", "-c", "256", "-k", "2", "--temp", "0", "-n", "32", "--repeat", "100000",
         "--prompts", str(prompts), "--json", str(out_json)],
        stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL, cwd=tmp_path, text=True)
    os.close(slave)
    seen = b""
    try:
        # Wait until the progress shows the third run done: the first pair was kept before its
        # second run's step was shown, so at least one whole pair is recorded. The timeout only
        # guards against a hang, it is not the synchronisation.
        deadline = time.monotonic() + 120
        while completed_runs(seen) < 3:
            assert time.monotonic() < deadline, f"no progress seen: {seen[-500:]!r}"
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                try:
                    seen += os.read(master, 65536)
                except OSError:  # the child closed the terminal: it ended early
                    break
            assert proc.poll() is None, f"bench ended before the interrupt: {seen[-500:]!r}"
        proc.send_signal(signum)
        stdout, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    assert proc.returncode == 128 + signum
    data = json.loads(out_json.read_text())
    assert data["interrupted"] is True
    assert len(data["runs"]) >= 2 and len(data["runs"]) % 2 == 0
    assert data["configs"][0]["pairs"] == len(data["runs"]) // 2
    assert "interrupted" in stdout


def test_first_difference() -> None:
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2
    assert first_difference([], []) is None
