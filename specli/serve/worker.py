"""Batch 1: one generation at a time on the loaded models, in one thread of its own.

The models are loaded, used and closed on this thread; the event loop only hands it jobs and reads
what comes back (llama.cpp's calls release the GIL, so the loop stays free while it decodes). Jobs
that arrive while one runs wait in a bounded queue, in order; a running job is never interrupted by
another, only by its own cancellation (its client went away, or asked to stop) or by the server
stopping, which the thread sees between two events: within one round.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from specli.events import RoundEvent, TokenEvent
from specli.llama import DecodeAborted
from specli.stats import GenerationStats

if TYPE_CHECKING:
    from specli.api import Speculator
    from specli.engine import GenerationParams

LOADING, READY, FAILED, STOPPED = "loading", "ready", "failed", "stopped"

# Why a job ended before its generation did.
CLIENT_GONE = "client gone"
CANCELLED = "cancelled"
SHUTDOWN = "server stopping"


class QueueFull(Exception):
    """Every place in the queue is taken."""


class NotAccepting(Exception):
    """The models are not loaded (yet), or the server is stopping."""


@dataclass
class Finished:
    """A job's end: the generation's stats and text (empty when it never started), why it was cut
    short (None: it ended by itself: end of text, a stop text, the length or the context), and whether
    it ran at all (False: it left the queue before its turn)."""

    stats: GenerationStats
    text: str
    cut_short: str | None = None
    ran: bool = True


@dataclass
class Failed:
    """The generation raised (NaN logits, a llama.cpp failure): the job ends with this error."""

    error: Exception


JobItem = list[TokenEvent] | Finished | Failed


class Job:
    """One generation asked for by one request. The worker thread delivers its items (a round's
    released tokens, then one Finished or Failed) to the asyncio loop the job was made on."""

    def __init__(self, job_id: str, tokens: list[int], params: GenerationParams, *,
                 fresh: bool = False) -> None:
        self.id = job_id
        self.tokens = tokens
        self.params = params
        self.fresh = fresh  # evaluate the whole prompt, not reusing the cache (cache_prompt: false)
        self._loop = asyncio.get_running_loop()
        self._items: asyncio.Queue[JobItem] = asyncio.Queue()
        self._getter: asyncio.Future[JobItem] | None = None  # a get() that outlived a timeout
        # Set once, from the loop's thread; the worker reads it between events (a str is swapped whole).
        self.cancel_reason: str | None = None

    def deliver(self, item: JobItem) -> None:
        """From the worker thread: hand an item to the loop (never blocks the generation). A loop that
        has closed (the server stopped before the job ended) has no one left to read it."""
        try:
            self._loop.call_soon_threadsafe(self._items.put_nowait, item)
        except RuntimeError:
            pass

    async def next_item(self, timeout: float | None = None) -> JobItem | None:
        """The next item, or None after `timeout` seconds without one (then the next call gets it: the
        pending get() is kept, never cancelled, so no item can be lost to a timeout)."""
        if self._getter is None:
            self._getter = asyncio.ensure_future(self._items.get())
        done, _ = await asyncio.wait({self._getter}, timeout=timeout)
        if not done:
            return None
        getter, self._getter = self._getter, None
        return getter.result()

    def close(self) -> None:
        """No more reading (the response is over): drop a pending get()."""
        if self._getter is not None:
            self._getter.cancel()
            self._getter = None


class GenerationWorker:
    """The thread that owns the models. `load` runs on it first; then `on_loaded` prepares what serving
    needs besides the models, and `on_ready` says that jobs are taken (or `on_failed` that the load
    failed; all three are called on the thread). Then it runs the submitted jobs one by one until
    `stop()`; `close()` frees the models once it has ended."""

    def __init__(self, load: Callable[[], Speculator], *, max_waiting: int,
                 on_ready: Callable[[Speculator], None], on_failed: Callable[[BaseException], None],
                 on_loaded: Callable[[Speculator], None] = lambda spec: None) -> None:
        self.max_waiting = max_waiting
        self.state = LOADING
        self.spec: Speculator | None = None
        self.running: Job | None = None
        self._load, self._on_loaded, self._on_ready, self._on_failed = load, on_loaded, on_ready, on_failed
        self._waiting: deque[Job] = deque()
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._stopping = False
        self._thread = threading.Thread(target=self._main, name="specli-generation", daemon=True)

    # -- from the event loop ---------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    @property
    def n_waiting(self) -> int:
        return len(self._waiting)

    def submit(self, job: Job) -> None:
        """Queue `job` (it runs at once when nothing else does); QueueFull or NotAccepting."""
        with self._lock:
            if self.state != READY or self._stopping:
                raise NotAccepting("the server is stopping" if self._stopping or self.state == STOPPED
                                   else "the model is still loading")
            busy = self.running is not None or self._waiting
            if busy and len(self._waiting) >= self.max_waiting:
                raise QueueFull()
            self._waiting.append(job)
            self._changed.notify()

    def cancel(self, job: Job, reason: str) -> None:
        """End `job`: taken out of the queue if it waits (it ends at once, never started), or stopped
        by the worker at its next event if it runs. A finished job: nothing happens."""
        with self._lock:
            if job.cancel_reason is None:
                job.cancel_reason = reason
            if job in self._waiting:
                self._waiting.remove(job)
                job.deliver(Finished(GenerationStats(stop_reason="interrupted"), "", reason, ran=False))
            elif job is self.running and self.spec is not None:
                self.spec.abort()  # a long prompt's evaluation stops within a graph node, not at its end

    def find(self, job_id: str) -> Job | None:
        """The running or waiting job with this id."""
        with self._lock:
            for job in (self.running, *self._waiting):
                if job is not None and job.id == job_id:
                    return job
        return None

    def stop(self) -> None:
        """Refuse new jobs, end the waiting ones and the running one (at its next event); the thread then
        closes the models and ends. Safe from a signal handler's context (takes the lock briefly)."""
        with self._lock:
            self._stopping = True
            for job in self._waiting:
                job.cancel_reason = job.cancel_reason or SHUTDOWN
                job.deliver(Finished(GenerationStats(stop_reason="interrupted"), "", job.cancel_reason,
                                     ran=False))
            self._waiting.clear()
            if self.running is not None:
                if self.running.cancel_reason is None:
                    self.running.cancel_reason = SHUTDOWN
                if self.spec is not None:
                    self.spec.abort()
            self._changed.notify()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the thread to end; False if it is still running after `timeout`."""
        if self._thread.is_alive():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def close(self, timeout: float | None = None) -> bool:
        """Stop, wait for the thread to end, then free the models. The caller makes sure that nothing else
        uses them any more (the server tokenizes prompts in other threads: it closes after they are done).
        False, and nothing freed, if the thread is still in a llama.cpp call after `timeout`."""
        self.stop()
        if not self.join(timeout):
            return False
        with self._lock:
            spec, self.spec = self.spec, None
        if spec is not None:
            spec.close()
        return True

    # -- on the worker thread ----------------------------------------------------------------------------

    def _main(self) -> None:
        try:
            spec = self._load()
        except BaseException as e:  # noqa: BLE001 - reported to the server, which exits with it
            with self._lock:
                self.state = FAILED
            self._on_failed(e)
            return
        with self._lock:
            self.spec = spec  # from here on close() frees it, whatever happens below
            stopped_while_loading = self._stopping
        try:
            if stopped_while_loading:  # a stop signal during the load: never "ready"
                return
            self._on_loaded(spec)
            with self._lock:
                self.state = READY
            self._on_ready(spec)  # said once a request can be served (a client may act on it at once)
            while True:
                with self._lock:
                    while not self._waiting and not self._stopping:
                        self._changed.wait()
                    if not self._waiting:
                        break
                    job = self.running = self._waiting.popleft()
                    spec.resume()  # an abort() was for the job before (cancel and stop take this lock)
                try:
                    self._run(spec, job)
                finally:
                    with self._lock:
                        self.running = None
        finally:
            with self._lock:
                self.state = STOPPED

    def _run(self, spec: Speculator, job: Job) -> None:
        if job.cancel_reason is not None:  # cancelled between leaving the queue and starting
            job.deliver(Finished(GenerationStats(stop_reason="interrupted"), "", job.cancel_reason,
                                 ran=False))
            return
        try:
            if job.fresh:
                spec.engine.reset()
            generation = spec.generate(job.tokens, job.params)
            released: list[TokenEvent] = []
            rounds: list[RoundEvent] = []
            in_reply: Counter[int] = Counter()  # the reply's tokens by the round that verified them
            cut_short = None
            try:
                for event in generation:
                    if isinstance(event, TokenEvent):
                        released.append(event)
                        in_reply[event.round] += 1
                    elif isinstance(event, RoundEvent):
                        rounds.append(event)
                        if released:
                            job.deliver(released)  # a round's tokens arrive together: one hand-over each
                            released = []
                    if job.cancel_reason is not None:
                        break
            except DecodeAborted:  # cancel() or stop() stopped a decode (the prompt's, most often)
                if job.cancel_reason is None:
                    raise
            if job.cancel_reason is not None:
                cut_short = job.cancel_reason
                generation.interrupt()
            if released:
                job.deliver(released)
            stats = generation.stats
            if stats.stop_reason == "stop":
                stats = drafts_in_reply(stats, rounds, in_reply)
            job.deliver(Finished(stats, generation.text, cut_short))
        except Exception as e:  # noqa: BLE001 - the request fails, the server goes on
            job.deliver(Failed(e))


def drafts_in_reply(stats: GenerationStats, rounds: list[RoundEvent], in_reply: Counter[int]
                    ) -> GenerationStats:
    """`stats` with only the drafts the reply reached counted as drafted and accepted. A stop text that
    spans tokens is not part of the reply, and may begin rounds before the one that completed it; the
    engine counts the drafts up to its end (so a reply of 4 tokens had 8 accepted drafts)."""
    last = max((index for index, n in in_reply.items() if n), default=-1)
    drafted = accepted = 0
    for r in rounds:
        if r.index < last or (r.index == last and in_reply[r.index] == r.accepted + 1):
            drafted, accepted = drafted + r.judged, accepted + r.kept  # every token of it is in the reply
        elif r.index == last:
            drafted += min(r.k, in_reply[r.index])
            accepted += min(r.accepted, in_reply[r.index])
    return replace(stats, drafted=drafted, accepted=accepted)
