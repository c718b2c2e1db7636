"""Data plane routes (``/v1/*``): OpenAI-compatible, errors in OpenAI's shape.

``POST /v1/completions`` and ``POST /v1/chat/completions`` are served by ``WireLane`` in the
controller's listener (and its router workers'): the listener's protocol hands it the parsed
request, with no ASGI app in between. Under any other ASGI server (the tests' clients)
``DataPlane``, a plain ASGI layer in front of the FastAPI app, serves them instead; both
answer through ``_answer_body``, skipping the framework's routing, dependency and
response machinery, with one helper task per request at most (the disconnect watch, where the
server does not tell a client's going: the controller's own listener does,
``listener.ClientGone``). ``GET /v1/models`` is an ordinary FastAPI route.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Coroutine
from dataclasses import dataclass
from functools import partial
from typing import Any, cast

from fastapi import APIRouter
from starlette.requests import Request
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, RequestResponseCycle

from controller.api.asgi import ASGIApp, Receive, Scope, Send
from controller.api.listener import client_gone
from controller.api.state import app_state
from controller.config import ControllerSettings
from controller.errors import InvalidApiKey, PayloadTooLarge, RequestTimeout, RoutingError
from controller.obs.logs import bind_request
from controller.router.answer import Answer, error_body, internal_error
from controller.router.proxy import Proxy
from controller.router.request import trace_context

log = logging.getLogger("pdctl.router")
data_routes = APIRouter()
ENDPOINTS = frozenset({"/v1/completions", "/v1/chat/completions"})



def _headers(rid: str | None, content_type: str, length: int | None = None,
             extra: list[tuple[bytes, bytes]] | None = None) -> list[tuple[bytes, bytes]]:
    out = [(b"content-type", content_type.encode("latin-1"))]
    if length is not None:
        out.append((b"content-length", str(length).encode()))
    if rid:
        out.append((b"x-request-id", rid.encode("latin-1")))
    if extra:
        out.extend(extra)
    return out


class _Exchange:
    """One client request's response side: where it is sent, and whether it is complete
    (after which uvicorn answers ``receive()`` with ``http.disconnect``, which the watch must
    then not take for a client that left)."""

    def __init__(self, send: Send) -> None:
        self.send = send
        self.close = False  # ask the server to close the connection after the answer
        self.started = False
        self.complete = False
        self.client_gone = False

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.started = True
        if self.close:
            headers.append((b"connection", b"close"))
        await self.send({"type": "http.response.start", "status": status, "headers": headers})

    async def respond(self, status: int, body: bytes, rid: str | None,
                      content_type: str = "application/json",
                      extra: list[tuple[bytes, bytes]] | None = None) -> None:
        await self.start(status, _headers(rid, content_type, len(body), extra))
        await self.write(body, False)

    async def write(self, body: bytes, more: bool) -> None:
        self.complete = not more
        await self.send({"type": "http.response.body", "body": body, "more_body": more})


class _WireExchange(_Exchange):
    """The response side written straight to the connection (``WireLane``): the status line
    and headers go out with the first part of the body, in one write, as one ``bytes``
    each time; uvicorn's cycle is kept in step (started, complete, keep-alive, the next
    request's turn), as its own ``send`` would."""

    def __init__(self, cycle: RequestResponseCycle) -> None:
        super().__init__(_no_send)
        self.cycle = cycle
        self._head = b""
        self._chunked = False

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        cycle = self.cycle
        self.started = cycle.response_started = True
        cycle.waiting_for_100_continue = False
        parts = [STATUS_LINE[status]]
        chunked = True
        for name, value in headers:  # the router's own, or values an HTTP parser took
            parts += (name, b": ", value, b"\r\n")
            if name == b"content-length":
                chunked = False
        if self.close or not cycle.keep_alive:
            cycle.keep_alive = False
            parts.append(b"connection: close\r\n")
        if chunked:
            parts.append(b"transfer-encoding: chunked\r\n")
        parts.append(b"\r\n")
        self._head, self._chunked = b"".join(parts), chunked

    async def write(self, body: bytes, more: bool) -> None:
        cycle = self.cycle
        if cycle.flow.write_paused and not cycle.disconnected:
            await cycle.flow.drain()  # a slow client: wait for its window
        self.complete = not more
        if cycle.disconnected:
            return
        if self._chunked:
            data = b"%x\r\n%b\r\n" % (len(body), body) if body else b""
            if not more:
                data += b"0\r\n\r\n"
        else:
            data = body
        if self._head:
            data, self._head = self._head + data, b""
        cycle.transport.write(data)
        if not more:
            cycle.response_complete = True
            cycle.message_event.set()
            if not cycle.keep_alive:
                cycle.transport.close()
            cycle.on_response()


async def _no_send(message: Any) -> None:
    raise AssertionError("a wire exchange writes to its connection, not through ASGI")


