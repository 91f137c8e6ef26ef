"""Running `specli serve`: bind the socket, load the models on the generation thread while uvicorn already
answers (`/health` says 503 until they are loaded), serve until Ctrl-C, SIGTERM or SIGHUP, then end what
runs, close the models and return.

The socket is bound here rather than by uvicorn so that a port in use is a one-line error before any
model is loaded, and so that `--port 0` can say which port it got.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING

import uvicorn

from specli.errors import debug_enabled
from specli.serve.app import ServeOptions, Service, create_app
from specli.serve.bodies import MAX_BODIES_IN_FLIGHT
from specli.serve.connections import (
    BACKLOG,
    KERNEL_BACKLOG,
    ConnectionGuard,
    connection_cap,
    protocol_class,
    raise_descriptor_limit,
)

if TYPE_CHECKING:
    from specli.api import Speculator
    from specli.runplan import Plan
    from specli.settings import RunSettings

GRACEFUL_SECONDS = 5  # after a stop signal, connections get this long to finish their last chunks
# The signals that stop the server: Ctrl-C, a service manager's stop, and a closed terminal (SIGHUP's
# default would end the process at once, cutting every stream without its end).
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP")
                     if hasattr(signal, name))


class ListenError(OSError):
    """The address cannot be listened on (in use, not this machine's, not allowed)."""


@dataclass(frozen=True)
class Listener:
    sock: socket.socket
    url: str  # http://host:port, with the port actually bound


def listen(host: str, port: int) -> Listener:
    """A listening TCP socket on host:port (port 0: one the system picks); an IPv6 address may come
    in brackets, as URLs write it ([::1])."""
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as e:
        raise ListenError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(KERNEL_BACKLOG)  # now: connections made before uvicorn starts wait in the backlog
    except OSError as e:
        sock.close()
        raise ListenError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    bound_host, bound_port = sock.getsockname()[:2]
    shown = f"[{bound_host}]" if family == socket.AF_INET6 else bound_host
    return Listener(sock, f"http://{shown}:{bound_port}")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


class _Server(uvicorn.Server):
    """uvicorn's server with specli's signal handling: a stop signal ends the running generation at once
    (uvicorn alone would wait for the stream to finish) and the process exits 0 afterwards (uvicorn
    re-raises the signal it caught once it is done)."""

    def __init__(self, config: uvicorn.Config, service: Service) -> None:
        super().__init__(config)
        self.service = service

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # serve() installs its own handlers around the whole run

    def request_exit(self, signum: int, frame: FrameType | None = None) -> None:
        # Only flags here: a signal handler must not take the locks the interrupted code may hold.
        if self.should_exit and signum == signal.SIGINT:
            self.force_exit = True  # a second Ctrl-C: stop waiting for connections
        self.should_exit = True

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        for sock in sockets or []:  # asyncio listened with its burst size (BACKLOG); the kernel queues more
            sock.listen(KERNEL_BACKLOG)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.service.begin_stopping()  # the running and waiting jobs end now; their streams close
        await super().shutdown(sockets)


class OneLineLog(logging.Handler):
    """uvicorn's and asyncio's log records as one line each on stderr, without tracebacks (unless
    --debug: `debug_enabled`), and the same message at most once per QUIET_SECONDS (a flood of one
    error, e.g. from a client that misbehaves in a loop, is one line and a count)."""

    QUIET_SECONDS = 10.0

    def __init__(self, say: Callable[[str], None]) -> None:
        super().__init__(logging.WARNING)
        self.say = say
        self.debug = debug_enabled()
        self.last: dict[str, tuple[float, int]] = {}  # message -> (when it was last shown, repeats since)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage().strip()
            message = text.splitlines()[0] if text else ""
            if record.exc_info and record.exc_info[1] is not None:
                error = record.exc_info[1]
                message = f"{message} ({type(error).__name__}: {error})" if str(error) else \
                    f"{message} ({type(error).__name__})"
            now = time.monotonic()
            shown, repeats = self.last.get(message, (-self.QUIET_SECONDS, 0))
            if now - shown < self.QUIET_SECONDS:
                self.last[message] = (shown, repeats + 1)
                return
            if len(self.last) > 256:
                self.last.clear()
            self.last[message] = (now, 0)
            self.say(f"{record.name}: {message}" + (f" (and {repeats} more like it)" if repeats else ""))
            if self.debug and record.exc_info:
                import traceback

                traceback.print_exception(*record.exc_info, file=sys.stderr)
        except Exception:  # noqa: BLE001 - logging must never raise
            pass


@contextlib.contextmanager
def quiet_logs() -> Iterator[None]:
    """Route the uvicorn and asyncio loggers through OneLineLog while the server runs."""
    handler = OneLineLog(say)
    loggers = [logging.getLogger(name) for name in ("uvicorn.error", "uvicorn", "asyncio")]
    saved = [(lg.handlers[:], lg.propagate) for lg in loggers]
    for lg in loggers:
        lg.handlers = [handler]
        lg.propagate = False
    try:
        yield
    finally:
        for lg, (handlers, propagate) in zip(loggers, saved, strict=True):
            lg.handlers, lg.propagate = handlers, propagate


def say(line: str) -> None:
    print(f"specli: {line}", file=sys.stderr, flush=True)


def serve(plan: Plan, settings: RunSettings, options: ServeOptions, *, host: str, port: int,
          load: Callable[[], Speculator], notes: Callable[[], list[str]] | None = None) -> None:
    """Serve until a stop signal. Raises ListenError before loading anything, and the load's own error
    (after the server has stopped) when the models cannot be loaded."""
    listener = listen(host, port)
    # Every idle connection holds a file descriptor: a thousand of them must not reach the limit.
    guard = ConnectionGuard(max_open=connection_cap(raise_descriptor_limit()),
                            head_seconds=options.read_timeout, log=say)
    # Connections busy with a body are never closed for room: they may take a quarter of the places.
    max_bodies = max(1, min(MAX_BODIES_IN_FLIGHT, guard.max_open // 4))
    service = Service(settings, options, load, max_bodies=max_bodies)
    app = create_app(service)
    config = uvicorn.Config(app, log_config=None, log_level="warning", access_log=False, lifespan="off",
                            http=protocol_class(guard), ws="none", loop="asyncio",
                            timeout_graceful_shutdown=GRACEFUL_SECONDS, timeout_keep_alive=5, backlog=BACKLOG)
    server = _Server(config, service)
    url = listener.url
    what = plan.target.name + (f" + {getattr(plan.draft, 'name', plan.draft)}" if plan.draft else "")
    if not is_loopback(host):
        say(f"warning: listening on {host}: anyone who can reach this machine can use the model"
            + ("" if options.api_key else " (no --api-key set)"))

    def ready(spec: Speculator) -> None:
        for note in (notes() if notes else []):
            say(f"note: {note}")
        if service.chat_format is not None and service.chat_format.notice:
            say(f"note: {service.chat_format.notice}")
        say(f"ready: chat page {url}/ · API {url}/v1 · model {options.alias!r} · Ctrl-C stops")

    def failed(error: BaseException) -> None:
        server.should_exit = True

    service.on_ready, service.on_failed = ready, failed
    # Signals reach only the main thread (a server run on another thread, as in a test, is stopped by
    # setting should_exit).
    previous = ({sig: signal.signal(sig, server.request_exit) for sig in STOP_SIGNALS}
                if threading.current_thread() is threading.main_thread() else {})
    try:
        say(f"listening on {url} (loading {what})")
        service.worker.start()
        with quiet_logs():
            server.run(sockets=[listener.sock])
    finally:
        # uvicorn has returned: no request is being prepared any more, so the models can go.
        stopped = service.worker.close(timeout=60)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        listener.sock.close()
    if service.load_error is not None:
        raise service.load_error
    if not stopped:  # pragma: no cover - a decode that does not return: exit anyway (the OS frees the models)
        say("the generation thread did not stop within 60 s")
    say(f"stopped ({service.served} generations served)")
