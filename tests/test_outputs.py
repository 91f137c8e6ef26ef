"""Where results go, through the installed `specli` in a subprocess: output files land where the user
pointed (through links, into our own stdout, never by replacing a link or a device), two outputs that
are one file are refused before any work, and the output mode follows what stdout really is (a file
gets plain text whatever FORCE_COLOR says; a terminal without colours still tells rejected drafts from
the text; a closed stdout is said up front). Symbolic links to stdout are made here, in a temporary
directory: the system's /dev/stdout is never written by path."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from support import EXE, PROMPT, TIMEOUT, _env, assert_one_line_error, specli, specli_on_terminal

ESC = "\x1b"


def _bench_args(fixture_models, *args: str) -> list[str]:
    return ["bench", "--target", str(fixture_models.target), "--draft", str(fixture_models.draft),
            "-n", "3", "--repeat", "1", "-k", "1", "--temp", "0", "-t", "1", *args]


def _run_into(argv: list[str], cwd: Path, stdout_file: Path, env: dict[str, str] | None = None
              ) -> subprocess.CompletedProcess:
    """The command with stdout redirected to `stdout_file` (as `> file`), stderr captured."""
    with stdout_file.open("wb") as out:
        proc = subprocess.run([EXE, *argv], stdout=out, stderr=subprocess.PIPE, cwd=cwd,
                              env={**_env(cwd), **(env or {})}, timeout=TIMEOUT, stdin=subprocess.DEVNULL)
    proc.stderr = proc.stderr.decode("utf-8", "replace")
    return proc


# -- output files --------------------------------------------------------------------------------------


def test_bench_files_are_written_through_links(fixture_models, tmp_path) -> None:
    """A link to a file: the file gets the results, the link stays a link (it used to be replaced by a
    regular file, the real target left stale). A dangling link: its target is created. A file with two
    hard links: both names see the results."""
    real = tmp_path / "real"
    real.mkdir()
    (real / "r.json").write_text("old")
    (tmp_path / "link.json").symlink_to(real / "r.json")
    (tmp_path / "dangling.csv").symlink_to(real / "new.csv")
    (real / "h.json").write_text("old")
    os.link(real / "h.json", tmp_path / "hard.json")
    for args, files in ((["--json", "link.json", "--csv", "dangling.csv"], ["r.json", "new.csv"]),
                        (["--json", "hard.json"], ["h.json"])):
        proc = specli(*_bench_args(fixture_models, *args), cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        for name in files:
            assert (real / name).read_text().startswith(("{", "seq,")), name
    assert (tmp_path / "link.json").is_symlink() and (tmp_path / "dangling.csv").is_symlink()
    assert json.loads((tmp_path / "link.json").read_text())["runs"]
    assert json.loads((tmp_path / "hard.json").read_text()) == json.loads((real / "h.json").read_text())
    assert not [p for p in tmp_path.rglob(".*") if p.is_file()]  # no temporary file left


@pytest.mark.skipif(not Path("/proc/self/fd/1").exists(), reason="needs /proc/self/fd")
def test_bench_json_to_its_own_stdout_follows_the_report(fixture_models, tmp_path) -> None:
    """`--json` naming the process's own stdout (here: our own link to /proc/self/fd/1, as /dev/stdout
    is on Linux) while stdout goes to a file: the report, then the JSON, both in that file, and the
    link still a link (as root it was replaced by a regular file holding the JSON, and the file the
    user redirected to never got it)."""
    link = tmp_path / "my-stdout"
    link.symlink_to("/proc/self/fd/1")
    captured = tmp_path / "captured.txt"
    proc = _run_into(_bench_args(fixture_models, "--json", str(link)), tmp_path, captured)
    assert proc.returncode == 0, proc.stderr
    assert link.is_symlink() and os.readlink(link) == "/proc/self/fd/1"
    text = captured.read_text()
    report, _, document = text.partition("\n{")
    assert "speedup" in report
    assert json.loads("{" + document)["runs"]
    # The same through a pipe: stdout is a pipe, the link names it.
    piped = specli(*_bench_args(fixture_models, "--json", str(link)), cwd=tmp_path)
    assert piped.returncode == 0, piped.stderr
    assert json.loads("{" + piped.stdout.partition("\n{")[2])["runs"]


def test_chat_save_writes_through_a_link(fixture_models, tmp_path) -> None:
    (tmp_path / "real.json").write_text("old")
    (tmp_path / "t.json").symlink_to(tmp_path / "real.json")
    proc = specli("chat", "--target", str(fixture_models.target), "--no-history", "-n", "4", "-t", "1",
                  cwd=tmp_path, input="Once upon a time\n/save t.json\n")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "t.json").is_symlink()
    assert json.loads((tmp_path / "real.json").read_text())["format"] == "specli-chat"


@pytest.mark.parametrize("case", ["same path", "spelled twice", "link", "hard link", "own stdout",
                                  "the target", "the draft", "the prompts"])
def test_outputs_that_are_one_file_are_refused_before_any_work(fixture_models, tmp_path, case) -> None:
    """--json and --csv given one file: the CSV silently replaced the JSON. An output that is an input
    (a model, the prompts) would be destroyed. Refused (exit 2) before anything is measured."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.out").write_text("keep")
    (tmp_path / "ln.out").symlink_to(tmp_path / "a.out")
    os.link(tmp_path / "a.out", tmp_path / "hard.out")
    (tmp_path / "my-stdout").symlink_to("/proc/self/fd/1")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Once upon a time\n")
    args = {
        "same path": ["--json", "a.out", "--csv", "a.out"],
        "spelled twice": ["--json", "a.out", "--csv", "sub/../a.out"],
        "link": ["--json", "ln.out", "--csv", "a.out"],
        "hard link": ["--json", "hard.out", "--csv", "a.out"],
        "own stdout": ["--json", "my-stdout", "--csv", "/proc/self/fd/1"],
        "the target": ["--json", str(fixture_models.target)],
        "the draft": ["--csv", str(fixture_models.draft)],
        "the prompts": ["--prompts", str(prompts), "--csv", str(prompts)],
    }[case]
    if case == "own stdout" and not Path("/proc/self/fd/1").exists():
        pytest.skip("needs /proc/self/fd")
    before = fixture_models.target.stat().st_mtime_ns, fixture_models.draft.stat().st_mtime_ns
    proc = specli(*_bench_args(fixture_models, *args), cwd=tmp_path)
    assert_one_line_error(proc, 2)
    assert "same file" in proc.stderr or "would destroy it" in proc.stderr
    assert proc.stdout == ""  # refused before any measuring
    assert (tmp_path / "a.out").read_text() == "keep" and prompts.read_text() == "Once upon a time\n"
    assert (fixture_models.target.stat().st_mtime_ns, fixture_models.draft.stat().st_mtime_ns) == before