@dataclass(frozen=True)
class BodyLimits:
    max_bytes: int
    timeout_s: float

    def too_large(self) -> PayloadTooLarge:
        return PayloadTooLarge(f"request body over the limit of {self.max_bytes} bytes "
                               "(controller.max_body_bytes)")


async def _read_body(receive: Receive, limits: BodyLimits) -> bytes | None:
    """The request body, or None when the client left before sending all of it. Raises
    ``PayloadTooLarge`` past ``max_bytes`` and ``RequestTimeout`` when it is not all there
    within ``timeout_s``."""
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(limits.timeout_s):
            while True:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    return None
                chunk = msg.get("body", b"")
                size += len(chunk)
                if size > limits.max_bytes:
                    raise limits.too_large()
                chunks.append(chunk)
                if not msg.get("more_body"):
                    return b"".join(chunks)
    except TimeoutError:
        raise RequestTimeout(f"request body not received within {limits.timeout_s:g} s "
                             "(controller.body_timeout_s)") from None


@dataclass(frozen=True)
class _Headers:
    rid: str | None
    media: bytes | None  # ``Content-Type`` without parameters
    trace: tuple[tuple[str, str], ...]  # the W3C trace context both hops carry


def _request_headers(scope: Scope) -> _Headers:
    """What the router reads of a request's headers."""
    rid = media = traceparent = tracestate = None
    for name, value in scope["headers"]:
        if name == b"x-request-id":
            rid = bytes(value).decode("latin-1")
        elif name == b"content-type":
            media = bytes(value).partition(b";")[0].strip().lower()
        elif name == b"traceparent":
            traceparent = bytes(value).decode("latin-1")
        elif name == b"tracestate":
            tracestate = bytes(value).decode("latin-1")
    return _Headers(rid, media, trace_context(traceparent, tracestate))


def _client_left(task: asyncio.Task[Any], ex: _Exchange) -> None:
    """The request's client went away: unless its response is complete, cancel the request's
    task (the upstream request is then closed, which aborts it on the engine)."""
    if not ex.complete:
        ex.client_gone = True
        task.cancel()


async def _watch(receive: Receive, task: asyncio.Task[Any], ex: _Exchange) -> None:
    """``_client_left`` once ``receive()`` says the client went away: for a server that does
    not tell it (``ClientGone``)."""
    while (await receive())["type"] != "http.disconnect":
        pass
    _client_left(task, ex)


async def serve_request(proxy: Proxy, endpoint: str, scope: Scope, receive: Receive,
                        send: Send, loop: asyncio.AbstractEventLoop, limits: BodyLimits) -> None:
    """An inference request reached through ASGI (``DataPlane``)."""
    h = _request_headers(scope)
    ex = _Exchange(send)
    try:
        raw = await _read_body(receive, limits)
    except RoutingError as exc:
        await _answer_body(proxy, endpoint, h, ex, exc, loop, scope, receive)
        return
    if raw is not None:
        await _answer_body(proxy, endpoint, h, ex, raw, loop, scope, receive)


async def _answer_body(proxy: Proxy, endpoint: str, h: _Headers, ex: _Exchange,
                       body: bytes | RoutingError, loop: asyncio.AbstractEventLoop,
                       scope: Scope, receive: Receive) -> None:
    """Answer one inference request whose body is read (or refused, ``body`` the reason)."""
    if isinstance(body, RoutingError):
        ctx = proxy.refused(endpoint, h.rid, body)
        ex.close = True  # the rest of the body is not read: close after the answer
    else:
        ctx = proxy.new_ctx(endpoint, body, h.rid, h.media, h.trace)
    bind_request(ctx.rid, ctx.trace)  # what this request's log lines carry
    task = asyncio.current_task(loop)
    assert task is not None
    gone = client_gone(scope)
    watch = None
    if gone is not None:  # the controller's listener tells it: no task waiting on receive()
        gone.callback = partial(_client_left, task, ex)
    else:
        watch = loop.create_task(_watch(receive, task, ex))
    try:
        async with proxy.serve(ctx) as answer:
            await _write_answer(answer, ex, ctx.rid)
    except asyncio.CancelledError:
        if not ex.client_gone:
            raise  # the server is shutting down: not ours to swallow
        task.uncancel()
    except Exception as exc:
        # A bug while answering (recorded by ``serve``): the client still gets an answer.
        log.exception("%s: unexpected error", ctx.rid)
        if not ex.started:
            await ex.respond(*error_body(RuntimeError(internal_error(exc))), ctx.rid)
    finally:
        if watch is not None:
            watch.cancel()
        elif gone is not None:
            gone.callback = None


async def _write_answer(answer: Answer, ex: _Exchange, rid: str) -> None:
    if answer.body is not None:
        await ex.respond(answer.status, answer.body, rid, answer.content_type, answer.headers)
        return
    await ex.start(200, _headers(rid, "text/event-stream"))
    await answer.relay(ex.write)
    if not ex.complete:
        await ex.write(b"", False)


