"""`specli serve` under hostile traffic: idle and slow connections, other hosts and origins, non-JSON bodies,
malformed HTTP, cancelled and interrupted prompt evaluations, shutdown with requests half-sent, and huge
prompts. Real sockets and real clients against a real server process on 127.0.0.1; every wait bounded.
"""

from __future__ import annotations

import json
import resource
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from serve_support import (
    CLOSE_WITHIN,
    PeakRss,
    ServerProcess,
    assert_healthy,
    open_socket,
    read_to_close,
    request_bytes,
    response_of,
    trickling,
    wait_until,
)

import specli
from specli.settings import defaults_for

PROMPT = "Once upon a time"
# About 24,000 tokens of the fixture vocabulary: seconds of prompt evaluation on one thread.
LONG_PROMPT = "Once upon a time there was a dog. " * 2700


@pytest.fixture(scope="module")
def server(fixture_models, tmp_path_factory):
    """The fixture target, one thread, a long context, and a read timeout of 1 s."""
    with ServerProcess("--target", str(fixture_models.target_with_template), "--no-draft", "-t", "1", "-c",
                       "32768", "--read-timeout", "1", cwd=tmp_path_factory.mktemp("hostile")) as process:
        yield process.ready()
        assert process.stop() == 0


# -- idle, slow and stalled connections -----------------------------------------------------------------


def test_idle_trickling_and_stalled_connections_are_closed(server) -> None:
    silent = [open_socket(server) for _ in range(20)]
    trickling_sockets = [open_socket(server) for _ in range(10)]
    stalled = [open_socket(server) for _ in range(10)]
    for sock in stalled:  # a head that promises 100 bytes of body, and 10 of them
        sock.sendall(request_bytes(server, "POST", "/v1/completions", b"", Content_Type="application/json")
                     .replace(b"Content-Length: 0", b"Content-Length: 100") + b'{"prompt":')
    # One byte of a request head every 0.2 s: bytes that keep coming must not keep the connection.
    head = request_bytes(server, "GET", "/health")
    try:
        with trickling(trickling_sockets, lambda i: head[i : i + 1], 0.2, len(head)):
            for sock in silent + trickling_sockets:
                assert read_to_close(sock, CLOSE_WITHIN) == b""  # closed, nothing answered: no request came
            for sock in stalled:
                status, headers, body = response_of(read_to_close(sock, CLOSE_WITHIN))
                assert status == 408 and headers["content-type"] == "application/json"
                assert json.loads(body)["error"]["code"] == "request_timeout"
    finally:
        for sock in silent + trickling_sockets + stalled:
            sock.close()
    assert_healthy(server)