# -- output modes -------------------------------------------------------------------------------------


@pytest.mark.parametrize("forcing", [{"FORCE_COLOR": "1"}, {"TTY_COMPATIBLE": "1", "TTY_INTERACTIVE": "1"}],
                         ids=["FORCE_COLOR", "TTY_COMPATIBLE"])
def test_a_redirected_stdout_gets_plain_text_whatever_the_environment_forces(fixture_models, tmp_path,
                                                                             forcing) -> None:
    """With FORCE_COLOR=1 (common in CI) and stdout redirected, the legend, the prompt, ANSI codes and
    the stats panel all went to stdout. Not a terminal: the text alone on stdout, stats on stderr."""
    common = ["--target", str(fixture_models.target), "-n", "12", "--temp", "0", "-t", "1"]
    reference = specli("run", *common, PROMPT, "--json", cwd=tmp_path)
    text = json.loads(reference.stdout)["text"]
    out = tmp_path / "out.txt"
    proc = _run_into(["run", *common, "--draft", str(fixture_models.draft), "--show-rejected", PROMPT],
                     tmp_path, out, forcing)
    assert proc.returncode == 0, proc.stderr
    assert out.read_text() == text + "\n"
    assert "generated_tokens: 12" in proc.stderr and ESC not in proc.stderr
    for argv in (["chat", *common, "--draft", str(fixture_models.draft), "--no-history"],
                 _bench_args(fixture_models), ["models", "--config", str(tmp_path / "m.toml")]):
        (tmp_path / "m.toml").write_text(f'[models.t]\npath = "{fixture_models.target}"\n')
        with (tmp_path / "in.txt").open("w") as f:
            f.write("Once upon a time\n")
        with (tmp_path / "in.txt").open() as stdin, out.open("wb") as stdout:
            proc = subprocess.run([EXE, *argv], stdin=stdin, stdout=stdout, stderr=subprocess.PIPE,
                                  cwd=tmp_path, env={**_env(tmp_path), **forcing}, timeout=TIMEOUT)
        assert proc.returncode == 0, proc.stderr
        assert ESC not in out.read_text() and ESC.encode() not in proc.stderr, argv[0]
        if argv[0] == "chat":
            assert out.read_text().count("\n") == 1  # the reply alone


