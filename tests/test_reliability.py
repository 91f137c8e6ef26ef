"""Bad input, limits and interruption, through the installed `specli` in a subprocess.

A subprocess, because what these tests guard against includes llama.cpp aborting the whole process
on a malformed file: that must fail a test, not kill the test run.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import gguf
import llama_cpp
import numpy as np
import pytest
from support import write_gguf

from specli import GenerationParams, SamplingParams, TokenEvent, load

PROMPT = "Once upon a time"
EXE = shutil.which("specli") or str(Path(sys.executable).with_name("specli"))


def _env(cwd: Path) -> dict[str, str]:
    """No models.toml from the user's config dir."""
    env = {**os.environ, "XDG_CONFIG_HOME": str(cwd / "xdg")}
    env.pop("SPECLI_CONFIG", None)
    return env


def specli(
    *args: str, cwd: Path, input: str | None = None, timeout: float = 120
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [EXE, *args], capture_output=True, text=True, cwd=cwd, input=input, timeout=timeout, env=_env(cwd)
    )


def start_specli(*args: str, cwd: Path, stdin=None) -> subprocess.Popen:
    """`specli run` in the background, long enough to be interrupted: 1 thread, no EOS, a big context."""
    return subprocess.Popen(
        [EXE, "run", *args, "-c", "16384", "--ignore-eos", "-t", "1"],
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=cwd,
        env=_env(cwd),
    )


def assert_one_line_error(proc: subprocess.CompletedProcess, code: int, *fragments: str) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specli: error:"), proc.stderr
    for fragment in fragments:
        assert fragment in lines[0]


# -- model files that must never reach llama.cpp ----------------------------------------------------


