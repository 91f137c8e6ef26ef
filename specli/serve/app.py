"""The HTTP side of `specli serve`: a Starlette app with OpenAI's routes, the chat page and specli's own
two (`/specli/props`, `/specli/cancel/{id}`), over one `GenerationWorker`.

A request is checked (the API key, the body's size and JSON, its fields as settings), its prompt
rendered and tokenized off the event loop, then queued as a job; its reply is the job's stream of
events, as server-sent events or one body. A client that goes away cancels its job. Every failure is
OpenAI's error shape with its status; nothing a request sends stops the server or the queue.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import hmac
import json
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from starlette.applications import Starlette
from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from specli.chat.prompt import ChatFormat
from specli.chat_template import ChatTemplateError
from specli.drafters.registry import colour_of
from specli.engine import GenerationParams
from specli.llama import PromptTooLong
from specli.serve.bodies import MAX_BODIES_IN_FLIGHT, BodyBudget, declared_length, read_body
from specli.serve.connections import HEAD_SECONDS
from specli.serve.conversation import ControlTokenInContent, Conversation
from specli.serve.origins import Admission, AdmissionMiddleware
from specli.serve.protocol import (
    CHAT,
    MAX_JSON_VALUES,
    RETRY_AFTER_SECONDS,
    TEXT,
    ApiError,
    CompletionRequest,
    Reply,
    bad_request,
    error_chunk,
    parse_completion_request,
    parse_json,
    shorten,
    sse,
)
from specli.serve.worker import (
    CANCELLED,
    CLIENT_GONE,
    LOADING,
    READY,
    SHUTDOWN,
    Failed,
    Finished,
    GenerationWorker,
    Job,
    NotAccepting,
    QueueFull,
)
from specli.settings import DEFAULT_HOST, RunSettings

if TYPE_CHECKING:
    from specli.api import Speculator

STATIC = Path(__file__).parent / "static"
KEEPALIVE_SECONDS = 10.0  # an SSE comment while a reply waits (queue, long prompt): proxies keep the line
START_TIME = time.time()
PREPARING_AT_ONCE = 2  # prompts rendered and tokenized at the same time (each may hold a large text)
PARSE_OFF_LOOP_BYTES = 64 * 1024  # bodies parsed in a thread from this size on (the loop keeps answering)

T = TypeVar("T")


@dataclass(frozen=True)
class ServeOptions:
    alias: str  # the model's id in /v1/models and in responses
    api_key: str | None = None
    max_waiting: int = 8  # requests that may wait while one generates
    read_timeout: float = HEAD_SECONDS  # seconds for a request's head, and between parts of its body
    host: str = DEFAULT_HOST  # the address listened on: its name is a Host the server answers
    allow_hosts: tuple[str, ...] = ()  # more names it answers for ("*": any)
    allow_origins: tuple[str, ...] = ()  # web pages (origins) that may call it, with CORS headers
    parse_special: bool = False  # a message's control-token texts are control tokens (else: text)


class Service:
    """What the routes share: the worker and its models, the server's default settings (the `serve`
    command's, after models.toml and the flags), the chat format, and a log of generations."""

    def __init__(self, defaults: RunSettings, options: ServeOptions, load: Callable[[], Speculator],
                 *, log: Callable[[str], None] | None = None, max_bodies: int = MAX_BODIES_IN_FLIGHT) -> None:
        self.defaults = defaults
        self.options = options
        self.log = log or (lambda line: print(f"specli: {line}", file=sys.stderr, flush=True))
        self.chat_format: ChatFormat | None = None
        self.conversation: Conversation | None = None  # how messages become tokens (content as text)
        self.bodies = BodyBudget(max_bodies)
        self.internal_errors = Throttle()
        self.load_error: BaseException | None = None
        self.on_ready: Callable[[Speculator], None] = lambda spec: None
        self.on_failed: Callable[[BaseException], None] = lambda error: None
        self.served = 0  # generations that ran (not those that left the queue before their turn)
        self.worker = GenerationWorker(load, max_waiting=options.max_waiting, on_loaded=self._loaded,
                                       on_ready=self._ready, on_failed=self._failed)
        self._stopping = asyncio.Event()  # set on the loop when the server begins to stop
        self._preparing = asyncio.Semaphore(PREPARING_AT_ONCE)
        self._large_bodies = 0  # requests with a large body still being answered

    async def large_body_done(self) -> None:
        """A request with a large body has been answered; when it was the last one, hand the memory
        its copies took back to the system (eight huge prompts at once otherwise left ~200 MB behind)."""
        self._large_bodies -= 1
        if self._large_bodies == 0:
            await asyncio.to_thread(release_free_memory)

    def begin_stopping(self) -> None:
        """From the event loop: requests still being read or prepared get 503 now, and the worker ends
        the running and waiting jobs."""
        self._stopping.set()
        self.worker.stop()

    async def unless_stopping(self, work: Awaitable[T]) -> T:
        """`work`'s result, or a 503 once the server begins to stop (a request that is still arriving
        or being tokenized is not worth the shutdown's wait)."""
        task = asyncio.ensure_future(work)
        stop = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        if task.done():
            return task.result()
        task.cancel()
        raise ApiError(503, "the server is stopping", type="server_error", code="unavailable")

    def _loaded(self, spec: Speculator) -> None:
        self.chat_format = ChatFormat.for_model(spec.target)
        self.conversation = Conversation(self.chat_format, parse_special=self.options.parse_special)

    def _ready(self, spec: Speculator) -> None:
        self.on_ready(spec)

    def _failed(self, error: BaseException) -> None:
        self.load_error = error
        self.on_failed(error)

    @property
    def spec(self) -> Speculator:
        spec, state = self.worker.spec, self.worker.state
        if spec is None or state != READY:
            if state == LOADING:
                raise ApiError(503, "the model is still loading: retry in a moment", type="server_error",
                               code="loading", headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
            raise ApiError(503, "the server is stopping", type="server_error", code="unavailable")
        return spec

    def tokens_for(self, text: str, where: str) -> list[int]:
        """A text prompt's tokens, refused (400) when they cannot fit the context: from the text's
        length alone where that shows it, without ever building the list of a huge prompt."""
        spec = self.spec
        try:
            return spec.target.tokenize(text, fit=spec.target.n_ctx)
        except PromptTooLong as e:
            raise _too_long(e, where) from None

    def authorize(self, request: Request) -> None:
        key = self.options.api_key
        if key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
            raise ApiError(401, "this server needs its API key: send the header Authorization: Bearer <key>",
                           code="invalid_api_key")

    # -- a completion -------------------------------------------------------------------------------

    def prepare(self, request: CompletionRequest) -> tuple[list[int], RunSettings]:
        """The prompt's tokens and the settings of the reply (a chat's reply also stops where the template
        ends a turn). Runs in a thread: templates and tokenizers take their time on long prompts."""
        spec = self.spec
        settings = request.settings
        n_ctx = spec.target.n_ctx
        if request.kind == CHAT:
            chat, conversation = self.chat_format, self.conversation
            assert chat is not None and conversation is not None and request.messages is not None
            try:
                tokens = conversation.tokens(request.messages, fit=n_ctx)
            except ChatTemplateError as e:
                raise bad_request(f"the model's chat template cannot render these messages: {e}",
                                  "messages") from None
            except PromptTooLong as e:
                raise _too_long(e, "messages") from None
            except ControlTokenInContent as e:
                raise bad_request(str(e), f"messages[{e.index}].content") from None
            settings = chat.reply_settings(settings)
        elif isinstance(request.prompt, str):
            tokens = self.tokens_for(request.prompt, "prompt")
        else:
            ids = request.prompt or []
            if len(ids) > n_ctx:
                raise _too_long(PromptTooLong(len(ids), n_ctx), "prompt")
            n_vocab = spec.target.n_vocab
            if (bad := next((t for t in ids if not 0 <= t < n_vocab), None)) is not None:
                raise bad_request(f"prompt: token id {bad} is not in the vocabulary (0 to {n_vocab - 1})",
                                  "prompt")
            tokens = list(ids)
        return tokens, settings

    async def complete(self, request: Request, kind: str) -> Response:
        self.authorize(request)
        spec = self.spec
        require_json(request)
        declared = declared_length(request)
        # The body's memory is charged from its first byte until its prompt is tokens (bodies.BodyBudget).
        with self.bodies.hold(declared) as charge:
            raw = await self.unless_stopping(read_body(request.receive, self.options.read_timeout, charge,
                                                       declared))
            big = len(raw) >= PARSE_OFF_LOOP_BYTES
            if big:
                request.state.large_body = True
                self._large_bodies += 1
            # A token-id prompt holds up to the context's size of numbers; nothing else needs many values.
            limit = MAX_JSON_VALUES + spec.target.n_ctx
            body = await asyncio.to_thread(parse_json, raw, limit) if big else parse_json(raw, limit)
            del raw
            completion = parse_completion_request(body, kind, self.defaults)
            del body  # a large prompt is held once, as the request's text
            async with self._preparing:
                tokens, settings = await self.unless_stopping(asyncio.to_thread(self.prepare, completion))
            stream, include_usage = completion.stream, completion.include_usage
            fresh = not completion.cache_prompt
            del completion  # the tokens stand for its text from here on
        reply = Reply(kind, self.options.alias, spec.drafter.name if spec.drafter else None)
        job = Job(reply.id, tokens, GenerationParams.of(settings), fresh=fresh)
        try:
            self.worker.submit(job)
        except QueueFull:
            raise ApiError(503, f"the server is busy: {self.worker.n_waiting} requests are already waiting "
                           "for the model; retry later", type="server_error", code="queue_full",
                           headers={"Retry-After": str(RETRY_AFTER_SECONDS)}) from None
        except NotAccepting as e:
            raise ApiError(503, str(e), type="server_error", code="unavailable",
                           headers={"Retry-After": str(RETRY_AFTER_SECONDS)}) from None
        if stream:
            return EventStream(self._stream(job, reply, include_usage),
                               on_disconnect=lambda: self.worker.cancel(job, CLIENT_GONE))
        finished = await self._collect(job, request.receive)
        return JSONResponse(reply.response(finished.text, finished.stats))

    async def _collect(self, job: Job, receive: Receive) -> Finished:
        watcher = asyncio.ensure_future(until_disconnected(receive))
        watcher.add_done_callback(lambda task: task.cancelled() or self.worker.cancel(job, CLIENT_GONE))
        try:
            while True:
                item = await job.next_item()
                if isinstance(item, Failed):
                    self._log_failure(job, item)
                    raise ApiError(500, f"the generation failed: {item.error}", type="server_error",
                                   code="generation_failed")
                if isinstance(item, Finished):
                    self._log(job, item)
                    if item.cut_short == SHUTDOWN:
                        raise _cut_by_shutdown(item)
                    return item
        finally:
            watcher.cancel()
            job.close()

    async def _stream(self, job: Job, reply: Reply, include_usage: bool) -> AsyncIterator[bytes]:
        try:
            first = reply.first_chunk()
            if first is not None:
                yield sse(first)
            while True:
                item = await job.next_item(KEEPALIVE_SECONDS)
                if item is None:
                    yield b": keep-alive\n\n"  # a comment: clients skip it
                    continue
                if isinstance(item, list):
                    data = b"".join(sse(reply.token_chunk(event)) for event in item if event.text)
                    if data:
                        yield data
                    continue
                if isinstance(item, Failed):
                    self._log_failure(job, item)
                    yield sse(error_chunk(ApiError(500, f"the generation failed: {item.error}",
                                                   type="server_error", code="generation_failed")))
                else:
                    self._log(job, item)
                    if item.cut_short == SHUTDOWN:
                        # The text so far was sent; the figures of what it cost go with the error.
                        figures = reply.figures(item.stats) if item.stats.n_prompt else {}
                        yield sse({**error_chunk(_cut_by_shutdown(item)), **figures})
                    else:
                        for chunk in reply.final_chunks(item.stats, include_usage):
                            yield sse(chunk)
                yield sse("[DONE]")
                return
        finally:
            job.close()

    def _log(self, job: Job, item: Finished) -> None:
        s = item.stats
        if not item.ran:
            self.log(f"{job.id}: {item.cut_short} before it started")
            return
        self.served += 1
        if not s.n_prompt:
            self.log(f"{job.id}: {item.cut_short} while its prompt of {len(job.tokens)} tokens was evaluated")
            return
        rate = s.tokens_per_second
        parts = [f"{job.id}: prompt {s.n_prompt} ({s.n_prompt - s.n_prompt_evaluated} cached)",
                 f"{s.n_generated} tokens", "n/a tok/s" if rate is None else f"{rate:.1f} tok/s"]
        if s.drafted:
            parts.append(f"accepted {s.accepted}/{s.drafted}")
        parts.append(f"stop: {s.stop_reason}" + (f" ({item.cut_short})" if item.cut_short else ""))
        self.log(" · ".join(parts))

    def _log_failure(self, job: Job, item: Failed) -> None:
        self.log(f"{job.id}: failed: {type(item.error).__name__}: {item.error}")

    # -- the other routes -------------------------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        state = self.worker.state
        if state != READY:
            message = "the model is still loading" if state == LOADING else f"the server is {state}"
            return JSONResponse({"status": state, **ApiError(503, message, type="server_error",
                                                             code="unavailable").body()}, 503)
        return JSONResponse({"status": "ok", "generating": self.worker.running is not None,
                             "waiting": self.worker.n_waiting})

    async def models(self, request: Request) -> Response:
        self.authorize(request)
        model = {"id": self.options.alias, "object": "model", "created": int(START_TIME),
                 "owned_by": "specli"}
        return JSONResponse({"object": "list", "data": [model]})

    async def props(self, request: Request) -> Response:
        """What the chat page needs: the model, the drafter and its sources' colours, the defaults."""
        self.authorize(request)
        spec = self.spec
        d = self.defaults
        sources = [s.name for s in spec.drafter.sources] if spec.drafter else []
        return JSONResponse({
            "model": self.options.alias,
            "target": spec.target.path.name,
            "draft": next((m.path.name for m in spec.drafter.models), None) if spec.drafter else None,
            "drafter": spec.drafter.name if spec.drafter else None,
            "sources": [{"name": n, "colour": colour_of(n)} for n in sources],
            "n_ctx": spec.target.n_ctx,
            "chat_template": self.chat_format.template_kind if self.chat_format else None,
            "base_model": bool(self.chat_format and self.chat_format.base_model),
            "defaults": {"temperature": d.temp, "top_k": d.top_k, "top_p": d.top_p, "min_p": d.min_p,
                         "speculative.n_max": d.draft_max, "speculative.p_min": d.draft_p_min,
                         "max_tokens": d.max_tokens, "seed": d.seed, "same_as_plain": d.same_as_plain},
            "max_waiting": self.options.max_waiting,
        })

    async def cancel(self, request: Request) -> Response:
        """Stop a running or waiting completion (the page's stop button): its stream ends as usual, with
        the figures of what was generated."""
        self.authorize(request)
        job_id = request.path_params["job_id"]
        job = self.worker.find(job_id)
        if job is None:
            raise ApiError(404, f"no running or waiting completion has the id {shorten(job_id, 60)!r}",
                           code="not_found")
        self.worker.cancel(job, CANCELLED)
        return JSONResponse({"id": job_id, "cancelled": True})

    async def page(self, request: Request) -> Response:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})



