"""`specli serve` as a real process for the tests: started on 127.0.0.1 with `--port 0` (the port it got is
read from the line it prints), waited on by its printed markers with bounded waits, always stopped."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx

EXE = shutil.which("specli") or str(Path(sys.executable).with_name("specli"))
START_TIMEOUT = 120.0  # seconds for the models to load on a busy 2-core machine
STOP_TIMEOUT = 60.0
CLOSE_WITHIN = 15.0  # seconds a connection the server should drop may stay open (read timeout 1 s)


class ServerProcess:
    """`specli serve ARGS --host 127.0.0.1 --port 0` with its stderr collected line by line."""

    def __init__(self, *args: str, cwd: Path, env: dict[str, str] | None = None, preexec_fn=None,
                 host: str = "127.0.0.1") -> None:
        environment = {**os.environ, "XDG_CONFIG_HOME": str(cwd / "xdg"), **(env or {})}
        environment.pop("SPECLI_CONFIG", None)
        if env is None or "SPECLI_API_KEY" not in env:
            environment.pop("SPECLI_API_KEY", None)
        self.proc = subprocess.Popen(
            [EXE, "serve", *args, "--host", host, "--port", "0"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=cwd,
            env=environment, preexec_fn=preexec_fn,
        )
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._ended = False
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.url = ""

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            with self._changed:
                self.lines.append(raw.decode("utf-8", "replace").rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._ended = True
            self._changed.notify_all()

    @property
    def stderr(self) -> str:
        with self._changed:
            return "\n".join(self.lines)

    def wait_for(self, pattern: str, timeout: float = START_TIMEOUT, start: int = 0) -> re.Match:
        """The first stderr line from line `start` on matching `pattern`; fails if the process ends or
        `timeout` passes first."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for line in self.lines[start:]:
                    if match := regex.search(line):
                        return match
                if self._ended:
                    raise AssertionError(f"the server ended without printing {pattern!r}:\n{self.stderr}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no {pattern!r} within {timeout} s:\n{self.stderr}")
                self._changed.wait(left)

    def ready(self) -> ServerProcess:
        self.url = self.wait_for(r"listening on (http://\S+:\d+)").group(1)
        self.wait_for(r"ready: ")
        return self

    def stop(self, sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT) -> int:
        """Send `sig` and wait for the exit code (killed and failed after `timeout`)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise AssertionError(f"no exit within {timeout} s after signal {sig}:\n{self.stderr}") from None
        self._reader.join(10)
        return code

    def rss_kib(self) -> int:
        """Resident memory of the server process, from /proc."""
        return rss_kib(self.proc.pid)

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.url.removeprefix("http://").rsplit(":", 1)
        return host.strip("[]"), int(port)

    def client(self, **headers: str) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=httpx.Timeout(120.0), headers=headers)

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        if self.proc.stderr is not None:
            self.proc.stderr.close()


def wait_until(condition, what: str, timeout: float = 60.0, interval: float = 0.02):
    """Poll `condition` until it returns something true (returned); bounded in time."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(interval)


def rss_kib(pid: int) -> int:
    """Resident memory of a process, from /proc."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


# -- raw sockets ----------------------------------------------------------------------------------------


def open_socket(server: ServerProcess, timeout: float = 10.0) -> socket.socket:
    sock = socket.create_connection(server.address, timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def read_to_close(sock: socket.socket, within: float) -> bytes:
    """Everything the server sends until it closes the connection; fails if it is still open after
    `within` seconds."""
    deadline = time.monotonic() + within
    data = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"the server kept the connection open for {within} s (got {data[:200]!r})")
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, BrokenPipeError):
            return data
        except TimeoutError:
            continue
        if not chunk:
            return data
        data += chunk


def response_of(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict((k.strip().lower(), v.strip()) for k, _, v in (line.partition(":") for line in lines[1:]))
    return int(lines[0].split()[1]), headers, body


def request_bytes(server: ServerProcess, method: str, path: str, body: bytes = b"", *,
                  keep_alive: bool = False, **headers: str) -> bytes:
    """A request's bytes (`Content_Type="..."` for a header); it asks to close the connection after it
    unless `keep_alive`."""
    host, port = server.address
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}",
             *([] if keep_alive else ["Connection: close"]),
             *(f"{name.replace('_', '-')}: {value}" for name, value in headers.items())]
    if body or method == "POST":
        lines.append(f"Content-Length: {len(body)}")
    return "\r\n".join(lines).encode() + b"\r\n\r\n" + body


def assert_healthy(server: ServerProcess, within: float = 1.0) -> None:
    """/health answers 200, the best of three tries within `within` seconds."""
    best = float("inf")
    with server.client() as http:
        for _ in range(3):
            start = time.monotonic()
            assert http.get("/health").status_code == 200
            best = min(best, time.monotonic() - start)
    assert best < within, f"/health took {best:.2f} s"


class PeakRss:
    """The highest resident memory of a process while the block runs, sampled every 10 ms."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.before = self.peak = rss_kib(pid)
        self._done = threading.Event()
        self._watcher = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._done.is_set():
            self.peak = max(self.peak, rss_kib(self.pid))
            time.sleep(0.01)

    @property
    def added_mb(self) -> float:
        return (self.peak - self.before) / 1024

    def __enter__(self) -> PeakRss:
        self._watcher.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._watcher.join(5)
        self.peak = max(self.peak, rss_kib(self.pid))


@contextlib.contextmanager
def trickling(sockets: list[socket.socket], piece: Callable[[int], bytes], every: float, times: int
              ) -> Iterator[None]:
    """While the block runs, a thread sends `piece(i)` to every socket, for i = 0, 1, ... every `every`
    seconds, `times` times at most (a socket the server closed is skipped)."""
    stop = threading.Event()

    def run() -> None:
        for i in range(times):
            for sock in sockets:
                try:
                    sock.send(piece(i))
                except OSError:
                    pass
            if stop.wait(every):
                return

    feeder = threading.Thread(target=run, daemon=True)
    feeder.start()
    try:
        yield
    finally:
        stop.set()
        feeder.join(5)
