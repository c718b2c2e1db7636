"""Data plane routes (``/v1/*``): OpenAI-compatible, errors in OpenAI's shape.

``POST /v1/completions`` and ``POST /v1/chat/completions`` are served by ``DataPlane``, a
plain ASGI layer in front of the FastAPI app: every client request passes through it, so it
skips the framework's routing, dependency and response machinery and keeps one helper task
per request (the disconnect watch). ``GET /v1/models`` is an ordinary FastAPI route.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from fastapi import APIRouter
from starlette.requests import Request

from controller.api.state import AppState, app_state
from controller.errors import RoutingError
from controller.router.answer import Answer, error_body, internal_error
from controller.router.proxy import Proxy

log = logging.getLogger("pdctl.router")
router = APIRouter()
ENDPOINTS = frozenset({"/v1/completions", "/v1/chat/completions"})

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


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
        await self.write(body, False)

    async def write(self, body: bytes, more: bool) -> None:
        self.complete = not more
        await self.send({"type": "http.response.body", "body": body, "more_body": more})


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
        async with proxy.serve(ctx) as answer:
            await _send(answer, ex, ctx.rid)
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
        watch.cancel()


async def _send(answer: Answer, ex: _Exchange, rid: str) -> None:
    if answer.body is not None:
        await ex.respond(answer.status, answer.body, rid, answer.content_type)
        return
    await ex.start(200, _headers(rid, "text/event-stream"))
    await answer.relay(ex.write)
    if not ex.complete:
        await ex.write(b"", False)


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
    m = s.model_profile
    return {"object": "list", "data": [{
        "id": s.model.public_name, "object": "model", "created": 0, "owned_by": "pdctl",
        "root": s.model.name, "max_model_len": m.max_model_len}]}