def authorized(scope: Scope, expected: bytes) -> bool:
    """The request sends ``expected`` (``Bearer <key>``) as its ``Authorization``."""
    for name, value in scope["headers"]:
        if name == b"authorization":
            return hmac.compare_digest(bytes(value), expected)
    return False


async def refuse_unauthorized(ex: _Exchange) -> None:
    """401 in OpenAI's shape; the connection is closed after it (its body is not read)."""
    ex.close = True
    status, body = error_body(InvalidApiKey(
        "missing or invalid API key: send it as 'Authorization: Bearer <key>'"))
    await ex.respond(status, body, None, extra=[(b"www-authenticate", b"Bearer")])


class _InferenceRoutes:
    """What both ways into the inference routes (``DataPlane``, ``WireLane``) hold: the
    proxy, the body's limits, the API key every ``/v1/*`` request must send
    (``controller.api_key``), and the running loop."""

    def __init__(self, proxy: Proxy, cs: ControllerSettings) -> None:
        self.proxy = proxy
        self.limits = BodyLimits(cs.max_body_bytes, cs.body_timeout_s)
        self._key = f"Bearer {cs.api_key}".encode() if cs.api_key else None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _unauthorized(self, scope: Scope) -> bool:
        return self._key is not None and not authorized(scope, self._key)

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is None or loop.is_closed():
            # Looked up once: on Python 3.11 each lookup is a getpid() system call.
            loop = self._loop = asyncio.get_running_loop()
        return loop


class DataPlane(_InferenceRoutes):
    """ASGI middleware: the OpenAI inference routes, straight to the proxy; everything else
    (and the lifespan) goes on to the FastAPI app. With ``controller.api_key`` every
    ``/v1/*`` request must send it as a bearer token."""

    def __init__(self, app: ASGIApp, proxy: Proxy, cs: ControllerSettings) -> None:
        super().__init__(proxy, cs)
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] == "http" and scope["path"].startswith("/v1/")
                and self._unauthorized(scope)):
            await refuse_unauthorized(_Exchange(send))
            return
        if (scope["type"] == "http" and scope["path"] in ENDPOINTS
                and scope["method"] == "POST"):
            await serve_request(self.proxy, scope["path"], scope, receive, send,
                                self._running_loop(), self.limits)
            return
        await self.app(scope, receive, send)


class WireLane(_InferenceRoutes):
    """The inference routes served by the listener's protocol itself
    (``listener.protocol_class``), with no ASGI between the connection and the proxy: no
    scope-bound ``receive``/``send`` messages, no application frames on every resumption of
    the request's task, the body taken as the parser left it when it came whole with the
    headers (the usual case), and the response head written with its first body part. The
    answers, records and errors are ``DataPlane``'s: the same ``_answer_body``."""

    def __call__(self, cycle: RequestResponseCycle) -> Coroutine[Any, Any, None] | None:
        """The coroutine serving ``cycle``'s request, or None: not an inference request."""
        scope = cycle.scope
        if scope["method"] != "POST" or scope["path"] not in ENDPOINTS:
            return None
        return self._run(cycle)

    async def _run(self, cycle: RequestResponseCycle) -> None:
        try:
            await self._answer(cycle)
        except BaseException as exc:
            if not isinstance(exc, asyncio.CancelledError):
                log.error("unexpected error while serving %s", cycle.scope["path"],
                          exc_info=exc)
            if not cycle.response_started and not cycle.disconnected:
                ex = _WireExchange(cycle)
                ex.close = True
                await ex.respond(*error_body(RuntimeError(internal_error(exc))), None)
            elif not cycle.response_complete:
                cycle.transport.close()
        else:
            if not cycle.response_complete and not cycle.disconnected:
                cycle.transport.close()  # never left half-written on a kept connection
        finally:
            cycle.on_response = _nothing

    async def _answer(self, cycle: RequestResponseCycle) -> None:
        scope = cast(Scope, cycle.scope)
        receive = cast(Receive, cycle.receive)
        ex = _WireExchange(cycle)
        if self._unauthorized(scope):
            await refuse_unauthorized(ex)
            return
        body: bytes | RoutingError | None
        if cycle.more_body:  # the body comes in more reads (or after 100-continue)
            try:
                body = await _read_body(receive, self.limits)
            except RoutingError as exc:
                body = exc
            if body is None:
                return  # the client left before sending it all
        else:
            body = bytes(cycle.body)
            cycle.body.clear()
            if len(body) > self.limits.max_bytes:
                body = self.limits.too_large()
        await _answer_body(self.proxy, scope["path"], _request_headers(scope), ex, body,
                           self._running_loop(), scope, receive)


def _nothing() -> None:
    pass


@data_routes.get("/v1/models", name="models")  # the OpenAPI operation keeps its id
async def list_models(request: Request) -> dict[str, Any]:
    s = app_state(request).settings
    return {"object": "list", "data": [{
        "id": s.model.public_name, "object": "model", "created": 0, "owned_by": "pdctl",
        "root": s.model.profile_name, "max_model_len": s.served_context}]}
