"""The CLI through typer's CliRunner, and one subprocess run of the installed `specli`."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specli.cli import app

runner = CliRunner()
PROMPT = "Once upon a time"


def invoke(*args: str, input: str | None = None):
    return runner.invoke(app, list(args), input=input, catch_exceptions=False)


# One thread: the fixture models are tiny, and llama.cpp's thread handoff costs more than it saves.
T1 = ("-t", "1")


@pytest.fixture()
def in_empty_dir(tmp_path, monkeypatch):
    """Run where no models.toml is found, so only paths resolve."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("SPECLI_CONFIG", raising=False)
    return tmp_path


def run_json(fixture_models, *extra: str) -> dict:
    result = invoke("run", "--target", str(fixture_models.target), PROMPT, "-n", "24", "--json", *T1, *extra)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_run_json_greedy_equals_no_draft(fixture_models, in_empty_dir) -> None:
    plain = run_json(fixture_models, "--temp", "0", "--no-draft")
    spec = run_json(fixture_models, "--temp", "0", "--draft", str(fixture_models.draft), "-k", "3")
    assert spec["tokens"] == plain["tokens"] and spec["text"] == plain["text"]
    assert len(spec["tokens"]) == spec["stats"]["generated_tokens"] <= 24
    assert spec["stats"]["drafted"] > 0 and plain["stats"]["drafted"] == 0
    for key in (
        "acceptance_rate",
        "tokens_per_round",
        "accepted_per_round_histogram",
        "draft_ms_per_token",
        "verify_ms_per_round",
        "prompt_seconds",
        "tokens_per_second",
        "predicted_speedup",
    ):
        assert key in spec["stats"]


def test_run_seed_is_reproducible(fixture_models, in_empty_dir) -> None:
    a = run_json(fixture_models, "--temp", "1", "-s", "7", "--draft", str(fixture_models.draft))
    b = run_json(fixture_models, "--temp", "1", "-s", "7", "--draft", str(fixture_models.draft))
    assert a["tokens"] == b["tokens"] and a["seed"] == 7


def test_run_prompt_from_stdin_and_plain_output(fixture_models, in_empty_dir) -> None:
    result = runner.invoke(
        app, ["run", "--target", str(fixture_models.target), "-", "-n", "8", "--temp", "0", *T1], input=PROMPT
    )
    assert result.exit_code == 0
    assert "generated_tokens: 8" in result.stderr
    assert result.stdout.strip()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--temp", "-1"], "--temp"),
        (["--top-p", "1.5"], "--top-p"),
        (["-k", "-1"], "draft-max"),
        (["-k", "lots"], "draft-max"),
        (["-t", "-2"], "--threads"),
    ],
)
def test_out_of_range_options_are_usage_errors(fixture_models, in_empty_dir, args, message) -> None:
    result = runner.invoke(app, ["run", "--target", str(fixture_models.target), PROMPT, *args])
    assert result.exit_code == 2
    assert message in result.output


def test_bad_inputs_give_one_line_errors(fixture_models, in_empty_dir) -> None:
    empty = runner.invoke(app, ["run", "--target", str(fixture_models.target), "  "])
    assert empty.exit_code == 2 and "prompt is empty" in empty.stderr
    missing = runner.invoke(app, ["run", "--target", "nope.gguf", PROMPT])
    assert missing.exit_code == 1 and "Traceback" not in missing.output
    assert len(missing.stderr.strip().splitlines()) == 1
    mismatch = runner.invoke(
        app,
        ["run", "--target", str(fixture_models.target), "--draft", str(fixture_models.other_vocab), PROMPT],
    )
    assert mismatch.exit_code == 1 and "cannot draft for" in mismatch.stderr


def test_stop_string_is_not_shown(fixture_models, in_empty_dir) -> None:
    full = run_json(fixture_models, "--temp", "0")
    stop = full["text"][6:9]
    stopped = run_json(fixture_models, "--temp", "0", "--stop", stop, "--draft", str(fixture_models.draft))
    assert stopped["text"] == full["text"][: full["text"].index(stop)]
    assert stopped["stats"]["stop_reason"] == "stop"


def test_models_toml_names_and_settings(fixture_models, in_empty_dir) -> None:
    (in_empty_dir / "models.toml").write_text(
        f'[models.tiny]\npath = "{fixture_models.target}"\ndraft = "tinydraft"\ntemp = 0.0\nmax_tokens = 5\n'
        f'[models.tinydraft]\npath = "{fixture_models.draft}"\n'
    )
    result = invoke("run", "-m", "tiny", PROMPT, "--json", *T1)
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["stats"]["generated_tokens"] == 5  # max_tokens from the file
    # the draft named in the file did work (auto may only make shadow proposals in 5 tokens)
    assert out["stats"]["draft_seconds"] > 0
    override = json.loads(invoke("run", "-m", "tiny", PROMPT, "--json", "-n", "3", *T1).stdout)
    assert override["stats"]["generated_tokens"] == 3  # the flag wins
    listing = invoke("models")
    assert "tiny" in listing.stdout and "present" in listing.stdout
    check = invoke("models", "check", "tiny", "tinydraft")
    assert check.exit_code == 0 and "compatible" in check.stdout


def test_installed_console_script_runs(fixture_models, tmp_path) -> None:
    exe = shutil.which("specli") or str(Path(sys.executable).with_name("specli"))
    proc = subprocess.run(
        [
            exe,
            "run",
            "--target",
            str(fixture_models.target),
            "--draft",
            str(fixture_models.draft),
            PROMPT,
            "-n",
            "12",
            "--temp",
            "0",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["stats"]["generated_tokens"] == len(out["tokens"]) > 0