class Throttle:
    """At most one event per `seconds` let through; the ones held back are counted."""

    def __init__(self, seconds: float = 10.0) -> None:
        self.seconds = seconds
        self._last = -seconds
        self._held = 0

    def allow(self) -> int | None:
        """None: hold this one back; else how many were held back since the last one let through."""
        now = time.monotonic()
        if now - self._last < self.seconds:
            self._held += 1
            return None
        self._last, held, self._held = now, self._held, 0
        return held


def release_free_memory() -> None:
    """Collect the reference cycles that still hold a large request's texts (its exception's frames,
    the connection's buffers), then return the free memory of every arena to the system (glibc's
    malloc_trim; elsewhere only the collection)."""
    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError, TypeError):
        pass


def _too_long(error: PromptTooLong, where: str) -> ApiError:
    return ApiError(400, f"{error}: shorten it, or start the server with a larger -c",
                    code="context_length_exceeded", param=where)


def _cut_by_shutdown(item: Finished) -> ApiError:
    if not item.stats.n_prompt:
        return ApiError(503, "the server is stopping", type="server_error", code="unavailable")
    return ApiError(503, f"the server stopped during this reply: it is incomplete ({item.stats.n_generated} "
                    "tokens)", type="server_error", code="server_stopped")


def require_json(request: Request) -> None:
    """A completion's body must say it is JSON: a web page can send text/plain or a form to any
    address without asking first (no CORS preflight), but not application/json."""
    kind = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if kind != "application/json":
        shown = kind if len(kind) <= 60 else kind[:57] + "..."
        raise ApiError(415, f"the request body must be JSON sent with Content-Type: application/json "
                       f"(got {shown or 'no Content-Type'})", code="unsupported_media_type")


