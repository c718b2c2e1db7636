"""What the client gets for one request (``Answer``): a whole body, or a decode stream relayed
chunk by chunk; plus the ``Stream`` wrappers the decode attempts return and the data plane's
error body. The answer tracks what accounting needs: how the stream ended and its tail."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson

from controller.router.request import Ctx
from controller.router.sse import (
    DONE,
    DONE_EVENT,
    TAIL_BYTES,
    EventFramer,
    error_event,
    last_event,
    strip_router_fields,
    strip_usage_event,
)
from controller.router.upstream import Stream, UpstreamError

Write = Callable[[bytes, bool], Awaitable[None]]  # (chunk, more to come)


def error_body(exc: BaseException) -> tuple[int, bytes]:
    """The data plane's one error shape (OpenAI's), and its status."""
    status = getattr(exc, "status_code", 500)
    kind = getattr(exc, "error_type", "server_error")
    param = getattr(exc, "param", None)
    return status, orjson.dumps({"error": {"message": str(exc), "type": kind,
                                           "param": param, "code": status}})


def status_of(http_status: int) -> str:
    """A request's recorded status from its answer: a 4xx is the client's request refused
    (``rejected``: bad input, admission), a 5xx the fleet's failure (``error``)."""
    if http_status < 400:
        return "ok"
    return "rejected" if http_status < 500 else "error"


class Buffered:
    """A whole answer read inside its attempt (``Stream`` over bytes already here): a failure
    while reading it was still retryable, because nothing had reached the client."""

    def __init__(self, status: int, content_type: str, body: bytes) -> None:
        self.status, self.content_type, self._body = status, content_type, body

    async def chunks(self) -> AsyncIterator[bytes]:
        yield self._body

    async def read(self) -> bytes:
        return self._body

    def close(self) -> None:
        pass


class Prefetched:
    """A ``Stream`` whose first chunk was read already (within its attempt)."""

    def __init__(self, resp: Stream, first: bytes, rest: AsyncIterator[bytes]) -> None:
        self.status, self.content_type = resp.status, resp.content_type
        self._resp, self._first, self._rest = resp, first, rest

    async def chunks(self) -> AsyncIterator[bytes]:
        if self._first:
            yield self._first
        async for chunk in self._rest:
            yield chunk

    async def read(self) -> bytes:
        return b"".join([c async for c in self.chunks()])

    def close(self) -> None:
        self._resp.close()


class Answer:
    """The client's answer. ``body`` is set for a whole answer (an error, a non-streaming
    answer, a stream the engine refused); otherwise ``relay`` writes the stream."""

    __slots__ = ("status", "content_type", "body", "error", "headers", "outcome", "tail",
                 "done", "_ctx", "_resp", "_last_at")

    def __init__(self, status: int, content_type: str, body: bytes | None,
                 error: str | None = None, ctx: Ctx | None = None,
                 resp: Stream | None = None) -> None:
        self.status, self.content_type, self.body = status, content_type, body
        self.error = error  # why the request failed, when the router answers with an error
        self.headers: list[tuple[bytes, bytes]] = []  # more response headers
        self.outcome = "cancelled"  # of a relay: until it ends
        self.tail = b""
        self.done = False  # the stream's last event was written
        self._ctx, self._resp = ctx, resp
        self._last_at: float | None = None  # when the last events were written (relay)

    @classmethod
    def failure(cls, exc: BaseException) -> Answer:
        status, body = error_body(exc)
        answer = cls(status, "application/json", body, str(exc) or type(exc).__name__)
        retry_after = getattr(exc, "retry_after_s", None)
        if retry_after is not None:
            answer.headers.append((b"retry-after", str(retry_after).encode()))
        return answer

    @property
    def streaming(self) -> bool:
        return self.body is None

    async def relay(self, write: Write) -> None:
        """Write the decode stream to the client, whole events at a time (``EventFramer``:
        an event split across reads is edited once it is whole): the router's usage event
        dropped, its fields removed, the last event written with the end of the body, and an
        engine that breaks off mid-stream (tokens already sent, so no retry) ending the
        stream with an error event."""
        assert self._resp is not None and self._ctx is not None
        framer = EventFramer()
        try:
            async for read in self._resp.chunks():
                self.tail = (self.tail + read)[-TAIL_BYTES:]
                if not self.done:
                    await self._forward(framer.feed(read), write)
            if not self.done:
                await self._forward(framer.flush(), write)
            self.outcome = "ok"
        except UpstreamError as exc:
            if self.done:
                self.outcome = "ok"  # the client had the whole stream; only the close failed
                return
            self.outcome, self.error = "error", f"decode instance failed mid-stream: {exc}"
            self.done = True
            await write(error_event(self.error), False)

    async def _forward(self, events: bytes, write: Write) -> None:
        """Edit and write whole events (nothing after the end marker: only the upstream's end
        of body is left to read then)."""
        if not events:
            return
        ctx = self._ctx
        assert ctx is not None
        if events != DONE_EVENT:
            # What the client feels between tokens: one gap per write of events (events that
            # arrive together have none between them); the first is the one the attempt
            # read, at ``first_at``.
            now = time.perf_counter()
            if self._last_at is None:
                self._last_at = ctx.first_at or now
            else:
                ctx.gaps.append(now - self._last_at)
                self._last_at = now
        if ctx.strip_usage:
            events = strip_usage_event(events)
            if not events:
                return
        events = strip_router_fields(events)
        last = events.endswith(DONE_EVENT)
        self.done = self.done or last
        await write(events, not last)

    def result(self, exc: BaseException | None) -> tuple[str, dict[str, Any] | None, str | None]:
        """How the request ended (status, final JSON or last event, error) once the client's
        side is over; ``exc`` is what ended it early (cancellation, a failed write)."""
        if not self.streaming:
            status = status_of(self.status)
            if self.error is not None:
                return status, None, self.error
            data: Any = None
            try:
                data = orjson.loads(self.body or b"")
            except ValueError:
                pass
            return (status, data if isinstance(data, dict) else None,
                    None if status == "ok" else f"decode answered {self.status}")
        outcome, error = self.outcome, self.error
        if outcome == "cancelled" and DONE in self.tail:
            outcome = "ok"  # the client had the whole stream and hung up before the engine
        elif outcome == "cancelled" and isinstance(exc, Exception):
            outcome, error = "error", internal_error(exc)
        return outcome, last_event(self.tail), error

    def close(self) -> None:
        if self._resp is not None:
            self._resp.close()


def internal_error(exc: BaseException) -> str:
    return f"internal error in the router: {type(exc).__name__}: {exc}"
