"""Data plane routes (``/v1/*``): OpenAI-compatible, errors in OpenAI's shape."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

import anyio
import httpx
from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from controller.api.state import app_state
from controller.errors import ClientDisconnected, RoutingError
from controller.router.proxy import TAIL_BYTES, Ctx, Proxy, last_event, strip_usage_event

router = APIRouter()
T = TypeVar("T")
DONE = b"data: [DONE]"


def openai_error(exc: Exception, rid: str | None) -> JSONResponse:
    status = getattr(exc, "status_code", 500)
    kind = getattr(exc, "error_type", "server_error")
    headers = {"X-Request-Id": rid} if rid else None
    return JSONResponse({"error": {"message": str(exc), "type": kind, "code": status}},
                        status_code=status, headers=headers)


async def _wait_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def until_disconnect(request: Request, aw: Awaitable[T]) -> T:
    """Await ``aw``; if the client goes away first, cancel it and raise ClientDisconnected."""
    work = asyncio.ensure_future(aw)
    watch = asyncio.ensure_future(_wait_disconnect(request))
    try:
        await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if work.done():
        return work.result()
    work.cancel()
    with contextlib.suppress(BaseException):
        await work
    raise ClientDisconnected("client disconnected")


async def _relay(proxy: Proxy, ctx: Ctx, resp: httpx.Response) -> AsyncIterator[bytes]:
    tail = b""
    status, error = "cancelled", None
    try:
        async for chunk in resp.aiter_raw():
            if ctx.first_at is None:
                ctx.first_at = time.perf_counter()
            tail = (tail + chunk)[-TAIL_BYTES:]
            if ctx.strip_usage:
                chunk = strip_usage_event(chunk)
                if not chunk:
                    continue
            yield chunk
        status = "ok"
    except httpx.TransportError as exc:
        # Tokens already reached the client, so no retry: end the stream with a clear error.
        status, error = "error", f"decode instance failed mid-stream: {type(exc).__name__}"
        event = {"error": {"message": error, "type": "upstream_error", "code": 502}}
        yield f"data: {json.dumps(event)}\n\ndata: [DONE]\n\n".encode()
    finally:
        with anyio.CancelScope(shield=True):
            await resp.aclose()
        if status == "cancelled" and DONE in tail:
            status = "ok"  # the client had the whole stream and hung up before the engine did
        proxy.finish(ctx, status, last_event(tail), error)


async def serve(request: Request, endpoint: str) -> Response:
    proxy = app_state(request).proxy
    rid = request.headers.get("x-request-id")
    try:
        ctx = proxy.new_ctx(endpoint, await request.body(), rid)
    except RoutingError as exc:
        return openai_error(exc, rid)
    headers = {"X-Request-Id": ctx.rid}
    try:
        resp = await until_disconnect(request, proxy.open(ctx))
    except RoutingError as exc:
        proxy.fail(ctx, exc)
        return openai_error(exc, ctx.rid)
    if ctx.stream and resp.status_code == 200:
        return StreamingResponse(_relay(proxy, ctx, resp), media_type="text/event-stream",
                                 headers=headers)
    try:
        content = await until_disconnect(request, resp.aread())
    except (RoutingError, httpx.TransportError) as exc:
        proxy.fail(ctx, exc)
        return openai_error(exc, ctx.rid)
    finally:
        await resp.aclose()
    data: dict[str, Any] | None = None
    with contextlib.suppress(ValueError):
        data = json.loads(content)
    ok = resp.status_code == 200
    proxy.finish(ctx, "ok" if ok else "error", data if isinstance(data, dict) else None,
                 None if ok else f"decode answered {resp.status_code}")
    return Response(content, status_code=resp.status_code, headers=headers,
                    media_type=resp.headers.get("content-type", "application/json"))


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    return await serve(request, "/v1/completions")


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    return await serve(request, "/v1/chat/completions")


@router.get("/v1/models")
async def models(request: Request) -> dict[str, Any]:
    s = app_state(request).settings
    m = app_state(request).cluster.model
    return {"object": "list", "data": [{
        "id": s.model.public_name, "object": "model", "created": 0, "owned_by": "pdctl",
        "root": s.model.name, "max_model_len": m.max_model_len}]}
