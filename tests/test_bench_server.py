"""`specli bench --server` and `specli export --to llama-server` against a real llama-server.

The llama-server test starts the binary that lab/build_llama_tools.sh --with-server builds (from the
llama.cpp llama-cpp-python vendors) with exactly the flags `specli export` prints for the test pair, on
127.0.0.1 and a free port, and skips with a reason when the binary is absent (CI does not build it).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specli.bench.server import ServerTarget, parse_server, request_body, unique_names
from specli.bench.suite import BenchError
from specli.cli import app
from specli.settings import RunSettings

runner = CliRunner()


def _llama_server() -> Path | None:
    """The build script's llama-server ($SPECLI_LLAMA_TOOLS or ~/.cache/specli/llama-tools), else PATH.
    Found at import: the tests themselves run with an empty HOME."""
    cache = os.environ.get("SPECLI_LLAMA_TOOLS") or str(Path.home() / ".cache" / "specli" / "llama-tools")
    candidate = Path(cache).expanduser() / "bin" / "llama-server"
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return candidate
    found = shutil.which("llama-server")
    return Path(found) if found else None


LLAMA_SERVER = _llama_server()
needs_llama_server = pytest.mark.skipif(
    LLAMA_SERVER is None,
    reason="llama-server not built: run `bash lab/build_llama_tools.sh --with-server` (several minutes)",
)


def test_server_option_parsing() -> None:
    assert parse_server("http://127.0.0.1:8080") == ServerTarget("server-1", "http://127.0.0.1:8080")
    assert parse_server("llama=http://h:1/v1/", "k", 3) == ServerTarget("llama", "http://h:1", "k")
    assert parse_server("https://example.org/api/v1", index=2).url == "https://example.org/api"
    for bad in ("127.0.0.1:8080", "ftp://h", "x=", "=http://h:1", "http://h:port"):
        with pytest.raises(BenchError):
            parse_server(bad)
    with pytest.raises(BenchError, match="twice"):
        unique_names([parse_server("a=http://h:1"), parse_server("a=http://h:2")])


def test_request_uses_the_settings_request_names() -> None:
    settings = RunSettings(temp=0.5, top_k=7, top_p=0.9, min_p=0.0, max_tokens=12, seed=3, ignore_eos=True)
    body = request_body("hi", settings, 4)
    assert body == {"prompt": "hi", "stream": True, "temperature": 0.5, "top_k": 7, "top_p": 0.9,
                    "min_p": 0.0, "max_tokens": 12, "seed": 3, "ignore_eos": True, "speculative.p_min": 0.0,
                    "same_as_plain": True, "speculative.n_max": 4}
    assert "speculative.n_max" not in request_body("hi", settings, "auto")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_server_is_one_line_before_anything_loads(fixture_models, tmp_path) -> None:
    prompts = tmp_path / "p.txt"
    prompts.write_text("Once upon a time\n")
    url = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    result = runner.invoke(app, ["bench", "-m", str(fixture_models.target), "--draft", "ngram", "-k", "2",
                                 "--temp", "0", "-n", "4", "--repeat", "1", "--prompts", str(prompts),
                                 "--server", f"gone={url}"])
    assert result.exit_code == 1
    assert f"cannot reach server gone ({url})" in result.stderr and "Traceback" not in result.output
    bad = runner.invoke(app, ["bench", "-m", str(fixture_models.target), "--draft", "ngram",
                              "--server", "localhost:8080"])
    assert bad.exit_code == 2 and "--server" in bad.stderr


def _get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _wait_healthy(proc: subprocess.Popen, url: str, log: Path, *, seconds: float = 120.0) -> None:
    """Until GET /health answers 200: bounded in attempts and time; fails with the server's log."""
    deadline = time.monotonic() + seconds
    for _ in range(int(seconds * 4)):
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:]
            pytest.fail(f"llama-server exited with {proc.returncode}:\n{tail}")
        try:
            if _get(url + "/health")[0] == 200:
                return
        except OSError:
            pass  # not listening yet
        if time.monotonic() > deadline:
            break
        time.sleep(0.25)
    pytest.fail(f"llama-server did not become healthy in {seconds:.0f} s:\n"
                f"{log.read_text(errors='replace')[-3000:]}")


