"""The server's connections: a deadline for every request's head, a cap on open connections, and
HTTP-level errors in OpenAI's shape.

uvicorn closes a connection that stays idle after a response (its keep-alive timeout), but not one that
never sends a request or sends its head a byte at a time, and it accepts connections until the process
runs out of file descriptors, after which nothing is answered any more. Here:

- a connection must deliver a request's head within `head_seconds` of the moment the server starts
  waiting for one (its opening, or the end of the previous response); trickled bytes do not extend it;
- when `max_open` connections are open, a new one closes the connection that has waited longest for a
  request's head; a connection whose request is being read or answered is never closed for room, and
  when every one is busy the newcomer is closed at once;
- h11's protocol errors (a malformed or oversized head) are answered as OpenAI's error shape, not
  uvicorn's plain text.

A body that stalls is the app's to refuse (app.read_body): it knows which routes read one.
"""

from __future__ import annotations

import asyncio
import json
import resource
import time
from collections.abc import Callable

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

HEAD_SECONDS = 10.0  # --read-timeout's default
# asyncio accepts up to `backlog` connections in one go before any of them reaches the guard, so the
# descriptors kept free must cover one such burst beside the process's own (models, logs, threads).
# (A burst reaches the guard two loop turns after it was accepted: up to three bursts are in flight.)
# asyncio takes the burst size from the listen backlog; the kernel's queue is set longer afterwards
# (KERNEL_BACKLOG), since connections waiting there hold no descriptor.
BACKLOG = 32
KERNEL_BACKLOG = 1024
FD_RESERVE = 4 * BACKLOG + 32
MAX_OPEN = 4096  # connections at most, whatever the descriptor limit
NOTICE_SECONDS = 10.0  # between two log lines about the cap


def raise_descriptor_limit() -> int:
    """Raise the soft limit on open files to the hard one (up to 65,536) and return the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError):
            pass
    return 1 << 20 if soft == resource.RLIM_INFINITY else soft


def connection_cap(descriptor_limit: int) -> int:
    """How many connections may be open with this many descriptors."""
    return max(8, min(MAX_OPEN, descriptor_limit - FD_RESERVE))


class ConnectionGuard:
    """What every connection of one server shares: the open ones, the cap and the head deadline."""

    def __init__(self, *, max_open: int, head_seconds: float, log: Callable[[str], None]) -> None:
        self.max_open = max_open
        self.head_seconds = head_seconds
        self.log = log
        self.open: set[GuardedProtocol] = set()
        self.evicted = 0
        self.refused = 0
        self._noticed = -NOTICE_SECONDS

    def admit(self, protocol: GuardedProtocol) -> bool:
        """Make room for `protocol` (closing the longest-waiting idle connection if the cap is reached);
        False when every open connection is busy."""
        if len(self.open) >= self.max_open:
            idle = [p for p in self.open if p.waiting_since is not None]
            if not idle:
                self.refused += 1
                self._notice()
                return False
            min(idle, key=lambda p: p.waiting_since or 0.0).close_idle()
            self.evicted += 1
            self._notice()
        self.open.add(protocol)
        return True

    def forget(self, protocol: GuardedProtocol) -> None:
        self.open.discard(protocol)

    def _notice(self) -> None:
        now = time.monotonic()
        if now - self._noticed >= NOTICE_SECONDS:
            self._noticed = now
            self.log(f"{self.max_open} connections are open (the most this server keeps): "
                     f"{self.evicted} idle ones closed for room, {self.refused} new ones refused so far")


def error_body(status: int, message: str, code: str) -> bytes:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}}).encode()


class GuardedProtocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol under a ConnectionGuard (`guard` is set on a subclass per server,
    see protocol_class)."""

    guard: ConnectionGuard

    waiting_since: float | None = None  # when the server began waiting for a request's head (None: busy)
    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if not self.guard.admit(self):
            transport.abort()
            return
        self._follow()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._follow()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._follow()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timer()
        self.waiting_since = None
        self.guard.forget(self)
        super().connection_lost(exc)

    def _follow(self) -> None:
        """Start the head deadline when the server waits for a request's head, end it when one came."""
        if self.transport.is_closing():
            self._stop_timer()
            self.waiting_since = None
            return
        idle = self.conn.their_state is h11.IDLE and (self.cycle is None or self.cycle.response_complete)
        if idle and self._head_timer is None:
            self.waiting_since = time.monotonic()
            self._head_timer = self.loop.call_later(self.guard.head_seconds, self._head_timeout)
        elif not idle:
            self._stop_timer()
            self.waiting_since = None

    def _stop_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timeout(self) -> None:
        self._head_timer = None
        self.close_idle()

    def close_idle(self) -> None:
        """Close a connection that is waiting for a request's head (nothing is answered: no request
        came, as uvicorn's keep-alive timeout does)."""
        self._stop_timer()
        self.waiting_since = None
        if not self.transport.is_closing():
            self.transport.close()

    def send_400_response(self, msg: str) -> None:
        """A malformed request head (h11 could not parse it, or it is over h11's size limit)."""
        body = error_body(400, "the request is not valid HTTP/1.1 (a malformed or oversized request line "
                          "or header)", "invalid_http_request")
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"connection", b"close")]
        try:
            self.transport.write(self.conn.send(h11.Response(status_code=400, headers=headers,
                                                             reason=b"Bad Request")))
            self.transport.write(self.conn.send(h11.Data(data=body)))
            self.transport.write(self.conn.send(h11.EndOfMessage()))
        except h11.LocalProtocolError:  # a response had already begun: nothing more can be said
            pass
        self.transport.close()


def protocol_class(guard: ConnectionGuard) -> type[GuardedProtocol]:
    """A protocol class bound to `guard`, for uvicorn.Config(http=...)."""
    return type("SpecliProtocol", (GuardedProtocol,), {"guard": guard})
