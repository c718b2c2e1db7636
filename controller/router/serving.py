"""``Proxy.serve``'s context: the client's answer on entry; on exit, however the block ends,
the request's record and the release of every in-flight count it took, exactly once."""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Any, Protocol

from controller.errors import RoutingError
from controller.models import RequestRecord
from controller.router.answer import Answer, internal_error
from controller.router.request import Ctx


class Served(Protocol):
    """What ``Serving`` needs of the proxy (``controller.router.proxy.Proxy``)."""

    inflight: int

    def admission(self) -> RoutingError | None: ...

    async def answer(self, ctx: Ctx) -> Answer: ...

    def record(self, ctx: Ctx, status: str, response: dict[str, Any] | None,
               error: str | None = None) -> RequestRecord: ...


class Serving:
    """``Proxy.serve``: the answer on entry; on exit the record and the releases, once.
    A request refused before routing (its body, admission control) is answered and recorded
    here too, and never counted in flight."""

    __slots__ = ("_proxy", "_ctx", "_answer", "_admitted")

    def __init__(self, proxy: Served, ctx: Ctx) -> None:
        self._proxy, self._ctx = proxy, ctx
        self._answer: Answer | None = None
        self._admitted = False

    async def __aenter__(self) -> Answer:
        proxy = self._proxy
        refused = self._ctx.rejection or proxy.admission()
        if refused is not None:
            self._answer = Answer.failure(refused)
            return self._answer
        proxy.inflight += 1
        self._admitted = True
        try:
            self._answer = await proxy.answer(self._ctx)
        except BaseException as exc:  # cancelled while routing: recorded, then re-raised
            self._end(exc)
            raise
        return self._answer

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self._end(exc)

    def _end(self, exc: BaseException | None) -> None:
        ctx, answer = self._ctx, self._answer
        if answer is None:
            status, response = "cancelled", None
            error = "client disconnected" if isinstance(exc, asyncio.CancelledError) else (
                internal_error(exc) if exc is not None else None)
            if exc is not None and not isinstance(exc, asyncio.CancelledError):
                status = "error"
        else:
            answer.close()
            status, response, error = answer.result(exc)
            if status == "cancelled" and error is None:
                error = "client disconnected"
        if ctx.decode_lease is not None:
            ctx.decode_lease.release()
        if self._admitted:
            self._admitted = False
            self._proxy.inflight -= 1
        self._proxy.record(ctx, status, response, error)