def stop_server(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after 20 s: a server the test started never outlives it."""
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=20)


@needs_llama_server
def test_llama_server_from_export_speculates_and_bench_reads_it(fixture_models, tmp_path) -> None:
    port = _free_port()
    pair = ("-m", str(fixture_models.target), "--draft", str(fixture_models.draft))
    same = ("-k", "4", "--temp", "0", "-c", "512", "-t", "1")  # one setting for both: as a user would
    exported = runner.invoke(app, ["export", "--to", "llama-server", "--json", *pair, *same,
                                   "--port", str(port)], catch_exceptions=False)
    assert exported.exit_code == 0, exported.output
    argv = json.loads(exported.stdout)["argv"]
    assert argv[0] == "llama-server" and argv[argv.index("--host") + 1] == "127.0.0.1"
    log = tmp_path / "llama-server.log"
    url = f"http://127.0.0.1:{port}"
    with log.open("wb") as out:
        proc = subprocess.Popen([str(LLAMA_SERVER), *argv[1:]], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        _wait_healthy(proc, url, log)
        request = urllib.request.Request(
            url + "/v1/completions", method="POST", headers={"Content-Type": "application/json"},
            data=json.dumps({"prompt": "Once upon a time", "max_tokens": 32, "temperature": 0}).encode())
        with urllib.request.urlopen(request, timeout=120) as r:
            reply = json.loads(r.read())
        assert reply["timings"]["draft_n"] > 0, reply["timings"]  # it speculates with the exported flags

        prompts = tmp_path / "prompts.txt"
        prompts.write_text("Once upon a time\nThe function returns\n")
        out_json = tmp_path / "bench.json"
        out_csv = tmp_path / "bench.csv"
        bench = runner.invoke(app, ["bench", *pair, *same, "-n", "24", "--repeat", "2",
                                    "--prompts", str(prompts), "--server", f"llama={url}",
                                    "--json", str(out_json), "--csv", str(out_csv)],
                              catch_exceptions=False)
        assert bench.exit_code == 0, bench.output
        assert "llama" in bench.stdout and "servers" in bench.stdout
        doc = json.loads(out_json.read_text())
        assert doc["servers"] == [{"name": "llama", "url": url}]
        runs = doc["server_runs"]
        assert len(runs) == 4 and all(r["server"] == "llama" for r in runs)
        assert all(r["n_generated"] == 24 and r["count_source"] == "timings" for r in runs)
        assert all(r["tokens_per_second"] > 0 and r["ttft_seconds"] > 0 for r in runs)
        assert all(r["vs_plain"] > 0 for r in runs)
        [figures] = doc["server_configs"]
        assert figures["drafted"] > 0 and 0 <= figures["accepted"] <= figures["drafted"]
        assert figures["tokens_per_second"]["median"] > 0
        assert figures["server_tokens_per_second"]["median"] > 0
        # server runs are interleaved with the local pairs: each after its pair
        local_seqs = sorted(r["seq"] for r in doc["runs"])
        assert [r["seq"] for r in runs] == [local_seqs[i] + 1 for i in (1, 3, 5, 7)]
        rows = out_csv.read_text().splitlines()
        assert len(rows) == 1 + 8 + 4 and sum(",server," in row for row in rows[1:]) == 4
    finally:
        stop_server(proc)


def test_bench_reads_a_specli_server(fixture_models, tmp_path) -> None:
    """`specli serve` reports llama-server's timings (draft_n, draft_n_accepted), so bench --server reads
    its speculation as it reads llama-server's."""
    from serve_support import ServerProcess

    pair = ("-m", str(fixture_models.target), "--draft", str(fixture_models.draft))
    with ServerProcess(*pair, "-k", "4", "-c", "512", "-t", "1", cwd=tmp_path) as server:
        server.ready()
        prompts = tmp_path / "prompts.txt"
        prompts.write_text("Once upon a time\n")
        out_json = tmp_path / "bench.json"
        bench = runner.invoke(app, ["bench", *pair, "-k", "4", "--temp", "0", "-c", "512", "-t", "1",
                                    "-n", "24", "--repeat", "2", "--prompts", str(prompts),
                                    "--server", f"specli={server.url}", "--json", str(out_json)],
                              catch_exceptions=False)
        assert bench.exit_code == 0, bench.output
        assert server.stop() == 0
    doc = json.loads(out_json.read_text())
    runs = doc["server_runs"]
    assert len(runs) == 2 and all(r["server"] == "specli" and r["n_generated"] == 24 for r in runs)
    assert all(r["tokens_per_second"] > 0 and r["ttft_seconds"] > 0 for r in runs)
    [figures] = doc["server_configs"]
    assert figures["drafted"] > 0 and 0 < figures["accepted"] <= figures["drafted"]