@pytest.mark.parametrize("env", [{"TERM": "dumb"}, {"NO_COLOR": "1"}], ids=["TERM=dumb", "NO_COLOR"])
def test_a_terminal_without_colours_marks_rejected_drafts(fixture_models, tmp_path, env) -> None:
    """Under TERM=dumb, --show-rejected printed rejected tokens unmarked inside the text, so the text on
    screen was not the output. They are bracketed [-like this-]: removing the brackets and what they
    hold leaves exactly the prompt and the generated text."""
    common = ["--target", str(fixture_models.target), "--draft", str(fixture_models.draft), PROMPT,
              "-n", "24", "--temp", "0", "-k", "4", "-t", "1"]
    reference = json.loads(specli("run", *common, "--json", cwd=tmp_path).stdout)
    assert reference["stats"]["drafted"] > reference["stats"]["accepted"]  # something was rejected
    rc, out, err = specli_on_terminal("run", *common, "--show-rejected", cwd=tmp_path, env=env)
    assert rc == 0, err
    screen = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out).replace("\r", "")
    assert "[-" in screen  # the legend says so, and the rejected drafts are marked
    body = screen.split("\n", 1)[1]  # after the legend line
    shown = re.sub(r"\[-.*?-\]", "", body, flags=re.S)
    assert shown.startswith(PROMPT + reference["text"] + "\n"), (shown[:200], reference["text"])


@pytest.mark.parametrize("how", ["closed", "read-only"])
@pytest.mark.parametrize("command", ["run", "chat", "bench", "models"])
def test_a_closed_stdout_is_said_up_front(fixture_models, tmp_path, command, how) -> None:
    """`specli run … >&-` ended in a rich traceback after the work; chat dropped every reply and exited
    0. One line and exit 1, before anything is loaded."""
    argv = {
        "run": ["run", "--target", str(fixture_models.target), PROMPT, "-n", "4", "-t", "1"],
        "chat": ["chat", "--target", str(fixture_models.target), "--no-history", "-n", "4", "-t", "1"],
        "bench": _bench_args(fixture_models),
        "models": ["models", "--config", str(tmp_path / "m.toml")],
    }[command]
    (tmp_path / "m.toml").write_text(f'[models.t]\npath = "{fixture_models.target}"\n')
    redirect = ">&-" if how == "closed" else f"1<{fixture_models.target}"
    proc = subprocess.run(["sh", "-c", f'exec "$0" "$@" {redirect}', EXE, *argv], input=b"hello\n",
                          stderr=subprocess.PIPE, cwd=tmp_path, env=_env(tmp_path), timeout=TIMEOUT)
    proc.stdout, proc.stderr = "", proc.stderr.decode("utf-8", "replace")
    assert_one_line_error(proc, 1, "standard output", "nowhere to write the output")
