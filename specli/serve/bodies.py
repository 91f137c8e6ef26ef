"""Request bodies under limits: each one read against deadlines, and all of those in flight (being
received, parsed or turned into tokens) within one budget of bodies and bytes.

A body costs memory from its first byte until its prompt has been tokenized (its text, its parsed JSON,
its rendered conversation: ~3 times its size at the peak). One body may be 8 MiB (protocol.MAX_BODY_BYTES);
without a budget 150 of them at once took 3.3 GB. Here a request whose body does not fit what is left is
answered 429 (with Retry-After) before a byte of it is read: its Content-Length is charged at once, a
body without one as it arrives. Places held by bodies that trickle in too slowly to arrive before their
deadline are not kept from others: when every place is taken, a newcomer takes the place of the slowest
such body (408 for it), so a wave of them cannot keep every other request out for their whole minute.

Reading a body costs the event loop a little for every part that arrives, however small: a body sent a
byte at a time held the loop for seconds. So the deadlines cost nothing per part (one timer per body,
not one per read), and a body that arrives in parts of a few bytes on average is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

from starlette.requests import ClientDisconnect, Request
from starlette.types import Receive

from specli.serve.protocol import MAX_BODY_BYTES, RETRY_AFTER_SECONDS, ApiError

BODY_SECONDS_PER_TIMEOUT = 6  # a body must arrive within this many read timeouts in all (60 s by default)
MAX_BODIES_IN_FLIGHT = 64  # requests receiving or preparing a body at once (at most a quarter of the
MAX_BODY_BYTES_IN_FLIGHT = 64 * 2**20  # connections the server keeps), and their bytes in all
# A body arriving in more parts than this must average MIN_PART_BYTES a part (a client's writes reach the
# server as TCP segments: hundreds of bytes at the least; one byte per segment is an attack on the loop).
FREE_PARTS = 1024
MIN_PART_BYTES = 64


class BodyBudget:
    """The bodies in flight: at most `max_bodies` of them and `max_bytes` in all."""

    def __init__(self, max_bodies: int = MAX_BODIES_IN_FLIGHT, max_bytes: int = MAX_BODY_BYTES_IN_FLIGHT
                 ) -> None:
        self.max_bodies, self.max_bytes = max_bodies, max_bytes
        self.bytes = 0
        self.charges: set[Charge] = set()

    @property
    def bodies(self) -> int:
        return len(self.charges)

    @contextlib.contextmanager
    def hold(self, declared: int | None) -> Iterator[Charge]:
        """A place for one body, its declared length charged at once (429 when it does not fit); the
        charge grows as more arrives and is given back when the block ends."""
        if len(self.charges) >= self.max_bodies and not self._evict_a_hopeless_one():
            raise self._busy(f"{len(self.charges)} requests are already sending or preparing their bodies")
        charge = Charge(self, declared)
        charge.grow_to(declared or 0)
        self.charges.add(charge)
        try:
            yield charge
        finally:
            self.charges.discard(charge)
            self.bytes -= charge.bytes

    def _evict_a_hopeless_one(self) -> bool:
        """Stop the slowest body that cannot arrive before its deadline at the pace it has kept (its
        reader answers 408 and gives its place back); False when there is none."""
        reading = [c for c in self.charges if c.reader is not None and not c.reader.expired]
        hopeless = [(c.pace(), c) for c in reading if c.hopeless()]
        if not hopeless:
            return False
        min(hopeless, key=lambda pair: pair[0])[1].reader.evict()  # type: ignore[union-attr]
        return True

    def _busy(self, why: str) -> ApiError:
        return ApiError(429, f"the server is busy: {why} (its limit is {self.max_bodies} bodies and "
                        f"{self.max_bytes // 2**20} MiB in all); retry in a moment", code="too_many_requests",
                        headers={"Retry-After": str(RETRY_AFTER_SECONDS)})


class Charge:
    """One body's share of a BodyBudget, and while it is read, how it arrives."""

    def __init__(self, budget: BodyBudget, declared: int | None) -> None:
        self.budget = budget
        self.declared = declared
        self.bytes = 0  # charged
        self.received = 0
        self.reader: _Deadline | None = None  # while the body is being read

    def pace(self) -> float:
        """Bytes a second so far."""
        assert self.reader is not None
        return self.received / max(1e-3, self.reader.loop.time() - self.reader.start)

    def hopeless(self) -> bool:
        """Read for a part's timeout at least, and at its pace so far the rest (or for a body of unknown
        length, as much again) would come after its deadline."""
        reader = self.reader
        assert reader is not None
        now = reader.loop.time()
        if now - reader.start < reader.timeout:
            return False
        left = (self.declared - self.received) if self.declared is not None else max(1, self.received)
        pace = self.pace()
        return pace <= 0 or now + left / pace > reader.end

    def grow_to(self, size: int) -> None:
        more = size - self.bytes
        if more <= 0:
            return
        budget = self.budget
        if budget.bytes + more > budget.max_bytes:
            raise budget._busy(f"{budget.bytes / 2**20:.1f} MiB of request bodies are being received or "
                               "prepared")
        budget.bytes += more
        self.bytes += more


