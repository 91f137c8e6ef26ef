"""`specli serve` as a real process for the tests: started on 127.0.0.1 with `--port 0` (the port it got is
read from the line it prints), waited on by its printed markers with bounded waits, always stopped."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

EXE = shutil.which("specli") or str(Path(sys.executable).with_name("specli"))
START_TIMEOUT = 120.0  # seconds for the models to load on a busy 2-core machine
STOP_TIMEOUT = 60.0


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
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS in /proc/PID/status")

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
