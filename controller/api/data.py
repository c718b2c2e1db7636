"""Data plane routes (``/v1/*``): OpenAI-compatible, errors in OpenAI's shape.

``POST /v1/completions`` and ``POST /v1/chat/completions`` are served by ``DataPlane``, a
plain ASGI layer in front of the FastAPI app: every client request passes through it, so it
skips the framework's routing, dependency and response machinery and keeps one helper task
per request (the disconnect watch). ``GET /v1/models`` is an ordinary FastAPI route.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson
from fastapi import APIRouter
from starlette.requests import Request

from controller.api.state import AppState, app_state
from controller.errors import RoutingError, UpstreamUnreachable
from controller.router.proxy import TAIL_BYTES, Ctx, Proxy, last_event, strip_usage_event
from controller.router.upstream import Stream, UpstreamError

log = logging.getLogger("pdctl.router")
router = APIRouter()
DONE = b"data: [DONE]"
DONE_EVENT = b"data: [DONE]\n\n"
ENDPOINTS = frozenset({"/v1/completions", "/v1/chat/completions"})

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def error_body(exc: Exception) -> tuple[int, bytes]:
    status = getattr(exc, "status_code", 500)
    kind = getattr(exc, "error_type", "server_error")
    return status, json.dumps({"error": {"message": str(exc), "type": kind,
                                         "code": status}}).encode()


def _headers(rid: str | None, content_type: str, length: int | None = None
             ) -> list[tuple[bytes, bytes]]:
    out = [(b"content-type", content_type.encode("latin-1"))]
    if length is not None:
        out.append((b"content-length", str(length).encode()))
    if rid:
        out.append((b"x-request-id", rid.encode("latin-1")))
    return out


class _Exchange:
    """One client request's response side: where it is sent, and whether it is complete
    (after which uvicorn answers ``receive()`` with ``http.disconnect``, which the watch must
    then not take for a client that left)."""

    def __init__(self, send: Send) -> None:
        self.send = send
        self.started = False
        self.complete = False
        self.client_gone = False

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.started = True
        await self.send({"type": "http.response.start", "status": status, "headers": headers})

    async def respond(self, status: int, body: bytes, rid: str | None,
                      content_type: str = "application/json") -> None:
        await self.start(status, _headers(rid, content_type, len(body)))
        await self.end(body)

    async def end(self, body: bytes = b"") -> None:
        self.complete = True
        await self.send({"type": "http.response.body", "body": body, "more_body": False})


async def _read_body(receive: Receive) -> bytes | None:
    """The request body, or None when the client left before sending all of it."""
    chunks: list[bytes] = []
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return None
        chunks.append(msg.get("body", b""))
        if not msg.get("more_body"):
            return b"".join(chunks)


def _request_id(scope: Scope) -> str | None:
    for name, value in scope["headers"]:
        if name == b"x-request-id":
            return bytes(value).decode("latin-1")
    return None


async def _watch(receive: Receive, task: asyncio.Task[Any], ex: _Exchange) -> None:
    """Cancel the request's task when its client goes away before the response is complete
    (the upstream request is then closed, which aborts it on the engine)."""
    while (await receive())["type"] != "http.disconnect":
        pass
    if not ex.complete:
        ex.client_gone = True
        task.cancel()


async def serve(proxy: Proxy, endpoint: str, scope: Scope, receive: Receive, send: Send,
                loop: asyncio.AbstractEventLoop) -> None:
    raw = await _read_body(receive)
    if raw is None:
        return
    rid = _request_id(scope)
    ex = _Exchange(send)
    try:
        ctx = proxy.new_ctx(endpoint, raw, rid)
    except RoutingError as exc:
        await ex.respond(*error_body(exc), rid)
        return
    task = asyncio.current_task(loop)
    assert task is not None
    watch = loop.create_task(_watch(receive, task, ex))
    try:
        await _exchange(proxy, ctx, ex)
    except asyncio.CancelledError:
        if not ex.client_gone:
            raise  # the server is shutting down: not ours to swallow
        task.uncancel()
        if not ctx.finished:
            proxy.finish(ctx, "cancelled", None, "client disconnected")
    except Exception as exc:
        # A bug, not an engine's failure: still record the request and answer the client.
        log.exception("%s: unexpected error", ctx.rid)
        err = RuntimeError(f"internal error in the router: {type(exc).__name__}: {exc}")
        if not ctx.finished:
            proxy.fail(ctx, err)
        if not ex.started:
            await ex.respond(*error_body(err), ctx.rid)
    finally:
        watch.cancel()


async def _exchange(proxy: Proxy, ctx: Ctx, ex: _Exchange) -> None:
    try:
        resp = await proxy.open(ctx)
    except RoutingError as exc:
        proxy.fail(ctx, exc)
        await ex.respond(*error_body(exc), ctx.rid)
        return
    try:
        if ctx.stream and resp.status == 200:
            await _relay(proxy, ctx, resp, ex)
        else:
            await _whole(proxy, ctx, resp, ex)
    finally:
        resp.close()


async def _whole(proxy: Proxy, ctx: Ctx, resp: Stream, ex: _Exchange) -> None:
    try:
        content = await resp.read()
    except UpstreamError as exc:
        err = UpstreamUnreachable(f"decode instance failed before answering: {exc}")
        proxy.fail(ctx, err)
        await ex.respond(*error_body(err), ctx.rid)
        return
    data: Any = None
    try:
        data = orjson.loads(content)
    except ValueError:
        pass
    ok = resp.status == 200
    proxy.finish(ctx, "ok" if ok else "error", data if isinstance(data, dict) else None,
                 None if ok else f"decode answered {resp.status}")
    await ex.respond(resp.status, content, ctx.rid, resp.content_type)


async def _relay(proxy: Proxy, ctx: Ctx, resp: Stream, ex: _Exchange) -> None:
    send = ex.send
    await ex.start(200, _headers(ctx.rid, "text/event-stream"))
    tail = b""
    status, error = "cancelled", None
    try:
        async for chunk in resp.chunks():
            if ctx.first_at is None:
                ctx.first_at = time.perf_counter()
            tail = (tail + chunk)[-TAIL_BYTES:]
            if ex.complete:
                continue  # after [DONE]: only the upstream's end of body is left to read
            if ctx.strip_usage:
                chunk = strip_usage_event(chunk)
                if not chunk:
                    continue
            if chunk.endswith(DONE_EVENT):
                # The stream's last event: send it with the end of the body (one write).
                await ex.end(chunk)
                continue
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        status = "ok"
    except UpstreamError as exc:
        if ex.complete:
            status = "ok"  # the client had the whole stream; only the engine's close failed
            return
        # Tokens already reached the client, so no retry: end the stream with a clear error.
        status, error = "error", f"decode instance failed mid-stream: {exc}"
        event = {"error": {"message": error, "type": "upstream_error", "code": 502}}
        await send({"type": "http.response.body", "more_body": True,
                    "body": f"data: {json.dumps(event)}\n\ndata: [DONE]\n\n".encode()})
    finally:
        if status == "cancelled" and DONE in tail:
            status = "ok"  # the client had the whole stream and hung up before the engine did
        proxy.finish(ctx, status, last_event(tail), error)
    if not ex.complete:
        await ex.end()


class DataPlane:
    """ASGI middleware: the OpenAI inference routes, straight to the proxy; everything else
    (and the lifespan) goes on to the FastAPI app."""

    def __init__(self, app: ASGIApp, state: AppState) -> None:
        self.app = app
        self.proxy = state.proxy
        self._loop: asyncio.AbstractEventLoop | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] == "http" and scope["path"] in ENDPOINTS
                and scope["method"] == "POST"):
            loop = self._loop
            if loop is None or loop.is_closed():
                # Looked up once: on Python 3.11 each lookup is a getpid() system call.
                loop = self._loop = asyncio.get_running_loop()
            await serve(self.proxy, scope["path"], scope, receive, send, loop)
            return
        await self.app(scope, receive, send)


@router.get("/v1/models")
async def models(request: Request) -> dict[str, Any]:
    s = app_state(request).settings
    m = app_state(request).cluster.model
    return {"object": "list", "data": [{
        "id": s.model.public_name, "object": "model", "created": 0, "owned_by": "pdctl",
        "root": s.model.name, "max_model_len": m.max_model_len}]}
