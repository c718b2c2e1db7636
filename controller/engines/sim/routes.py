"""HTTP endpoints of the simulated engine: vLLM's OpenAI surface, /metrics, and /sim/*.

Handlers parse, submit to the engine and render; a watcher task per generation request
aborts the request in the engine when the client disconnects.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from controller.engines.sim import responses as out
from controller.engines.sim.config import SimEngineConfig
from controller.engines.sim.engine import SimEngine
from controller.engines.sim.kv_pull import KvRefused
from controller.engines.sim.protocol import (
    EngineError,
    SimRequest,
    parse_request,
    rejected_remote_prefill,
)
from controller.engines.sim.push import Pushed, Registration
from controller.engines.sim.stream import RequestStream
from controller.engines.sim.text import prompt_seed

TRACES_KEPT = 256


@dataclass(frozen=True)
class SimState:
    """Everything the handlers share, fixed at app creation."""

    cfg: SimEngineConfig
    engine: SimEngine
    ready_at: float  # time.monotonic() after which /health answers 200
    created: int
    kv_endpoint: dict[str, Any]  # how decode engines reach this engine's KV
    # The trace context (W3C ``traceparent``) of the last generation requests that carried
    # one, by request id: what vLLM would parent its request spans on (``GET /sim/traces``).
    traces: deque[tuple[str, str]] = field(default_factory=lambda: deque(maxlen=TRACES_KEPT))


def _state(request: Request) -> SimState:
    state: SimState = request.app.state.sim
    return state


def _error(err: EngineError, headers: dict[str, str]) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status_code, headers=headers)


async def _json(request: Request) -> Any:
    try:
        return json.loads(await request.body())
    except (ValueError, RecursionError) as exc:  # RecursionError: absurdly deep nesting
        raise EngineError(f"request body is not valid JSON: {exc}") from None


# ---- plain endpoints ---------------------------------------------------------------------

async def health(request: Request) -> Response:
    ready = time.monotonic() >= _state(request).ready_at
    return Response(status_code=200 if ready else 503)


async def models(request: Request) -> JSONResponse:
    st = _state(request)
    card = {"id": st.cfg.model_name, "object": "model", "created": st.created,
            "owned_by": "vllm", "root": st.cfg.model, "parent": None,
            "max_model_len": st.cfg.model_profile.max_model_len, "permission": []}
    return JSONResponse({"object": "list", "data": [card]})


async def metrics(request: Request) -> Response:
    st = _state(request)
    sched = st.engine.scheduler
    text = st.engine.metrics.render(sched.num_running, sched.num_waiting, sched.kv_usage)
    return Response(text, media_type=CONTENT_TYPE_LATEST)


async def info(request: Request) -> JSONResponse:
    st = _state(request)
    body = dataclasses.asdict(st.cfg)
    body.update(engine_id=st.engine.engine_id, served_model_name=st.cfg.model_name,
                kv_capacity_blocks=st.engine.scheduler.pool.capacity,
                kv_cached_blocks=st.engine.scheduler.pool.num_cached,
                kv_transfer_mode=st.cfg.kv_transfer_mode,
                kv_handles=st.engine.num_kv_handles,
                kv_push_registrations=st.engine.num_push_registrations,
                kv_push_waiting=st.engine.num_push_waiting,
                kv_unreachable=st.engine.kv_unreachable,
                push_stalled=st.engine.push_stalled)
    return JSONResponse(body)


async def traces(request: Request) -> JSONResponse:
    """The trace context of the last generation requests that carried one, oldest first."""
    return JSONResponse({"traces": [{"request_id": rid, "traceparent": tp}
                                    for rid, tp in _state(request).traces]})


async def fault(request: Request) -> JSONResponse:
    """The fault knobs: ``POST {"kv_unreachable": true|false}`` makes every prefill's side
    channel unreachable from this engine (KV loads fail; with ``kv_load_failure_policy
    recompute`` the client still gets its answer); ``POST {"push_stalled": true|false}``
    makes this (prefill) engine take push registrations and never write them, as when its
    handshake with the decode engine fails (the decode engine waits for its registration
    timeout). ``GET`` reads both."""
    engine = _state(request).engine
    if request.method == "POST":
        try:
            body = await _json(request)
            knobs = ("kv_unreachable", "push_stalled")
            if not isinstance(body, dict) or not body or set(body) - set(knobs) \
                    or not all(isinstance(v, bool) for v in body.values()):
                raise EngineError('expected {"kv_unreachable": true|false} and/or '
                                  '{"push_stalled": true|false}')
        except EngineError as err:
            return _error(err, {})
        if "kv_unreachable" in body:
            engine.kv_unreachable = body["kv_unreachable"]
        if "push_stalled" in body:
            engine.push_stalled = body["push_stalled"]
    return JSONResponse({"kv_unreachable": engine.kv_unreachable,
                         "push_stalled": engine.push_stalled})


_Check = tuple[Callable[[Any], bool], str]
_STR: _Check = (lambda v: isinstance(v, str), "a string")
_INTS: _Check = (lambda v: isinstance(v, list) and all(
    isinstance(x, int) and not isinstance(x, bool) for x in v), "a list of integers")
_STRS: _Check = (lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
                 "a list of strings")


async def _side_channel_body(request: Request, what: str,
                             fields: dict[str, _Check]) -> list[Any]:
    """The named fields of a side-channel call, checked; ``EngineError`` (400) otherwise."""
    body = await _json(request)
    if not isinstance(body, dict):
        raise EngineError(f"bad {what} request: the body must be a JSON object")
    values = []
    for name, (check, kind) in fields.items():
        if name not in body:
            raise EngineError(f"bad {what} request: {name} is missing")
        if not check(body[name]):
            raise EngineError(f"bad {what} request: {name} must be {kind}")
        values.append(body[name])
    return values


def _refused(exc: KvRefused) -> JSONResponse:
    return _error(EngineError(str(exc), 404, "NotFoundError"), {})


async def _side_channel(request: Request, what: str, fields: dict[str, _Check],
                        serve: Callable[..., Any]) -> Any:
    """A side-channel call served: ``serve``'s value, or the error answer (400 for a bad
    body, 404 for a handle the engine refuses) as a ``JSONResponse``."""
    try:
        values = await _side_channel_body(request, what, fields)
    except EngineError as err:
        return _error(err, {})
    try:
        return serve(*values)
    except KvRefused as exc:
        return _refused(exc)


async def kv_pull(request: Request) -> JSONResponse:
    """The prefill side of a read: hand a decode engine a KV handle and free it.

    A handle this engine no longer tracks answers ``{"stale": true}``: the read of raw
    blocks "succeeds" as in NIXL, and only this side counts and logs it.
    """
    engine = _state(request).engine
    result = await _side_channel(request, "pull", {
        "remote_request_id": _STR, "remote_engine_id": _STR, "remote_block_ids": _INTS},
        engine.serve_pull)
    if isinstance(result, JSONResponse):
        return result
    if result is None:
        return JSONResponse({"stale": True})
    return JSONResponse({"prompt_tokens": result.prompt_tokens, "kv_bytes": result.kv_bytes})


async def reset_prefix_cache(request: Request) -> Response:
    """vLLM's ``POST /reset_prefix_cache`` (a dev-mode endpoint there): forget every cached
    block, publishing ``AllBlocksCleared``; refused (409 here) while blocks are in use, where
    vLLM logs that it failed."""
    if _state(request).engine.reset_prefix_cache():
        return Response(status_code=200)
    return _error(EngineError("cannot reset the prefix cache while blocks are in use", 409,
                              "Conflict"), {})


async def kv_release(request: Request) -> JSONResponse:
    """A decode engine will not read a handle (vLLM's notification-only read): free it."""
    released = await _side_channel(request, "release", {
        "remote_request_id": _STR, "remote_engine_id": _STR},
        _state(request).engine.serve_release)
    return released if isinstance(released, JSONResponse) else JSONResponse(
        {"released": released})


async def kv_heartbeat(request: Request) -> JSONResponse:
    """A decode engine still waits on these handles: extend their leases."""
    known = await _side_channel(request, "heartbeat", {
        "remote_engine_id": _STR, "request_ids": _STRS}, _state(request).engine.serve_heartbeat)
    return known if isinstance(known, JSONResponse) else JSONResponse({"extended": known})


async def _push_message(request: Request, what: str,
                        serve: Callable[[Any], bool], parse: Callable[[Any], Any]
                        ) -> JSONResponse:
    """A push-mode side-channel call: 400 for a bad body, 404 when refused."""
    try:
        body = await _json(request)
        if not isinstance(body, dict):
            raise EngineError(f"bad {what} request: the body must be a JSON object")
        try:
            message = parse(body)
        except ValueError as exc:
            raise EngineError(f"bad {what} request: {exc}") from None
    except EngineError as err:
        return _error(err, {})
    try:
        return JSONResponse({"accepted": serve(message)})
    except KvRefused as exc:
        return _refused(exc)


async def kv_register(request: Request) -> JSONResponse:
    """Push mode, prefill side: a decode engine registers its blocks for a request's KV.
    ``accepted``: the prefill had finished and the write started (else it waits)."""
    return await _push_message(request, "register", _state(request).engine.serve_register,
                               Registration.from_body)


async def kv_pushed(request: Request) -> JSONResponse:
    """Push mode, decode side: the prefill wrote a registered request's KV. ``accepted``
    is false for a request that no longer waits for it."""
    return await _push_message(request, "pushed", _state(request).engine.serve_pushed,
                               Pushed.from_body)


# ---- generation ---------------------------------------------------------------------------

async def completions(request: Request) -> Response:
    return await _generate(request, chat=False)


async def chat_completions(request: Request) -> Response:
    return await _generate(request, chat=True)


async def _generate(request: Request, chat: bool) -> Response:
    st = _state(request)
    request_id = request.headers.get("x-request-id") or uuid.uuid4().hex
    headers = {"X-Request-Id": request_id}
    traceparent = request.headers.get("traceparent")
    if traceparent:
        st.traces.append((request_id, traceparent))
    try:
        body = await _json(request)
    except EngineError as err:
        return _error(err, headers)
    try:
        req = parse_request(body, chat=chat, request_id=request_id,
                            model_name=st.cfg.model_name,
                            max_model_len=st.cfg.model_profile.max_model_len,
                            push=st.cfg.kv_transfer_mode == "push")
    except EngineError as err:
        remote = rejected_remote_prefill(body, st.cfg.kv_transfer_mode == "push", request_id)
        if remote is not None:  # vLLM frees the prefill's KV of a rejected decode hop
            st.engine.reject(remote)
        return _error(err, headers)
    stream = st.engine.submit(req)
    watcher = asyncio.create_task(_abort_on_disconnect(request.receive, st.engine, stream))
    reply = _reply(st, req, stream)
    if req.stream:
        return await _start_stream(st, reply, watcher, headers)
    try:
        await asyncio.shield(stream.done)
    finally:
        watcher.cancel()
        st.engine.abort(stream)  # no-op once finished; frees KV if we were cancelled
    if stream.error is not None:
        return _error(stream.error, headers)
    return JSONResponse(out.full_body(reply), headers=headers)


def _reply(st: SimState, req: SimRequest, stream: RequestStream) -> out.Reply:
    prefix = "chatcmpl" if req.chat else "cmpl"
    return out.Reply(req, stream, f"{prefix}-{req.request_id}", int(time.time()),
                     st.cfg.model_name, prompt_seed(req.prompt), st.kv_endpoint,
                     st.cfg.enable_prompt_tokens_details)


async def _abort_on_disconnect(receive: Receive, engine: SimEngine,
                               stream: RequestStream) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    engine.abort(stream)


async def _start_stream(st: SimState, reply: out.Reply, watcher: asyncio.Task[None],
                        headers: dict[str, str]) -> Response:
    """Wait for the first token before sending headers, so a failed KV load is a 500."""
    stream = reply.stream
    try:
        await stream.progress(0)
    except BaseException:
        watcher.cancel()
        st.engine.abort(stream)
        raise
    if stream.error is not None and stream.num_tokens == 0:
        watcher.cancel()
        return _error(stream.error, headers)
    return EventStreamResponse(_events(reply), watcher,
                               lambda: st.engine.abort(stream), headers)


async def _events(r: out.Reply) -> AsyncIterator[bytes]:
    if r.req.chat:
        yield out.role_chunk(r)
    sent = 0
    while True:
        await r.stream.progress(sent)
        pending = r.stream.num_tokens
        if pending > sent:
            yield b"".join(out.token_chunk(r, i) for i in range(sent, pending))
            sent = pending
        if r.stream.finished and sent == r.stream.num_tokens:
            break
    if r.stream.error is not None:
        yield out.error_chunk(r.stream.error)
    elif r.req.include_usage:
        yield out.usage_chunk(r)
    yield out.STREAM_END


class EventStreamResponse(StreamingResponse):
    """Server-sent events from an async iterator; ends the request's watcher and work.

    Replaces StreamingResponse's sending so that the disconnect watcher, not a task group
    per response, notices a client that left, and the request is aborted in every case.
    """

    def __init__(self, body: AsyncIterator[bytes], watcher: asyncio.Task[None],
                 on_close: Callable[[], None], headers: dict[str, str]) -> None:
        super().__init__(body, headers={**headers, "Cache-Control": "no-cache"},
                         media_type="text/event-stream")
        self._body = body
        self._watcher = watcher
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": 200,
                        "headers": self.raw_headers})
            async for data in self._body:
                await send({"type": "http.response.body", "body": data, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:
            pass  # the client went away mid-send (ASGI 2.4 servers raise); on_close aborts
        finally:
            self._watcher.cancel()
            self._on_close()  # aborts the request unless it finished