def declared_length(request: Request) -> int | None:
    """The body's Content-Length (None: not given), refused (413) past MAX_BODY_BYTES before it is read."""
    declared = request.headers.get("content-length")
    if declared is None:
        return None
    try:
        length = int(declared)
    except ValueError:
        raise ApiError(400, "the Content-Length header is not a number", code="invalid_header") from None
    if length > MAX_BODY_BYTES:
        raise too_large()
    return length


def too_large() -> ApiError:
    return ApiError(413, f"the request body is over this server's limit of {MAX_BODY_BYTES // 2**20} MiB",
                    code="request_too_large")


class _Deadline:
    """Cancels `task` when a body stalls: no part within `timeout` seconds, or not all of it within
    BODY_SECONDS_PER_TIMEOUT of them. One timer, moved only when it fires."""

    def __init__(self, timeout: float) -> None:
        self.loop = asyncio.get_running_loop()
        self.task = asyncio.current_task()
        self.timeout = timeout
        self.start = self.last = self.loop.time()  # when the last part came
        self.end = self.start + timeout * BODY_SECONDS_PER_TIMEOUT
        self.expired = False
        self.evicted = False  # stopped for another body's place
        self._timer = self.loop.call_at(self._due(), self._check)

    def _due(self) -> float:
        return min(self.last + self.timeout, self.end)

    def _check(self) -> None:
        due = self._due()
        if self.loop.time() < due:
            self._timer = self.loop.call_at(due, self._check)
            return
        self._expire()

    def evict(self) -> None:
        """Stop now: another body needs the place."""
        self.evicted = True
        self._timer.cancel()
        self._expire()

    def _expire(self) -> None:
        self.expired = True
        if self.task is not None:
            self.task.cancel()

    def cancel(self) -> None:
        self._timer.cancel()


async def read_body(receive: Receive, timeout: float, charge: Charge, declared: int | None) -> bytearray:
    """The body, refused past MAX_BODY_BYTES (413) or the budget (429) before more of it is read, when
    a part of it takes more than `timeout` seconds to come or all of it more than
    BODY_SECONDS_PER_TIMEOUT of them (408; a client that stops short of its Content-Length holds the
    connection no longer), and when it comes in parts too small to be a client's writes (400)."""
    # A declared length is the body's (h11 holds the client to it): one buffer of that size, no copies.
    body = bytearray(declared or 0)
    size = parts = 0
    deadline = charge.reader = _Deadline(timeout)
    try:
        while True:
            message = await receive()
            deadline.last = deadline.loop.time()
            if message["type"] == "http.disconnect":
                raise ClientDisconnect()
            chunk = message.get("body", b"")
            if chunk:
                parts += 1
                if size + len(chunk) > MAX_BODY_BYTES:
                    raise too_large()
                if declared is None:
                    charge.grow_to(size + len(chunk))
                    body += chunk
                else:
                    body[size : size + len(chunk)] = chunk
                size = charge.received = size + len(chunk)
                if parts > FREE_PARTS and size < parts * MIN_PART_BYTES:
                    raise ApiError(400, f"the request body arrives in parts of {size // parts} bytes on "
                                   f"average ({parts:,} so far): send it in larger writes",
                                   code="body_too_fragmented", headers={"Connection": "close"})
            if not message.get("more_body", False):
                del body[size:]  # a client that sent less than it declared (h11 would have refused it)
                return body
    except asyncio.CancelledError:
        if not deadline.expired:
            raise
        uncancel = getattr(deadline.task, "uncancel", None)  # Python 3.11+: this cancellation is handled
        if uncancel is not None:
            uncancel()
        if deadline.evicted:
            raise ApiError(408, f"the request body came too slowly to arrive in time ({size} bytes in "
                           f"{deadline.loop.time() - deadline.start:.0f} s) and its place was needed",
                           code="request_timeout", headers={"Connection": "close"}) from None
        whole = timeout * BODY_SECONDS_PER_TIMEOUT
        raise ApiError(408, f"the request body did not arrive in time ({size} bytes came; a part must "
                       f"come within {timeout:g} s, all of it within {whole:g} s)",
                       code="request_timeout", headers={"Connection": "close"}) from None
    finally:
        deadline.cancel()
        charge.reader = None
