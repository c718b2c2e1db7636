"""One hop to one engine, as the proxy sends it: the request's headers, the routing-latency
mark on its first hop, and a decode attempt (a stream whose first chunk is here, or the whole
answer) with the failures that decide whether it may be retried (``AttemptFailed``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from controller.metrics import Metrics
from controller.models import Instance
from controller.router.answer import Buffered, Prefetched
from controller.router.request import Ctx
from controller.router.table import RoutingTable
from controller.router.upstream import Stream, Upstream, UpstreamError


class AttemptFailed(Exception):
    """One decode attempt failed; ``reached``: the engine may have received the request;
    ``stuck``: aborted because its first token did not come in time."""

    def __init__(self, message: str, reached: bool, stuck: bool = False) -> None:
        super().__init__(message)
        self.reached = reached
        self.stuck = stuck


class Hops:
    """Sends the proxy's hops; ``late_s``: a disaggregated hop with no first token this long
    after the prefill answered is aborted (its KV read is stuck)."""

    def __init__(self, upstream: Upstream, table: RoutingTable, metrics: Metrics,
                 late_s: float, clock: Callable[[], float]) -> None:
        self.upstream, self.table, self.metrics = upstream, table, metrics
        self._late_s, self.clock = late_s, clock

    def headers(self, ctx: Ctx) -> dict[str, str]:
        headers = {"X-Request-Id": ctx.rid, "Content-Type": "application/json"}
        if ctx.trace:
            headers.update(ctx.trace)
        return headers

    def sending(self, ctx: Ctx) -> float:
        """Now; on the request's first hop also observe the routing decision's latency
        (arrival to first hop sent: parsing, token counting, policy)."""
        now = time.perf_counter()
        if not ctx.routed:
            ctx.routed = True
            self.metrics.routing_decision.observe(now - ctx.t0)
        return now

    async def attempt(self, ctx: Ctx, inst: Instance, payload: bytes, resend: bool,
                       first_by: float | None = None,
                       on_sent: Callable[[], None] | None = None,
                       stream: bool | None = None) -> Stream:
        """One decode hop to ``inst``: a stream whose first chunk is here (a streaming hop --
        ``stream``, else the client's choice -- answering 200) or the whole answer. Raises
        ``AttemptFailed`` for an unreachable engine, a lost connection, a 5xx, or no first
        chunk by ``first_by`` (router clock)."""
        ctx.decode_sent = self.sending(ctx)
        try:
            resp = await self.upstream.open(f"{inst.url}{ctx.endpoint}", payload,
                                            self.headers(ctx), resend, on_sent)
        except UpstreamError as exc:
            self.unreachable(ctx, inst, exc)
            raise self._failed(ctx, inst, str(exc), exc.sent) from None
        if (ctx.stream if stream is None else stream) and resp.status == 200:
            return await self._first_chunk(ctx, inst, resp, first_by)
        try:
            content = await resp.read()
        except UpstreamError as exc:
            self.unreachable(ctx, inst, exc)
            raise self._failed(ctx, inst, f"{inst.id} failed before answering: {exc}",
                               True) from None
        finally:
            resp.close()
        if resp.status >= 500:
            ctx.errors.append(f"decode {inst.id} answered {resp.status}")
            raise self._failed(ctx, inst, f"{inst.id} answered {resp.status}", True)
        return Buffered(resp.status, resp.content_type, content)

    async def _first_chunk(self, ctx: Ctx, inst: Instance, resp: Stream,
                           first_by: float | None) -> Stream:
        """Wait for a stream's first chunk within its attempt: until it comes nothing has
        reached the client, so a failure is still retried. A disaggregated hop whose first
        token has not come by ``first_by`` is aborted: its KV read is stuck, and vLLM would
        complete it after the prefill's lease expired, from blocks that may be reused
        (docs/routing-and-accounting.md, "A stuck KV read")."""
        chunks = resp.chunks().__aiter__()
        timeout = None if first_by is None else max(0.0, first_by - self.clock())
        try:
            async with asyncio.timeout(timeout):  # no task of its own, unlike wait_for
                first = await anext(chunks)
        except StopAsyncIteration:
            first = b""
        except TimeoutError:
            resp.close()  # the engine aborts the request; the late read's output is dropped
            self.metrics.kv_stuck_reads.inc()
            msg = (f"decode {inst.id} had no token {self._late_s:g} s after the prefill "
                   "answered (KV read stuck); aborted")
            ctx.errors.append(msg)
            raise self._failed(ctx, inst, msg, True, stuck=True) from None
        except UpstreamError as exc:
            resp.close()
            self.unreachable(ctx, inst, exc)
            raise self._failed(ctx, inst, f"{inst.id} failed before its first token: {exc}",
                               True) from None
        except BaseException:
            resp.close()
            raise
        ctx.first_at = time.perf_counter()
        if ctx.decode_lease is not None:
            ctx.decode_lease.queue(0)  # its prompt is computed: no longer queued work there
        return Prefetched(resp, first, chunks)

    def _failed(self, ctx: Ctx, inst: Instance, message: str, reached: bool,
                stuck: bool = False) -> AttemptFailed:
        ctx.retries += 1
        if reached:
            ctx.reached_failures += 1
            ctx.failed_decodes.add(inst.id)
        return AttemptFailed(message, reached, stuck)

    def unreachable(self, ctx: Ctx, inst: Instance, exc: Exception) -> None:
        msg = f"{inst.id} unreachable: {exc}"
        ctx.errors.append(msg)
        self.table.report_unreachable(inst, msg)
