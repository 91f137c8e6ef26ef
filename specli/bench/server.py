"""`specli bench --server`: the bench's prompts and settings sent to running OpenAI-compatible servers
(`specli serve`, llama-server, anything with `/v1/completions`), timed from this side.

One request per run, streamed (`"stream": true`): time to first token is the wait for the first chunk
that carries text; the decode rate is the tokens after it over the time after it. Where the server
reports llama-server's `timings` (`predicted_n`, `predicted_per_second`, `draft_n`, `draft_n_accepted`)
they are kept too. The request's fields are the settings' own request names (specli.settings), so
`specli serve` reads them by the same rules; llama-server ignores the ones it does not take
(in the llama.cpp specli ships, `speculative.*` per request: its k is the one it was started with).

Only the standard library: no HTTP client dependency for one POST.
"""

from __future__ import annotations

import http.client
import json
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from specli.bench.suite import BenchError, K
from specli.settings import AUTO, SETTINGS, RunSettings

API_KEY_ENV = "SPECLI_API_KEY"
REQUEST_TIMEOUT_SECONDS = 600.0  # one generation; a server that sends nothing for this long is gone
CONNECT_TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True)
class ServerTarget:
    """A running server: the name its results go by, its base URL (no /v1), and an API key (None: none)."""

    name: str
    url: str
    api_key: str | None = None

    @property
    def completions_url(self) -> str:
        return self.url + "/v1/completions"


def parse_server(text: str, api_key: str | None = None, index: int = 1) -> ServerTarget:
    """`--server [NAME=]URL`: a name (default: server-N) and an http(s) URL with a host; a trailing
    /v1 or / is dropped. BenchError for anything else."""
    name, sep, url = text.partition("=")
    if not sep or "://" in name:
        name, url = f"server-{index}", text
    name, url = name.strip(), url.strip()
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BenchError(f"--server: {text!r} is not [NAME=]URL with an http:// or https:// URL "
                         "(e.g. llama=http://127.0.0.1:8080)")
    try:
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        raise BenchError(f"--server: {text!r} has an invalid port") from None
    if not name:
        raise BenchError(f"--server: {text!r} has an empty name before '='")
    base = url.rstrip("/")
    if base.endswith("/v1"):
        base = base[:-3]
    return ServerTarget(name, base, api_key or None)


def unique_names(servers: list[ServerTarget]) -> list[ServerTarget]:
    """Refuse two servers by the same name: their results could not be told apart."""
    seen: set[str] = set()
    for s in servers:
        if s.name in seen:
            raise BenchError(f"--server: the name {s.name!r} is given twice (name them: NAME=URL)")
        seen.add(s.name)
    return servers


def request_body(prompt: str, settings: RunSettings, k: K) -> dict[str, Any]:
    """A streamed completion request for one bench run: the prompt and the run's settings, each under
    its request name (settings.SETTINGS[...].request)."""
    values: dict[str, Any] = {
        "temp": settings.temp, "top_k": settings.top_k, "top_p": settings.top_p, "min_p": settings.min_p,
        "max_tokens": settings.max_tokens, "seed": settings.seed, "ignore_eos": settings.ignore_eos,
        "draft_p_min": settings.draft_p_min, "same_as_plain": settings.same_as_plain,
    }
    if k != AUTO:
        values["draft_max"] = k
    body: dict[str, Any] = {"prompt": prompt, "stream": True}
    for name, value in values.items():
        if value is not None:
            body[SETTINGS[name].request] = value  # type: ignore[index]
    return body


@dataclass
class ServerResponse:
    """One streamed completion, timed from this side."""

    n_generated: int
    ttft_seconds: float | None  # from sending the request to the first chunk with text
    total_seconds: float
    tokens_per_second: float | None  # tokens after the first / seconds after the first chunk
    server_tokens_per_second: float | None  # the server's own timings.predicted_per_second
    drafted: int | None  # timings.draft_n (None: the server does not report it)
    accepted: int | None  # timings.draft_n_accepted
    finish_reason: str | None
    text: str
    count_source: str  # where n_generated came from: "timings", "usage" or "chunks"


class ServerError(ValueError):
    """A server that cannot be reached or answers with an error (one line, naming the server; a runtime
    failure, exit 1, where a malformed --server is a usage error)."""


def complete(server: ServerTarget, body: dict[str, Any], *,
             timeout: float = REQUEST_TIMEOUT_SECONDS) -> ServerResponse:
    """POST one streamed completion and read it to the end."""
    parts = urlsplit(server.completions_url)
    connection_class = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    connection = connection_class(parts.hostname, parts.port, timeout=CONNECT_TIMEOUT_SECONDS)
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if server.api_key:
        headers["Authorization"] = f"Bearer {server.api_key}"
    payload = json.dumps(body).encode("utf-8")
    where = f"server {server.name} ({server.url})"
    try:
        t0 = time.perf_counter()
        connection.request("POST", parts.path, payload, headers)
        if connection.sock is not None:
            connection.sock.settimeout(timeout)
        response = connection.getresponse()
        if response.status != 200:
            raise ServerError(f"{where} answered HTTP {response.status}: {_error_text(response.read())}")
        return _read_stream(response, t0, where)
    except (OSError, http.client.HTTPException) as e:
        raise ServerError(f"cannot reach {where}: {getattr(e, 'strerror', None) or e}") from None
    finally:
        connection.close()


def _error_text(raw: bytes) -> str:
    text = raw.decode("utf-8", "replace").strip()
    try:
        error = json.loads(text).get("error")
        if isinstance(error, dict):
            text = str(error.get("message") or error)
        elif error:
            text = str(error)
    except (ValueError, AttributeError):
        pass
    return " ".join(text.split())[:200] or "(no message)"


def _read_stream(response: http.client.HTTPResponse, t0: float, where: str) -> ServerResponse:
    first: float | None = None
    chunks = 0
    pieces: list[str] = []
    finish: str | None = None
    timings: dict[str, Any] = {}
    usage: dict[str, Any] = {}
    while True:
        line = response.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            break
        try:
            event = json.loads(data)
        except ValueError:
            raise ServerError(f"{where} sent a stream event that is not JSON: {data[:80]!r}") from None
        if "error" in event:
            raise ServerError(f"{where} reported an error: {_error_text(data)}")
        for choice in event.get("choices") or []:
            text = choice.get("text")
            if text is None:  # a chat-style delta
                text = (choice.get("delta") or {}).get("content")
            if text:
                if first is None:
                    first = time.perf_counter()
                chunks += 1
                pieces.append(text)
            finish = choice.get("finish_reason") or finish
        timings = event.get("timings") or timings
        usage = event.get("usage") or usage
    end = time.perf_counter()
    if isinstance(timings.get("predicted_n"), int):
        n, source = timings["predicted_n"], "timings"
    elif isinstance(usage.get("completion_tokens"), int):
        n, source = usage["completion_tokens"], "usage"
    else:
        n, source = chunks, "chunks"
    after_first = end - first if first is not None else 0.0
    return ServerResponse(
        n_generated=n,
        ttft_seconds=None if first is None else first - t0,
        total_seconds=end - t0,
        tokens_per_second=(n - 1) / after_first if n > 1 and after_first > 0 else None,
        server_tokens_per_second=_number(timings.get("predicted_per_second")),
        # llama-server leaves draft_n out of its timings when it drafted nothing
        drafted=timings.get("draft_n", 0) if "predicted_n" in timings else None,
        accepted=timings.get("draft_n_accepted", 0) if "predicted_n" in timings else None,
        finish_reason=finish,
        text="".join(pieces),
        count_source=source,
    )


def _number(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None
