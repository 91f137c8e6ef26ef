"""The HTTP side of `specli serve`: a Starlette app with OpenAI's routes, the chat page and specli's own
two (`/specli/props`, `/specli/cancel/{id}`), over one `GenerationWorker`.

A request is checked (the API key, the body's size and JSON, its fields as settings), its prompt
rendered and tokenized off the event loop, then queued as a job; its reply is the job's stream of
events, as server-sent events or one body. A client that goes away cancels its job. Every failure is
OpenAI's error shape with its status; nothing a request sends stops the server or the queue.
"""

from __future__ import annotations

import asyncio
import hmac
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import Receive, Scope, Send

from specli.chat.prompt import ChatFormat
from specli.chat_template import ChatTemplateError
from specli.drafters.registry import colour_of
from specli.serve.protocol import (
    CHAT,
    MAX_BODY_BYTES,
    TEXT,
    ApiError,
    CompletionRequest,
    Reply,
    bad_request,
    error_chunk,
    parse_completion_request,
    parse_json,
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
from specli.settings import RunSettings

if TYPE_CHECKING:
    from specli.api import Speculator

STATIC = Path(__file__).parent / "static"
KEEPALIVE_SECONDS = 10.0  # an SSE comment while a reply waits (queue, long prompt): proxies keep the line
RETRY_AFTER_SECONDS = 2
START_TIME = time.time()


@dataclass(frozen=True)
class ServeOptions:
    alias: str  # the model's id in /v1/models and in responses
    api_key: str | None = None
    max_waiting: int = 8  # requests that may wait while one generates


class Service:
    """What the routes share: the worker and its models, the server's default settings (the `serve`
    command's, after models.toml and the flags), the chat format, and a log of generations."""

    def __init__(self, defaults: RunSettings, options: ServeOptions, load: Callable[[], Speculator],
                 *, log: Callable[[str], None] | None = None) -> None:
        self.defaults = defaults
        self.options = options
        self.log = log or (lambda line: print(f"specli: {line}", file=sys.stderr, flush=True))
        self.chat_format: ChatFormat | None = None
        self.load_error: BaseException | None = None
        self.on_ready: Callable[[Speculator], None] = lambda spec: None
        self.on_failed: Callable[[BaseException], None] = lambda error: None
        self.served = 0
        self.worker = GenerationWorker(load, max_waiting=options.max_waiting,
                                       on_ready=self._ready, on_failed=self._failed)

    def _ready(self, spec: Speculator) -> None:
        self.chat_format = ChatFormat.for_model(spec.target)
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
        if request.kind == CHAT:
            chat = self.chat_format
            assert chat is not None and request.messages is not None
            try:
                text = chat.render(request.messages)
            except ChatTemplateError as e:
                raise bad_request(f"the model's chat template cannot render these messages: {e}",
                                  "messages") from None
            tokens, settings, where = chat.tokenize(text), chat.reply_settings(settings), "messages"
        elif isinstance(request.prompt, str):
            tokens, where = spec.tokenize(request.prompt), "prompt"
        else:
            tokens, where = list(request.prompt or []), "prompt"
            n_vocab = spec.target.n_vocab
            if (bad := next((t for t in tokens if not 0 <= t < n_vocab), None)) is not None:
                raise bad_request(f"prompt: token id {bad} is not in the vocabulary (0 to {n_vocab - 1})",
                                  "prompt")
        n_ctx = spec.target.n_ctx
        if len(tokens) >= n_ctx:
            raise ApiError(400, f"the prompt is {len(tokens)} tokens but the context holds {n_ctx}: shorten "
                           "it, or start the server with a larger -c", code="context_length_exceeded",
                           param=where)
        return tokens, settings

    async def complete(self, request: Request, kind: str) -> Response:
        self.authorize(request)
        spec = self.spec
        body = parse_json(await read_body(request))
        completion = parse_completion_request(body, kind, self.defaults)
        tokens, settings = await asyncio.to_thread(self.prepare, completion)
        reply = Reply(kind, self.options.alias, spec.drafter.name if spec.drafter else None)
        job = Job(reply.id, tokens, settings.generation_params(), settings.draft_p_min)
        try:
            self.worker.submit(job)
        except QueueFull:
            raise ApiError(503, f"the server is busy: {self.worker.n_waiting} requests are already waiting "
                           "for the model; retry later", type="server_error", code="queue_full",
                           headers={"Retry-After": str(RETRY_AFTER_SECONDS)}) from None
        except NotAccepting as e:
            raise ApiError(503, str(e), type="server_error", code="unavailable",
                           headers={"Retry-After": str(RETRY_AFTER_SECONDS)}) from None
        if completion.stream:
            return EventStream(self._stream(job, reply, completion.include_usage),
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
                    if item.cut_short == SHUTDOWN and not item.stats.n_prompt:
                        raise ApiError(503, "the server is stopping", type="server_error", code="unavailable")
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
                    if item.cut_short == SHUTDOWN and not item.stats.n_prompt:
                        yield sse(error_chunk(ApiError(503, "the server is stopping", type="server_error",
                                                       code="unavailable")))
                    else:
                        for chunk in reply.final_chunks(item.stats, include_usage):
                            yield sse(chunk)
                yield sse("[DONE]")
                return
        finally:
            job.close()

    def _log(self, job: Job, item: Finished) -> None:
        self.served += 1
        s = item.stats
        if not s.n_prompt:
            self.log(f"{job.id}: {item.cut_short} before it started")
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
            "chat_template": "fallback ChatML" if self.chat_format and self.chat_format.template.is_fallback
            else "gguf",
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
            raise ApiError(404, f"no running or waiting completion has the id {job_id!r}", code="not_found")
        self.worker.cancel(job, CANCELLED)
        return JSONResponse({"id": job_id, "cancelled": True})

    async def page(self, request: Request) -> Response:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})