def _bad_file(kind: str, tmp: Path, good: Path) -> Path:
    if kind == "missing":
        return tmp / "absent.gguf"
    if kind == "directory":
        (tmp / "dir.gguf").mkdir()
        return tmp / "dir.gguf"
    if kind == "not gguf":
        (tmp / "notes.gguf").write_text("hello, this is not a model\n")
        return tmp / "notes.gguf"
    if kind == "truncated":
        data = good.read_bytes()
        (tmp / "cut.gguf").write_bytes(data[: len(data) * 2 // 3])
        return tmp / "cut.gguf"
    if kind == "heads":
        return write_gguf(tmp / "heads.gguf", n_head=5, n_head_kv=5)
    if kind == "architecture":
        return write_gguf(tmp / "arch.gguf", arch="foo")
    raise AssertionError(kind)


@pytest.mark.parametrize(
    "kind, fragment",
    [
        ("missing", "no such file"),
        ("directory", "directory"),
        ("not gguf", "not a GGUF file"),
        ("truncated", "truncated"),
        ("heads", "does not divide"),
        ("architecture", "not supported"),
    ],
)
@pytest.mark.parametrize("role", ["target", "draft"])
def test_bad_model_files_are_refused_before_llama_cpp(fixture_models, tmp_path, kind, fragment, role) -> None:
    bad = _bad_file(kind, tmp_path, fixture_models.target)
    target, draft = (bad, fixture_models.draft) if role == "target" else (fixture_models.target, bad)
    proc = specli(
        "run", "--target", str(target), "--draft", str(draft), PROMPT, "-n", "4", "-t", "1", cwd=tmp_path
    )
    assert_one_line_error(proc, 1, fragment)


def test_different_vocabularies(fixture_models, tmp_path) -> None:
    proc = specli(
        "run",
        "--target",
        str(fixture_models.target),
        "--draft",
        str(fixture_models.other_vocab),
        PROMPT,
        "-t",
        "1",
        cwd=tmp_path,
    )
    assert_one_line_error(proc, 1, "cannot draft for", "token")


def test_draft_equal_to_target_is_allowed_with_a_notice(fixture_models, tmp_path) -> None:
    proc = specli(
        "run",
        "--target",
        str(fixture_models.target),
        "--draft",
        str(fixture_models.target),
        PROMPT,
        "-n",
        "8",
        "-k",
        "3",  # auto would rightly not draft with a draft as dear as the target
        "--temp",
        "0",
        "-t",
        "1",
        "--json",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "cannot be faster" in proc.stderr
    assert json.loads(proc.stdout)["stats"]["acceptance_rate"] == 1.0


def test_nan_logits_give_a_clear_error(fixture_models, tmp_path) -> None:
    poisoned = tmp_path / "nan.gguf"
    shutil.copy(fixture_models.target, poisoned)
    reader = gguf.GGUFReader(poisoned, "r+")
    output = next(t for t in reader.tensors if t.name == "output.weight")
    output.data[...] = np.nan
    del reader
    proc = specli("run", "--target", str(poisoned), PROMPT, "-n", "4", "-t", "1", cwd=tmp_path)
    assert_one_line_error(proc, 1, "NaN")


# -- prompts and context limits ---------------------------------------------------------------------


def test_empty_prompt(fixture_models, tmp_path) -> None:
    proc = specli("run", "--target", str(fixture_models.target), "-", cwd=tmp_path, input="\n  \n")
    assert_one_line_error(proc, 2, "prompt is empty")


def test_prompt_longer_than_the_context(fixture_models, tmp_path) -> None:
    proc = specli(
        "run",
        "--target",
        str(fixture_models.target),
        "-",
        "-c",
        "256",
        "-t",
        "1",
        cwd=tmp_path,
        input="once upon a time " * 400,
    )
    assert_one_line_error(proc, 2, "context holds", "--ctx")


def test_max_tokens_beyond_the_context_stops_with_a_notice(fixture_models, tmp_path) -> None:
    proc = specli(
        "run",
        "--target",
        str(fixture_models.target),
        "--draft",
        str(fixture_models.draft),
        PROMPT,
        "-n",
        "5000",
        "-c",
        "256",
        "--ignore-eos",
        "--temp",
        "0",
        "-t",
        "1",
        "--json",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["stats"]["stop_reason"] == "context"
    # Every evaluated position fits; the last token is sampled from the last position's logits and
    # never needs evaluating itself.
    assert out["prompt_tokens"] + len(out["tokens"]) == 256 + 1
    assert "context" in proc.stderr and "--ctx" in proc.stderr


@pytest.mark.parametrize("k", [3, 8])
def test_context_exhausted_mid_round_keeps_caches_consistent(fixture_models, k) -> None:
    greedy = SamplingParams(temperature=0.0)
    with load(fixture_models.target, None, n_ctx=256, n_threads=1) as plain:
        events = list(
            plain.generate(PROMPT, GenerationParams(max_tokens=1000, sampling=greedy, ignore_eos=True))
        )
        expected = [e.token for e in events if isinstance(e, TokenEvent)]
    with load(fixture_models.target, fixture_models.draft, n_ctx=256, n_threads=1) as spec:
        params = GenerationParams(max_tokens=1000, sampling=greedy, draft_max=k, ignore_eos=True)
        events = list(spec.generate(PROMPT, params))
        got = [e.token for e in events if isinstance(e, TokenEvent)]
        assert events[-1].stop_reason == "context"
        assert spec.target.tokens == spec.engine.context[:-1]
        assert len(spec.engine.context) <= spec.target.n_ctx + 1
        drafter_model = spec.drafter.model
        assert drafter_model.tokens == spec.engine.context[: drafter_model.n_past]
    assert got == expected


# -- options ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["--temp", "-0.5"],
        ["--top-p", "0"],
        ["--top-p", "1.01"],
        ["-k", "-1"],
        ["-t", "-1"],
        ["--min-p", "2"],
        ["-n", "0"],
    ],
)
def test_out_of_range_options_exit_2(fixture_models, tmp_path, args) -> None:
    proc = specli("run", "--target", str(fixture_models.target), PROMPT, *args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr


# -- interruption and closed pipes -------------------------------------------------------------------


@pytest.mark.parametrize("delay", [1.0, 2.0])
def test_ctrl_c_prints_stats_and_exits_130(fixture_models, tmp_path, delay) -> None:
    prompt_file = tmp_path / "prompt.txt"
    prompt_file.write_text((PROMPT + " ") * 1500)  # a long prompt: early signals land in its evaluation
    with prompt_file.open() as stdin:
        proc = start_specli(
            "--target",
            str(fixture_models.target),
            "--draft",
            str(fixture_models.draft),
            "-",
            "-n",
            "200000",
            "-k",
            "3",
            cwd=tmp_path,
            stdin=stdin,
        )
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert b"Traceback" not in err
    assert b"interrupted" in err


def test_interrupts_anywhere_leave_the_caches_consistent(fixture_models) -> None:
    """SIGINT at many points (prompt evaluation, drafting, verification, bookkeeping): the cache
    records stay true, and the next generation is still exactly the greedy one."""
    greedy = GenerationParams(max_tokens=40, sampling=SamplingParams(temperature=0.0), draft_max=3)
    long_prompt = (PROMPT + " ") * 60
    with load(fixture_models.target, None, n_ctx=2048, n_threads=1) as plain:
        expected = [e.token for e in plain.generate(PROMPT, greedy) if isinstance(e, TokenEvent)]
    rng = np.random.default_rng(0)
    interrupted = 0
    with load(fixture_models.target, fixture_models.draft, n_ctx=2048, n_threads=1) as spec:
        for _ in range(12):
            params = GenerationParams(
                max_tokens=400,
                sampling=SamplingParams(temperature=1.0),
                draft_max=3,
                ignore_eos=True,
                seed=int(rng.integers(1000)),
            )
            timer = threading.Timer(float(rng.uniform(0.001, 0.05)), os.kill, (os.getpid(), signal.SIGINT))
            try:
                try:
                    timer.start()  # inside the try: a short timer can fire before start() returns
                    for _ in spec.generate(long_prompt, params):
                        pass
                finally:
                    timer.cancel()
                    timer.join()
                    time.sleep(0.01)  # a signal already sent is delivered here, inside the try
            except KeyboardInterrupt:
                interrupted += 1
            for model in (spec.target, spec.drafter.model):
                assert llama_cpp.llama_memory_seq_pos_max(model._mem, 0) + 1 == model.n_past
            got = [e.token for e in spec.generate(PROMPT, greedy) if isinstance(e, TokenEvent)]
            assert got == expected
    assert interrupted > 0


def test_ctrl_c_keeps_what_was_streamed(fixture_models, tmp_path) -> None:
    proc = start_specli(
        "--target",
        str(fixture_models.target),
        "--draft",
        str(fixture_models.draft),
        PROMPT,
        "-n",
        "200000",
        cwd=tmp_path,
    )
    first = proc.stdout.read(20)  # text has streamed
    proc.send_signal(signal.SIGINT)
    rest, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert len(first) == 20 and b"generated_tokens:" in err
    generated = int(err.split(b"generated_tokens:")[1].split()[0])
    assert generated > 0


def test_closed_stdout_ends_quietly(fixture_models, tmp_path) -> None:
    proc = start_specli("--target", str(fixture_models.target), PROMPT, "-n", "5000", cwd=tmp_path)
    proc.stdout.read(5)
    proc.stdout.close()  # like `specli run ... | head -c 5`
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 0
    assert b"Traceback" not in err and b"error" not in err


# -- resources -------------------------------------------------------------------------------------


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="needs /proc (Linux)")
def test_memory_is_flat_across_generations(fixture_models) -> None:
    params = GenerationParams(
        max_tokens=1500, sampling=SamplingParams(temperature=1.0), seed=1, draft_max=3, ignore_eos=True
    )
    with load(fixture_models.target, fixture_models.draft, n_ctx=2048, n_threads=1) as spec:
        for _ in spec.generate(PROMPT, params):
            pass
        baseline = _rss_bytes()
        for seed in range(3):
            for _ in spec.generate(PROMPT, GenerationParams(**{**params.__dict__, "seed": seed})):
                pass
        grown = _rss_bytes() - baseline
    assert grown < 8 * 2**20, f"resident memory grew by {grown / 2**20:.1f} MiB over 3 generations"
