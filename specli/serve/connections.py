"""The server's connections: a deadline in every state, a cap on open connections, and HTTP-level errors
in OpenAI's shape.

uvicorn closes a connection that stays idle after a response (its keep-alive timeout) unless it sends
anything at all, and it accepts connections until the process runs out of file descriptors, after which
nothing is answered any more. Here a connection is either busy (its request is being read or answered)
or idle (nothing is being answered: it has yet to send a request's head, or its response is complete
while the rest of a body the route did not read still trickles in), and:

- an idle connection is closed `head_seconds` after it became idle (its opening, or the end of its last
  response): a request's head, and what is left of a refused body, must come by then; bytes that keep
  coming do not extend it;
- when `max_open` connections are open, a new one closes the connection that has been idle longest; a
  busy one is never closed for room (app.py bounds how many requests can be busy with a body,
  bodies.BodyBudget), and when every one is busy the newcomer is closed at once;
- a response the client stops reading is cut `write_seconds` after its send buffer filled up;
- a request head over MAX_HEAD_BYTES or with more than MAX_HEADERS fields, and h11's protocol errors (a
  malformed head), are answered 400 in OpenAI's error shape, not uvicorn's plain text.

A body that stalls while a route reads it is the app's to refuse (bodies.read_body).
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
# A request's head at most (request line and fields, as h11 limits what it buffers) and its fields: what
# llama-server (cpp-httplib) and browsers stay well within.
MAX_HEAD_BYTES = 16 * 1024
MAX_HEADERS = 100


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

    def __init__(self, *, max_open: int, head_seconds: float, log: Callable[[str], None],
                 write_seconds: float | None = None) -> None:
        self.max_open = max_open
        self.head_seconds = head_seconds
        self.write_seconds = 6 * head_seconds if write_seconds is None else write_seconds
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


class LimitedConnection(h11.Connection):
    """h11's server side, refusing a request head over MAX_HEAD_BYTES or with more than MAX_HEADERS
    fields. (h11's own limit only holds for a head that is still incomplete: one that arrives whole in a
    read, 60 KB with 3,000 fields, passed.) The error is h11's, so uvicorn answers it as any other."""

    def __init__(self) -> None:
        super().__init__(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)

    def next_event(self):  # type: ignore[no-untyped-def]
        event = super().next_event()
        if type(event) is h11.Request:
            fields = event.headers
            if len(fields) > MAX_HEADERS:
                raise h11.RemoteProtocolError(f"more than {MAX_HEADERS} header fields", error_status_hint=431)
            size = len(event.method) + len(event.target) + sum(len(name) + len(value) + 4
                                                               for name, value in fields)
            if size > MAX_HEAD_BYTES:
                raise h11.RemoteProtocolError(f"a head over {MAX_HEAD_BYTES} bytes", error_status_hint=431)
        return event


def error_body(status: int, message: str, code: str) -> bytes:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}}).encode()


class GuardedProtocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol under a ConnectionGuard (`guard` is set on a subclass per server,
    see protocol_class)."""

    guard: ConnectionGuard

    waiting_since: float | None = None  # when the connection became idle (None: busy)
    _head_timer: asyncio.TimerHandle | None = None
    _write_timer: asyncio.TimerHandle | None = None

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.conn = LimitedConnection()

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
        self._stop_write_timer()
        self.waiting_since = None
        self.guard.forget(self)
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        """The send buffer is full: the client has until write_seconds to read some of it."""
        super().pause_writing()
        if self._write_timer is None:
            self._write_timer = self.loop.call_later(self.guard.write_seconds, self._write_timeout)

    def resume_writing(self) -> None:
        super().resume_writing()
        self._stop_write_timer()

    def _stop_write_timer(self) -> None:
        _cancel(self._write_timer)
        self._write_timer = None

    def _write_timeout(self) -> None:
        self._write_timer = None
        self.transport.abort()  # what it holds will not be read: no point flushing it

    def _follow(self) -> None:
        """Start the idle deadline when nothing is being answered, end it when a request came."""
        if self.transport.is_closing():
            self._stop_timer()
            self.waiting_since = None
            return
        # No response under way: the next request's head has yet to come, or the response went out
        # before the route read the body (a refusal), whose rest is only drained now.
        idle = self.cycle is None or self.cycle.response_complete
        if idle and self._head_timer is None:
            self.waiting_since = time.monotonic()
            self._head_timer = self.loop.call_later(self.guard.head_seconds, self._head_timeout)
        elif not idle:
            self._stop_timer()
            self.waiting_since = None

    def _stop_timer(self) -> None:
        _cancel(self._head_timer)
        self._head_timer = None

    def _head_timeout(self) -> None:
        self._head_timer = None
        self.close_idle()

    def close_idle(self) -> None:
        """Close an idle connection (nothing is answered: no request came, or it was answered already,
        as uvicorn's keep-alive timeout does)."""
        self._stop_timer()
        self.waiting_since = None
        if not self.transport.is_closing():
            self.transport.close()

    def send_400_response(self, msg: str) -> None:
        """A malformed request head (h11 could not parse it) or one over the limits."""
        body = error_body(400, f"the request is not valid HTTP/1.1 (a malformed request line or header, a "
                          f"head over {MAX_HEAD_BYTES // 1024} KiB or more than {MAX_HEADERS} header fields)",
                          "invalid_http_request")
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


def _cancel(timer: asyncio.TimerHandle | None) -> None:
    if timer is not None:
        timer.cancel()


def protocol_class(guard: ConnectionGuard) -> type[GuardedProtocol]:
    """A protocol class bound to `guard`, for uvicorn.Config(http=...)."""
    return type("SpecliProtocol", (GuardedProtocol,), {"guard": guard})