async def read_body(request: Request) -> bytes:
    """The body, refused (413) past MAX_BODY_BYTES before more of it is read."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            too_big = int(declared) > MAX_BODY_BYTES
        except ValueError:
            raise ApiError(400, "the Content-Length header is not a number", code="invalid_header") from None
        if too_big:
            raise _too_large()
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise _too_large()
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large() -> ApiError:
    return ApiError(413, f"the request body is over this server's limit of {MAX_BODY_BYTES // 2**20} MiB",
                    code="request_too_large")


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


def _endpoint(handler: Callable[[Request], Awaitable[Response]], log: Callable[[str], None]) -> Callable:
    """A route's handler whose failures are answers: an ApiError its status and shape, anything else a
    500 (and one log line); the server goes on either way."""

    async def endpoint(request: Request) -> Response:
        try:
            return await handler(request)
        except ApiError as e:
            return error_response(e)
        except Exception as e:  # noqa: BLE001 - a bug must not take the server down
            log(f"internal error on {request.method} {request.url.path}: {type(e).__name__}: {e}")
            return error_response(ApiError(500, f"internal error: {type(e).__name__}: {e}",
                                           type="server_error", code="internal_error"))

    return endpoint


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's routing errors (no such route, a wrong method) in OpenAI's shape."""
    assert isinstance(exc, HTTPException)
    headers = dict(exc.headers or {})
    where = f"{request.method} {request.url.path}"
    if exc.status_code == 404:
        error = ApiError(404, f"unknown route: {where}", code="unknown_url")
    elif exc.status_code == 405:
        allowed = headers.get("Allow", headers.get("allow", "?"))
        error = ApiError(405, f"{request.method} is not allowed on {request.url.path} (allowed: {allowed})",
                         code="method_not_allowed")
    else:
        error = ApiError(exc.status_code, str(exc.detail), code=None)
    error.headers.update(headers)
    return error_response(error)


def create_app(service: Service) -> Starlette:
    def route(path: str, handler: Callable[[Request], Awaitable[Response]], method: str) -> Route:
        return Route(path, _endpoint(handler, service.log), methods=[method])

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
    return Starlette(routes=routes, exception_handlers={HTTPException: _http_error})
