"""Which requests a local server answers at all: the names it may be reached by (`Host`) and the web pages
that may call it (`Origin`). Both are checked before any route runs.

A web page in a visitor's browser can send requests to 127.0.0.1, and with DNS rebinding (a name of the
attacker's that first resolves to the attacker, then to 127.0.0.1) even read the answers, since the
browser then thinks they come from the page's own origin. Checking `Host` stops that: the browser sends
the attacker's name. A page can also send a "simple" POST (text/plain, a form) that needs no CORS
preflight; the server refuses POSTs from other origins (`Origin`) and bodies that are not JSON
(app.require_json), so no page can make it generate.

Accepted hosts: IP addresses (a rebinding needs a name), `localhost` and names under `.localhost`, the
name the server was started on (`--host`), this machine's own names, and `--allow-host` names (`*`: any,
for a trusted reverse proxy). Accepted origins: the server's own (the chat page), and `--allow-origin`
ones, which also get CORS headers so that their pages can read the API.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

ANY = "*"


def host_name(host: str) -> str:
    """The name part of a Host header or --host value (no port, no brackets, lower case)."""
    host = host.strip().lower()
    if host.startswith("["):  # [v6] or [v6]:port
        return host[1 : host.find("]")] if "]" in host else host[1:]
    if host.count(":") == 1:
        host = host.partition(":")[0]
    return host.rstrip(".")


def is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name.partition("%")[0])  # fe80::1%eth0
        return True
    except ValueError:
        return False


def own_names() -> set[str]:
    """This machine's host names, as a browser on the network may call it."""
    names = set()
    for get in (socket.gethostname, socket.getfqdn):
        try:
            names.add(host_name(get()))
        except OSError:
            pass
    return {n for n in names if n}


def canonical_origin(origin: str) -> str | None:
    """scheme://host[:port] in lower case with the default port dropped; None if it is not one."""
    try:
        parts = urlsplit(origin.strip())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/"):
        return None
    host = parts.hostname.lower()
    host = f"[{host}]" if ":" in host else host
    default = 443 if parts.scheme == "https" else 80
    return f"{parts.scheme}://{host}" + ("" if port in (None, default) else f":{port}")


@dataclass(frozen=True)
class Admission:
    """The hosts and origins a server answers."""

    hosts: frozenset[str]  # names besides IP addresses and localhost; ANY: every name
    origins: frozenset[str]  # canonical origins besides the server's own

    @classmethod
    def make(cls, listen_host: str, allow_hosts: Iterable[str] = (), allow_origins: Iterable[str] = ()
             ) -> Admission:
        hosts = {host_name(listen_host), *own_names(), *(ANY if h.strip() == ANY else host_name(h)
                                                           for h in allow_hosts)}
        origins = set()
        for origin in allow_origins:
            canonical = canonical_origin(origin)
            if canonical is None:
                raise ValueError(f"--allow-origin {origin!r} is not an origin such as http://localhost:3000")
            origins.add(canonical)
        return cls(frozenset(h for h in hosts if h), frozenset(origins))

    def host_allowed(self, host: str | None) -> bool:
        if host is None:  # HTTP/1.0 without Host: no browser sends that
            return True
        name = host_name(host)
        return (ANY in self.hosts or is_ip(name) or name == "localhost" or name.endswith(".localhost")
                or name in self.hosts)

    def origin_allowed(self, origin: str, host: str | None, scheme: str) -> bool:
        canonical = canonical_origin(origin)
        if canonical is None:  # "null" (a sandboxed frame, a file) or garbage
            return False
        own = canonical_origin(f"{scheme}://{host}") if host else None
        return canonical == own or canonical in self.origins


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None


class AdmissionMiddleware:
    """Refuses (403, OpenAI's error shape) requests for a host or from an origin the server does not
    answer; `refuse(status, message, code)` builds the response."""

    def __init__(self, app: ASGIApp, admission: Admission, refuse) -> None:
        self.app = app
        self.admission = admission
        self.refuse = refuse

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        host = _header(scope, b"host")
        if not self.admission.host_allowed(host):
            shown = host if host is not None and len(host) <= 80 else f"{(host or '')[:77]}..."
            response = self.refuse(403, f"this server does not answer for the host {shown!r}: reach it as "
                                   "127.0.0.1 or localhost, or start it with --allow-host NAME",
                                   "host_not_allowed")
            await response(scope, receive, send)
            return
        origin = _header(scope, b"origin")
        scheme = scope.get("scheme", "http")
        if origin is not None and not self.admission.origin_allowed(origin, host, scheme):
            shown = origin if len(origin) <= 80 else f"{origin[:77]}..."
            response = self.refuse(403, f"this server does not answer pages from {shown!r}; start it with "
                                   "--allow-origin ORIGIN to let that page use the API", "origin_not_allowed")
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)
