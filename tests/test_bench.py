"""`specli bench` internals on the tiny fixture pair: structure and invariants, never speed."""

from __future__ import annotations

import csv
import json
import statistics

import pytest
from rich.console import Console

from specli.bench import (
    BUILTIN_PROMPTS,
    BenchConfig,
    BenchError,
    BenchPrompt,
    BenchResult,
    PromptFileError,
    Spread,
    VerifyCurve,
    VerifyPoint,
    bench_notes,
    iter_pairs,
    load_prompts,
    parse_k_list,
    parse_prompts,
    parse_temp_list,
    predicted_speedup,
    run_bench,
    write_csv,
    write_json,
)
from specli.errors import UsageProblem
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
    options = dict(target=fixture_models.target, draft=fixture_models.draft, ks=[1, 2], temps=[0.0, 1.0],
                   prompts=PROMPTS, max_tokens=16, repeat=2, n_ctx=256, n_threads=1, seed=7,
                   curve_repeats=2, warmup_tokens=4)
    options.update(kw)
    return BenchConfig(**options)


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


def test_speedups_are_paired_ratios_of_the_rates(bench) -> None:
    result, _ = bench
    for plain, spec in iter_pairs(result):
        assert plain.speedup is None
        assert spec.speedup == pytest.approx(spec.tokens_per_second / plain.tokens_per_second)
        assert plain.tokens_per_second == pytest.approx(plain.n_generated / plain.generation_seconds)
        assert plain.drafted == 0 and plain.rounds == plain.n_generated
    for c in result.configs:
        ratios = [s.speedup for p, s in iter_pairs(result) if s.temperature == c.temperature and s.k == c.k]
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
        # Greedy speculation reproduces plain greedy decoding exactly.
        if c.temperature == 0:
            assert c.greedy_mismatches == 0
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
    assert result.target.n_params > 0 and result.draft.n_vocab == result.target.n_vocab


def test_json_and_csv_hold_every_run(bench, tmp_path) -> None:
    result, _ = bench
    write_json(result, tmp_path / "b.json")
    write_csv(result, tmp_path / "b.csv")
    data = json.loads((tmp_path / "b.json").read_text())
    sections = {"machine", "models", "options", "timings", "verify_curve", "configs", "runs", "prompts"}
    assert sections <= set(data)
    assert data["options"]["ks"] == [1, 2] and data["options"]["repeat"] == 2
    assert data["machine"]["cpu_count"] and data["machine"]["llama_cpp_python"]
    assert data["models"]["target"]["file_bytes"] > 0
    assert [p["m"] for p in data["verify_curve"]["points"]] == [1, 2, 3]
    assert len(data["configs"]) == 4 and len(data["runs"]) == len(result.runs)
    assert data["configs"][0]["per_prompt"][0]["prompt"] == "story"
    with open(tmp_path / "b.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(result.runs)
    assert {"prompt", "repeat", "mode", "tokens_per_second", "acceptance_rate", "seq"} <= set(rows[0])
    assert rows[0]["mode"] in ("plain", "spec") and float(rows[0]["tokens_per_second"]) > 0


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


# -- other drafters, errors, interruption -----------------------------------------------------------------


def test_ngram_drafter_and_auto_k(fixture_models) -> None:
    result = run_bench(tiny_config(fixture_models, draft="ngram", ks=["auto"], temps=[0.0], repeat=1))
    assert result.draft is None and result.drafter == "ngram"
    assert result.curve.draft_ms_per_token is None
    # auto may draft up to AutoK's k_max, so the curve reaches k_max + 1.
    assert len(result.curve.points) == 13
    assert result.configs[0].pairs == len(PROMPTS)
    render_bench(result, Console(record=True, width=120))


def test_interrupted_bench_keeps_whole_pairs(fixture_models) -> None:
    progress = RecordingProgress(interrupt_after_runs=5)
    result = run_bench(tiny_config(fixture_models), progress=progress)
    assert result.interrupted
    assert len(result.runs) == 4  # the fifth run's pair was not complete
    assert result.configs[0].pairs == 2
    assert any("interrupted" in message for _, message in bench_notes(result))


def test_context_too_small_is_a_usage_problem(fixture_models) -> None:
    with pytest.raises(BenchError, match="raise --ctx"):
        run_bench(tiny_config(fixture_models, n_ctx=256, max_tokens=1000))


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
    assert predicted_speedup(curve, alpha, c, [2, 0, 2]) == pytest.approx(expected * 0.010 / cost)
    assert predicted_speedup(curve, None, None, [0, 0]) == pytest.approx(1.0)
    assert predicted_speedup(curve, None, None, [2]) is None
    assert predicted_speedup(curve, 0.5, c, []) is None
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
