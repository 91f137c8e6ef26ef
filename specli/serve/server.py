"""Running `specli serve`: bind the socket, load the models on the generation thread while uvicorn already
answers (`/health` says 503 until they are loaded), serve until Ctrl-C or SIGTERM, then end what runs,
close the models and return.

The socket is bound here rather than by uvicorn so that a port in use is a one-line error before any
model is loaded, and so that `--port 0` can say which port it got.
"""

from __future__ import annotations

import contextlib
import ipaddress
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING

import uvicorn

from specli.serve.app import ServeOptions, Service, create_app

if TYPE_CHECKING:
    from specli.api import Speculator
    from specli.runplan import Plan
    from specli.settings import RunSettings

GRACEFUL_SECONDS = 5  # after a stop signal, connections get this long to finish their last chunks


class ListenError(OSError):
    """The address cannot be listened on (in use, not this machine's, not allowed)."""


@dataclass(frozen=True)
class Listener:
    sock: socket.socket
    url: str  # http://host:port, with the port actually bound


def listen(host: str, port: int) -> Listener:
    """A listening TCP socket on host:port (port 0: one the system picks)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as e:
        raise ListenError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)  # now: connections made before uvicorn starts wait in the backlog
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

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.service.worker.stop()  # the running and waiting jobs end now; their streams close
        await super().shutdown(sockets)


def say(line: str) -> None:
    print(f"specli: {line}", file=sys.stderr, flush=True)


def serve(plan: Plan, settings: RunSettings, options: ServeOptions, *, host: str, port: int,
          load: Callable[[], Speculator], notes: Callable[[], list[str]] | None = None) -> None:
    """Serve until a stop signal. Raises ListenError before loading anything, and the load's own error
    (after the server has stopped) when the models cannot be loaded."""
    listener = listen(host, port)
    service = Service(settings, options, load)
    app = create_app(service)
    config = uvicorn.Config(app, log_config=None, log_level="warning", access_log=False, lifespan="off",
                            http="h11", ws="none", loop="asyncio", timeout_graceful_shutdown=GRACEFUL_SECONDS,
                            timeout_keep_alive=5)
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
    previous = ({sig: signal.signal(sig, server.request_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
                if threading.current_thread() is threading.main_thread() else {})
    try:
        say(f"listening on {url} (loading {what})")
        service.worker.start()
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