async def until_disconnected(receive: Receive) -> None:
    """Returns when the client has gone (the request's body already read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


class EventStream:
    """A `text/event-stream` response of `chunks`; `on_disconnect` is called if the client goes away
    before the end (the stream's job is cancelled, and the stream then ends with it)."""

    def __init__(self, chunks: AsyncIterator[bytes], on_disconnect: Callable[[], Any]) -> None:
        self.chunks = chunks
        self.on_disconnect = on_disconnect

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no")]})
        watcher = asyncio.ensure_future(until_disconnected(receive))
        watcher.add_done_callback(lambda task: task.cancelled() or self.on_disconnect())
        try:
            async for data in self.chunks:
                await send({"type": "http.response.body", "body": data, "more_body": True})
            watcher.cancel()
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            watcher.cancel()
            aclose = getattr(self.chunks, "aclose", None)
            if aclose is not None:
                await aclose()


# -- the app --------------------------------------------------------------------------------------------


def error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), error.status, headers=error.headers)


def _endpoint(handler: Callable[[Request], Awaitable[Response]], service: Service) -> Callable:
    """A route's handler whose failures are answers: an ApiError its status and shape, anything else a
    500 (and one log line); the server goes on either way."""

    async def endpoint(request: Request) -> Response:
        try:
            response = await handler(request)
        except ApiError as e:
            response = error_response(e)
        except ClientDisconnect:  # gone while its body was read: no one to answer
            response = Response(status_code=400)
        except Exception as e:  # noqa: BLE001 - a bug must not take the server down
            # One line per THROTTLE_SECONDS at most: a request that finds a bug can be sent in a loop.
            if (repeats := service.internal_errors.allow()) is not None:
                service.log(f"internal error on {request.method} {shorten(request.url.path, 60)}: "
                            f"{type(e).__name__}: {shorten(str(e))}"
                            + (f" (and {repeats} more since the last one shown)" if repeats else ""))
            response = error_response(ApiError(500, f"internal error: {type(e).__name__}: {e}",
                                               type="server_error", code="internal_error"))
        if getattr(request.state, "large_body", False):  # its texts are gone now: give the memory back
            await service.large_body_done()
        return response

    return endpoint


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's routing errors (no such route, a wrong method) in OpenAI's shape."""
    assert isinstance(exc, HTTPException)
    headers = dict(exc.headers or {})
    path = request.url.path if len(request.url.path) <= 100 else request.url.path[:97] + "..."
    if exc.status_code == 404:
        error = ApiError(404, f"unknown route: {request.method} {path}", code="unknown_url")
    elif exc.status_code == 405:
        allowed = headers.get("Allow", headers.get("allow", "?"))
        error = ApiError(405, f"{request.method} is not allowed on {path} (allowed: {allowed})",
                         code="method_not_allowed")
    else:
        error = ApiError(exc.status_code, str(exc.detail), code=None)
    error.headers.update(headers)
    return error_response(error)


def create_app(service: Service) -> ASGIApp:
    def route(path: str, handler: Callable[[Request], Awaitable[Response]], method: str) -> Route:
        return Route(path, _endpoint(handler, service), methods=[method])

    async def chat(request: Request) -> Response:
        return await service.complete(request, CHAT)

    async def text(request: Request) -> Response:
        return await service.complete(request, TEXT)

    routes = [
        route("/", service.page, "GET"),
        route("/health", service.health, "GET"),
        route("/v1/models", service.models, "GET"),
        route("/v1/chat/completions", chat, "POST"),
        route("/v1/completions", text, "POST"),
        route("/specli/props", service.props, "GET"),
        route("/specli/cancel/{job_id}", service.cancel, "POST"),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: _http_error})
    # A trailing slash is served as if it were not there (no redirect, whose Location would be built
    # from the request's Host header).
    app.router.redirect_slashes = False
    options = service.options
    served: ASGIApp = _without_trailing_slash(app)
    if options.allow_origins:
        served = CORSMiddleware(served, allow_origins=list(options.allow_origins),
                                allow_methods=["GET", "POST"], max_age=600,
                                allow_headers=["Authorization", "Content-Type"])
    admission = Admission.make(options.host, options.allow_hosts, options.allow_origins)
    return _hardened(AdmissionMiddleware(served, admission, lambda status, message, code: error_response(
        ApiError(status, message, code=code))))


# On every response: no other site may frame the page (it would lay its own buttons over ours), load
# scripts into it, or have a response read as another type than it says.
SECURITY_HEADERS = [
    (b"x-frame-options", b"DENY"),
    (b"content-security-policy", b"default-src 'self'; frame-ancestors 'none'; base-uri 'none'"),
    (b"x-content-type-options", b"nosniff"),
]
ERROR_CODES = {400: "invalid_request", 404: "unknown_url", 405: "method_not_allowed",
               416: "range_not_satisfiable", 500: "internal_error"}


def _hardened(app: ASGIApp) -> ASGIApp:
    """`app` with SECURITY_HEADERS on every response, and every error in OpenAI's JSON shape, the ones that
    come from outside the routes too (Starlette's CORS refusals, a static file's Range errors), their
    text as the message."""

    async def hardened(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        held: dict[str, Any] | None = None  # the start of an error response that is not JSON yet
        text = b""

        async def send_hardened(message: dict[str, Any]) -> None:
            nonlocal held, text
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *SECURITY_HEADERS]}
                if message["status"] >= 400 and b"json" not in _header(message, b"content-type"):
                    held = message
                    return
            elif held is not None and message["type"] == "http.response.body":
                text = (text + message.get("body", b""))[:1024]
                if not message.get("more_body", False):
                    await _send_as_json(held, text, send)
                return
            await send(message)

        await app(scope, receive, send_hardened)

    return hardened


def _header(message: dict[str, Any], name: bytes) -> bytes:
    return next((value.lower() for key, value in message["headers"] if key.lower() == name), b"")


async def _send_as_json(start: dict[str, Any], text: bytes, send: Send) -> None:
    status = start["status"]
    message = text.decode("utf-8", "replace").strip() or HTTPStatus(status).phrase
    kind = "invalid_request_error" if status < 500 else "server_error"
    error = ApiError(status, shorten(message), type=kind, code=ERROR_CODES.get(status))
    body = json.dumps(error.body(), ensure_ascii=False, separators=(",", ":")).encode()
    headers = MutableHeaders(raw=[(k, v) for k, v in start["headers"]
                                  if k.lower() not in (b"content-type", b"content-length")])
    headers["content-type"] = "application/json"
    headers["content-length"] = str(len(body))
    await send({**start, "headers": headers.raw})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def _without_trailing_slash(app: ASGIApp) -> ASGIApp:
    async def route(scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and len(path) > 1 and path.endswith("/"):
            scope = {**scope, "path": path.rstrip("/") or "/"}
        await app(scope, receive, send)

    return route
