"""Signals outside the generation loop, through the installed `specli` in a subprocess: Ctrl-C (SIGINT)
and SIGTERM while the models load, during the imports, during a reply of a piped chat, and SIGTERM
wherever Ctrl-C already stops cleanly. Every one ends with one last line on stderr and 128 + the
signal as exit code, after whatever finished was kept. Signals are sent after a marker the program
printed (or from inside the program at a chosen import), never after a delay."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
from support import EXE, PROMPT, TIMEOUT, _env

SIGNALS = [signal.SIGINT, signal.SIGTERM]
LAST_LINE = {signal.SIGINT: "specli: interrupted", signal.SIGTERM: "specli: terminated (SIGTERM)"}


def assert_ended_by(proc: subprocess.Popen | subprocess.CompletedProcess, err: str, signum: int) -> None:
    """Exit 128 + signal, one last line saying so, no traceback, no exception dropped in a callback."""
    assert proc.returncode == 128 + signum, (proc.returncode, err[-2000:])
    assert "Traceback" not in err and "Exception ignored" not in err, err[-2000:]
    assert err.rstrip("\n").splitlines()[-1] == LAST_LINE[signum], err[-2000:]


def _long_run(command: str, fixture_models) -> list[str]:
    """A command that outlasts any signal sent while it loads (1 thread, no EOS, a big context)."""
    target, draft = str(fixture_models.target), str(fixture_models.draft)
    if command == "run":
        return [EXE, "run", "-m", target, "-md", draft, PROMPT, "-n", "200000", "--ignore-eos", "-t", "1",
                "-c", "16384"]
    if command == "chat":
        return [EXE, "chat", "-m", target, "-md", draft, "-n", "200000", "-t", "1", "-c", "16384",
                "--no-history"]
    return [EXE, "bench", "-m", target, "-md", draft, "-n", "64", "--repeat", "100000", "-t", "1",
            "-k", "2", "--temp", "0"]


@pytest.mark.parametrize("signum", SIGNALS, ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("command", ["run", "chat", "bench"])
def test_a_signal_while_the_models_load_ends_the_command(fixture_models, tmp_path, command, signum) -> None:
    """The signal comes once llama.cpp has begun logging the load (--verbose: its log is the marker).
    It used to be raised inside the Python log callback, where ctypes printed "Exception ignored" and
    dropped it: the load went on and the command finished with exit 0."""
    proc = subprocess.Popen([*_long_run(command, fixture_models), "--verbose"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path, env=_env(tmp_path))
    try:
        if command == "chat":
            proc.stdin.write(b"Once upon a time\n")
            proc.stdin.flush()
        first = proc.stderr.readline()  # llama.cpp's first log line: the target is loading
        assert b"llama" in first, first
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert_ended_by(proc, err.decode("utf-8", "replace"), signum)


# Run inside the program: a signal to itself as the named module starts to import, as if Ctrl-C came in
# the first half second; then the console script's own entry point, as the installed `specli` runs it.
_IMPORT_SIGNAL = """
import importlib.abc, importlib.metadata, os, sys
MODULE, SIGNUM = sys.argv[1], int(sys.argv[2])
class SignalAtImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == MODULE:
            sys.meta_path.remove(self)
            os.kill(os.getpid(), SIGNUM)
        return None
sys.meta_path.insert(0, SignalAtImport())
sys.argv = ["specli", *sys.argv[3:]]
entry = importlib.metadata.entry_points(group="console_scripts", name="specli")
sys.exit(next(iter(entry)).load()())
"""


@pytest.mark.parametrize("signum", SIGNALS, ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("module", ["numpy", "llama_cpp", "typer", "rich.console", "jinja2"])
def test_a_signal_during_the_imports_is_one_line(fixture_models, tmp_path, module, signum) -> None:
    """Ctrl-C in the first half second printed Python's traceback from the middle of an import (and
    SIGTERM killed the process with no word): the handlers are installed before anything heavy."""
    args = ["chat", "-m", str(fixture_models.target), "--no-history"] if module == "jinja2" else \
        ["run", "-m", str(fixture_models.target), PROMPT, "-n", "4", "-t", "1"]
    proc = subprocess.run([sys.executable, "-c", _IMPORT_SIGNAL, module, str(int(signum)), *args],
                          capture_output=True, text=True, cwd=tmp_path, env=_env(tmp_path), timeout=TIMEOUT,
                          input="hello\n")
    assert_ended_by(proc, proc.stderr, signum)
    assert proc.stderr.strip() == LAST_LINE[signum]  # nothing else: the one line
    assert proc.stdout == ""


@pytest.mark.parametrize("signum", SIGNALS, ids=["SIGINT", "SIGTERM"])
def test_a_signal_during_a_piped_reply_ends_the_chat(fixture_models, tmp_path, signum) -> None:
    """Piped chat interrupted during a reply went on to the next line and exited 0: a script could not
    tell. The partial reply is kept on stdout, the next line is not answered, the code says why."""
    lines = tmp_path / "lines.txt"
    lines.write_text("Once upon a time\nThe bird was sad\n")
    with lines.open() as stdin:
        proc = subprocess.Popen(_long_run("chat", fixture_models), stdin=stdin, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, cwd=tmp_path, env=_env(tmp_path))
    try:
        first = proc.stdout.read(20)  # the reply streams: the marker
        proc.send_signal(signum)
        rest, err = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err_text = err.decode("utf-8", "replace")
    assert_ended_by(proc, err_text, signum)
    reply = (first + rest).decode("utf-8", "replace")
    assert len(first) == 20 and reply.count("\n") == 1  # one (partial) reply, the second line unanswered
    assert "interrupted" in err_text  # the reply's stats line


def test_sigterm_during_a_run_keeps_the_text_and_the_stats(fixture_models, tmp_path) -> None:
    """SIGTERM (timeout, systemd, a container runtime) stops `specli run` the way Ctrl-C does: the text
    so far on stdout, its stats on stderr, exit 143 (it used to die with no stats)."""
    proc = subprocess.Popen(_long_run("run", fixture_models), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=tmp_path, env=_env(tmp_path))
    try:
        first = proc.stdout.read(20)  # text has streamed: the marker
        proc.send_signal(signal.SIGTERM)
        rest, err = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err_text = err.decode("utf-8", "replace")
    assert_ended_by(proc, err_text, signal.SIGTERM)
    assert len(first) == 20 and "stop_reason: interrupted" in err_text
    assert int(err_text.split("generated_tokens:")[1].split()[0]) > 0