def test_a_thousand_idle_sockets_at_a_low_descriptor_limit(fixture_models, tmp_path) -> None:
    """With 256 descriptors the server keeps ~190 connections: new ones close the longest-idle ones, so
    /health is answered while a thousand sockets that send nothing come and stay, and the log stays short."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the test process itself may open only {hard} files")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200) if hard == resource.RLIM_INFINITY
                                                else min(hard, max(soft, 1200)), hard))

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

    with ServerProcess("--target", str(fixture_models.target), "--no-draft", "-t", "1", cwd=tmp_path,
                       preexec_fn=low_limit) as server:
        server.ready()
        idle = []
        try:
            for _ in range(1000):
                idle.append(open_socket(server))
            time.sleep(0.5)  # the server has accepted them all by now
            assert_healthy(server)
            reply = server.client().post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 3})
            assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 3
        finally:
            for sock in idle:
                sock.close()
        assert server.stop() == 0
    assert "Too many open files" not in server.stderr
    assert len(server.lines) < 30, server.stderr


# -- hosts, origins and bodies ---------------------------------------------------------------------------


def test_other_hosts_origins_and_non_json_bodies_are_refused(server) -> None:
    host, port = server.address
    own = f"http://{host}:{port}"
    body = {"prompt": PROMPT, "max_tokens": 2}
    with server.client() as http:
        for name in ("evil.example", f"evil.example:{port}", "attacker.localhost.evil.example"):
            for method, path in (("GET", "/v1/models"), ("POST", "/v1/completions"),
                                 ("GET", "/specli/props")):
                refused = http.request(method, path, json=body, headers={"Host": name})
                assert refused.status_code == 403, (name, method, path)
                assert refused.json()["error"]["code"] == "host_not_allowed"
        for name in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", f"app.localhost:{port}"):
            assert http.get("/v1/models", headers={"Host": name}).status_code == 200, name
        for origin in ("http://evil.example", "null", f"https://{host}:{port}", "http://localhost:1"):
            refused = http.post("/v1/completions", json=body, headers={"Origin": origin})
            assert refused.status_code == 403 and refused.json()["error"]["code"] == "origin_not_allowed"
        assert http.post("/v1/completions", json=body, headers={"Origin": own}).status_code == 200
        # Bodies a page could send without a CORS preflight, and no Content-Type at all.
        for kind in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
                     None):
            headers = {"Content-Type": kind} if kind else {}
            refused = http.post("/v1/completions", content=json.dumps(body).encode(), headers=headers)
            assert refused.status_code == 415, kind
            assert refused.json()["error"]["code"] == "unsupported_media_type"
        ok = http.post("/v1/completions", content=json.dumps(body).encode(),
                       headers={"Content-Type": "application/json; charset=utf-8"})
        assert ok.status_code == 200
        # A trailing slash is served, not redirected (a redirect's Location came from the Host header).
        slashed = http.get("/v1/models/")
        assert slashed.status_code == 200 and slashed.json()["data"][0]["object"] == "model"
        long_url = http.get("/nothing/" + "x" * 10_000)
        assert long_url.status_code == 404 and len(long_url.text) < 400


def test_allowed_origins_get_cors_and_allowed_hosts_are_answered(fixture_models, tmp_path) -> None:
    app = "http://app.example:3000"
    with ServerProcess("--target", str(fixture_models.target), "--no-draft", "-t", "1", "--allow-origin", app,
                       "--allow-host", "box.example", cwd=tmp_path) as server:
        server.ready()
        with server.client() as http:
            preflight = http.options("/v1/completions", headers={
                "Origin": app, "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "content-type,authorization"})
            assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == app
            reply = http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2},
                              headers={"Origin": app})
            assert reply.status_code == 200 and reply.headers["access-control-allow-origin"] == app
            other = http.post("/v1/completions", json={"prompt": PROMPT}, headers={"Origin": "http://x.example"})
            assert other.status_code == 403 and "access-control-allow-origin" not in other.headers
            assert http.get("/v1/models", headers={"Host": "box.example:8080"}).status_code == 200
            assert http.get("/v1/models", headers={"Host": "other.example"}).status_code == 403
        assert server.stop() == 0


def test_malformed_http_is_answered_in_openais_shape(server) -> None:
    host, port = server.address
    cases = {
        "a 1 MB header": f"GET /health HTTP/1.1\r\nHost: {host}\r\nX-Big: {'a' * 1_000_000}\r\n\r\n".encode(),
        "a bad Content-Length": (f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\n"
                                 "Content-Length: abc\r\n\r\n").encode(),
        "a NUL in a header": f"GET /health HTTP/1.1\r\nHost: {host}\r\nX-A: a\0b\r\n\r\n".encode(),
    }
    for what, raw in cases.items():
        with open_socket(server) as sock:
            try:
                sock.sendall(raw)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the server answered and closed before the rest was sent
            status, headers, body = response_of(read_to_close(sock, CLOSE_WITHIN))
        assert status == 400 and headers["content-type"] == "application/json", what
        assert json.loads(body)["error"]["code"] == "invalid_http_request", what
        assert len(body) < 400, what
    # A long URL that arrives whole is parsed, and answered without being echoed.
    with open_socket(server) as sock:
        sock.sendall(f"GET /{'x' * 100_000} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        status, headers, body = response_of(read_to_close(sock, CLOSE_WITHIN))
    assert status in (400, 404) and headers["content-type"] == "application/json" and len(body) < 400
    assert_healthy(server)


# -- cancelled and interrupted prompts ------------------------------------------------------------------


def _start_long_stream(server: ServerProcess, chunks: list, ready: threading.Event) -> threading.Thread:
    """A streamed chat completion of LONG_PROMPT on a thread; its chunks go to `chunks`."""

    def run() -> None:
        try:
            with server.client() as http, http.stream("POST", "/v1/chat/completions", json={
                    "messages": [{"role": "user", "content": LONG_PROMPT}], "max_tokens": 8,
                    "stream": True}) as response:
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        chunks.append(line[6:])
                        ready.set()
        except httpx.HTTPError as e:
            chunks.append(e)
        finally:
            ready.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_cancel_and_disconnect_stop_a_long_prompts_evaluation(server) -> None:
    # Cancelled through the route (the page's stop button), by its id from the stream's first chunk.
    start = len(server.lines)
    chunks: list = []
    first = threading.Event()
    streaming = _start_long_stream(server, chunks, first)
    assert first.wait(60)
    job_id = json.loads(chunks[0])["id"]
    with server.client() as http:
        wait_until(lambda: http.get("/health").json()["generating"], "the long prompt is being evaluated")
        assert http.post(f"/specli/cancel/{job_id}").status_code == 200
        server.wait_for(rf"{job_id}: cancelled while its prompt of \d+ tokens was evaluated", 30, start)
        reply = http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 3})
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 3
    streaming.join(30)
    assert chunks[-1] == "[DONE]"
    # A client that leaves while its prompt is evaluated.
    start = len(server.lines)
    with server.client() as http, http.stream("POST", "/v1/completions", json={
            "prompt": LONG_PROMPT, "max_tokens": 8, "stream": True}):
        wait_until(lambda: server.client().get("/health").json()["generating"], "the long prompt runs")
    server.wait_for(r"cmpl-\w+: client gone while its prompt of \d+ tokens was evaluated", 30, start)
    assert_healthy(server)


def test_a_stop_signal_during_a_long_prompt_ends_it_cleanly(fixture_models, tmp_path) -> None:
    with ServerProcess("--target", str(fixture_models.target_with_template), "--no-draft", "-t", "1", "-c",
                       "32768", cwd=tmp_path) as server:
        server.ready()
        chunks: list = []
        first = threading.Event()
        streaming = _start_long_stream(server, chunks, first)
        assert first.wait(60)
        wait_until(lambda: server.client().get("/health").json()["generating"], "the long prompt runs")
        half_sent = [open_socket(server) for _ in range(20)]
        for sock in half_sent:
            sock.sendall(request_bytes(server, "POST", "/v1/completions", Content_Type="application/json")
                         .replace(b"Content-Length: 0", b"Content-Length: 1000") + b'{"prompt": "a')
        started = time.monotonic()
        assert server.stop(signal.SIGTERM) == 0
        assert time.monotonic() - started < 15
        streaming.join(30)
        assert chunks[-1] == "[DONE]", chunks
        error = json.loads(chunks[-2])["error"]
        assert error["code"] == "unavailable" and "stopping" in error["message"]
        for sock in half_sent:
            raw = read_to_close(sock, 10)
            if raw:  # answered before it closed: in OpenAI's shape
                status, _, body = response_of(raw)
                assert status == 503 and json.loads(body)["error"]["code"] == "unavailable"
            sock.close()
    assert "Traceback" not in server.stderr and "Event loop is closed" not in server.stderr, server.stderr
    assert "CancelledError" not in server.stderr and "ready:" in server.stderr
    assert server.lines[-1] == "specli: stopped (1 generations served)", server.stderr


def test_a_stop_signal_while_loading_never_says_ready(fixture_models) -> None:
    """In process: the load is held back until the stop has come; then nothing is served."""
    from specli.serve.app import ServeOptions, Service

    release = threading.Event()
    ready: list = []

    def load():
        assert release.wait(60)
        return specli.load(fixture_models.target, n_ctx=256, n_threads=1)

    service = Service(defaults_for("serve"), ServeOptions("tiny"), load, log=lambda line: None)
    service.on_ready = ready.append
    service.worker.start()
    service.worker.stop()
    release.set()
    assert service.worker.close(timeout=60)
    assert ready == [] and service.worker.state == "stopped" and service.worker.spec is None


# -- big prompts ----------------------------------------------------------------------------------------


def test_huge_prompts_are_refused_from_their_size_with_memory_flat(server) -> None:
    huge = {"prompt": "Once upon a time there was a dog. " * 230_000, "max_tokens": 4}  # 7.8 MB
    assert 7_500_000 < len(json.dumps(huge)) < 8 * 2**20
    slowest_health = 0.0
    with PeakRss(server.proc.pid) as memory:
        with ThreadPoolExecutor(8) as pool:
            replies = [pool.submit(lambda: server.client().post("/v1/completions", json=huge))
                       for _ in range(8)]
            with server.client() as http:
                while not all(r.done() for r in replies):
                    start = time.monotonic()
                    assert http.get("/health").status_code == 200
                    slowest_health = max(slowest_health, time.monotonic() - start)
            for reply in replies:
                response = reply.result(timeout=120)
                assert response.status_code == 400, response.text
                error = response.json()["error"]
                assert error["code"] == "context_length_exceeded" and "at least" in error["message"]
    after = server.rss_kib()
    # Each request holds its body and its text a few times over (~25 MB), never its tokens; what they
    # took goes back once they are answered (before: 2.5 GB peak for 16, ~500 MB left behind).
    assert memory.added_mb < 400, f"peak {memory.added_mb:.0f} MB above {memory.before} KiB"
    assert after - memory.before < 80 * 1024, f"{after - memory.before} KiB stayed"
    assert slowest_health < 2.0, f"/health took {slowest_health:.2f} s while the prompts were refused"
