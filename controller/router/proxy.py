"""The two-hop proxy: a request's whole life, from its body to its record.

``async with proxy.serve(ctx) as answer`` chooses the decode instance, runs the prefill hop
(disaggregated path), opens the decode hop and yields the client's ``Answer``; when the block
ends -- however it ends -- the request is recorded exactly once and every in-flight count it
took is released. The ASGI layer (``controller.api.data``) only moves bytes.

The disaggregated flow in pull mode (``controller.router.pull``) is the one vLLM's
NixlConnector expects: the prefill instance gets the request with ``max_tokens=1``,
``stream=false`` and ``kv_transfer_params.do_remote_decode``; its answer's
``kv_transfer_params`` (a *KV handle*: the prefill's blocks, held for a lease) go, with the
original request, to a decode instance, which pulls the KV and generates. In push mode
(``controller.router.push``, both instances run NixlPushConnector) both hops go at once. The
hand-off decision (``controller.router.handoff``, ``routing.disagg_policy``) says which
requests take the colocated path instead -- and any request does when no prefill instance of
the decode instance's KV mode is ready or the prefill hop fails: the decode instance prefills
itself.

The rules that keep vLLM's KV contract (docs/routing-and-accounting.md):

- the decode instance is chosen *before* the prefill hop: no ready decode instance -> 503,
  never a prefill whose blocks nobody will read;
- a KV handle is sent to at most one engine, once (no HTTP re-send either). When the decode
  hop carrying it fails after it may have reached the engine, the request gets one colocated
  attempt instead -- vLLM does not fail a read of expired or reused blocks, so a second read
  could return wrong output with HTTP 200;
- a handle whose decode hop would start later than ``kv.late_hop_share`` of the lease goes
  colocated; a streaming hop with no token by then is aborted (its read is stuck and would
  complete after the lease, from freed blocks) and served colocated;
- a handle that will not be read (client gone during the prefill hop or before the decode
  hop was written, no decode instance could take it, late) is released at once: sent to a
  decode engine in a request its serving layer rejects, which makes vLLM notify the prefill
  to free the blocks;
- attempts that may have reached an engine and failed (it died, or answered 5xx) are at most
  two per request, so a request that kills engines cannot walk the whole pool.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

import orjson

from controller.config import Settings
from controller.errors import (
    NoInstanceAvailable,
    Overloaded,
    RoutingError,
    UnsupportedMediaType,
    UpstreamUnreachable,
)
from controller.metrics import Metrics
from controller.models import Instance, RequestPath, RequestRecord, Role
from controller.router import handoff
from controller.router.accounting import KvCosts, Measured, account
from controller.router.answer import Answer, internal_error
from controller.router.bodies import (
    client_answer,
    decode_body,
    parse_body,
)
from controller.router.handoff_rates import HandoffRates, handoff_prior, slo_inputs
from controller.router.hop_base import HopWatch
from controller.router.hops import AttemptFailed, Hops
from controller.router.policies import PromptBlocks
from controller.router.pull import PullHandoff
from controller.router.push import PUSH, PushHandoff
from controller.router.release import KvRelease
from controller.router.request import Ctx, new_request_id
from controller.router.serving import Serving
from controller.router.table import Lease, RoutingTable
from controller.router.tracing import RequestTracer
from controller.router.upstream import Stream, Upstream, UpstreamError
from controller.router.validate import Limits, check
from controller.tokens import TokenCounter
from pdctl_api import profiles

log = logging.getLogger("pdctl.router")

RETRY_PAUSE_S = 0.5  # times the attempt number, before retrying decode instances that failed
MAX_REACHED_FAILURES = 2  # failed attempts per request that may have reached an engine
# The most prompt tokens one engine step computes when the decode pool's engine arguments do
# not say (vLLM's max_num_batched_tokens for its OpenAI server): a local prefill stalls the
# decode instance's running streams for about one such chunk per step.
DEFAULT_CHUNK_TOKENS = 8192


class RecordSink(Protocol):
    """Where finished requests' records go: the controller's ``RequestLog``, or a router
    worker's channel to it (``controller.workers``)."""

    def add(self, record: RequestRecord) -> None: ...


class Proxy(PullHandoff, PushHandoff):
    def __init__(self, settings: Settings, table: RoutingTable, upstream: Upstream,
                 counter: TokenCounter, requests: RecordSink, metrics: Metrics,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.table, self.upstream, self.counter = table, upstream, counter
        self.requests, self.metrics, self.clock = requests, metrics, clock
        self._costs = KvCosts(settings.known_profile, settings.kv_block_size,
                              profiles.link(settings.hardware.kv_link))
        self._lease_s = settings.kv.lease_s
        self._late_s = settings.kv.lease_s * settings.kv.late_hop_share
        self._model = settings.model.public_name
        self._limits = Limits(settings.model.public_name, settings.context_len)
        self._background: set[asyncio.Task[None]] = set()
        self._hops = Hops(upstream, table, metrics, self._late_s, clock)
        self._kv = KvRelease(upstream, table, metrics, self._model)
        self.inflight = 0  # admitted client requests not yet ended
        # The same in the fleet's other router processes (``controller.workers``): requests
        # in flight, waiting for a prefill slot, refused, and (requests, prompt tokens) arrived.
        self.others_inflight = 0
        self.others_waiting = 0
        self.others_refused = 0
        self.others_arrived = (0, 0)
        self.on_admit: Callable[[Ctx], None] | None = None  # a router worker's, when wired
        self.refused_total = 0  # answered 429 by admission control
        # Valid requests that arrived, and their prompt tokens (the planner's arrival rate:
        # finished requests understate it while a queue grows).
        self.arrived = 0
        self.arrived_prompt_tokens = 0
        # The hand-off decision's view of the fleet's speed, and the live service targets
        # (TTFT p95, gap p99 in ms; the app wires the operator's).
        self.rates = HandoffRates(handoff_prior(settings))
        self.targets: Callable[[], tuple[float, float]] = lambda: (
            settings.targets.ttft_p95_ms, settings.targets.gap_p99_ms)
        self._chunk_tokens = int(settings.pools.decode.engine_args.get(
            "max_num_batched_tokens", DEFAULT_CHUNK_TOKENS))
        self._router_queue_tokens = 0  # prompt tokens waiting for a prefill slot
        self.fallback: HopWatch | None = None  # the silent-fallback watch, when wired
        self.tracer: RequestTracer | None = None  # request spans, when wired

    # ---- entry -----------------------------------------------------------------------

    def new_ctx(self, endpoint: str, raw: bytes, request_id: str | None,
                media_type: bytes | None = b"application/json",
                trace: tuple[tuple[str, str], ...] = ()) -> Ctx:
        """The request's context; one whose body the engines would refuse carries its
        ``rejection`` (answered and recorded by ``serve``, sent to no engine)."""
        t0, started_at = time.perf_counter(), time.time()  # parsing and counting are in TTFT
        rid = request_id or new_request_id()
        try:
            if media_type != b"application/json":
                raise UnsupportedMediaType(
                    "the body must be JSON, sent as Content-Type: application/json")
            body = parse_body(raw)
            stream, prompt_tokens = check(endpoint, body, self.counter, self._limits)
        except RoutingError as exc:
            return self.refused(endpoint, rid, exc, t0, started_at)
        self.arrived += 1
        self.arrived_prompt_tokens += prompt_tokens
        blocks = self._blocks(body) if self.table.wants_blocks else None
        span = None
        if self.tracer is not None:  # the hops carry the request's span as their parent
            span, trace = self.tracer.start(endpoint, trace, int(started_at * 1e9))
        return Ctx(rid=rid, endpoint=endpoint, body=body, stream=stream,
                   prompt_tokens=prompt_tokens, t0=t0, started_at=started_at, blocks=blocks,
                   trace=trace, span=span)

    def _blocks(self, body: dict[str, Any]) -> PromptBlocks | None:
        """The prompt's blocks for the cache-aware policy; None (routed by load) for token
        ids no engine's index can hold."""
        try:
            return self.table.blocks(self.counter.packed_ids(body))
        except (OverflowError, TypeError):
            return None

    @staticmethod
    def refused(endpoint: str, rid: str | None, why: RoutingError, t0: float | None = None,
                started_at: float | None = None) -> Ctx:
        """The context of a request refused before routing: ``serve`` answers and records
        it, and sends nothing to an engine."""
        return Ctx(rid=rid or new_request_id(), endpoint=endpoint, body={}, stream=False,
                   prompt_tokens=0, t0=time.perf_counter() if t0 is None else t0,
                   started_at=time.time() if started_at is None else started_at,
                   rejection=why)

    def _count_refused(self) -> None:
        self.refused_total += 1
        self.metrics.admission_refused.inc()

    def admission(self) -> Overloaded | None:
        """Why one more request may not start now (``routing.max_inflight``), or None."""
        limit = self.table.settings.max_inflight
        inflight = self.inflight + self.others_inflight
        if limit and inflight >= limit:
            self._count_refused()
            return Overloaded(f"{inflight} requests in flight: the controller's limit "
                              f"(routing.max_inflight) is {limit}; retry shortly")
        return None

    def serve(self, ctx: Ctx) -> Serving:
        """``async with proxy.serve(ctx) as answer``: the client's answer (an error answer
        when the request cannot be served); recorded and released when the block ends."""
        return Serving(self, ctx)

    async def answer(self, ctx: Ctx) -> Answer:
        """Route the request and read the decode hop's first chunk (or whole answer)."""
        if self.on_admit is not None:
            self.on_admit(ctx)
        try:
            resp = await self.open(ctx)
        except RoutingError as exc:
            return Answer.failure(exc)
        except Exception as exc:
            # A bug, not an engine's failure: the client still gets an answer.
            log.exception("%s: unexpected error", ctx.rid)
            return Answer.failure(RuntimeError(internal_error(exc)))
        if ctx.stream and resp.status == 200:
            return Answer(200, "text/event-stream", None, ctx=ctx, resp=resp)
        try:
            content = await resp.read()
        except UpstreamError as exc:
            return Answer.failure(
                UpstreamUnreachable(f"decode instance failed before answering: {exc}"))
        finally:
            resp.close()
        if resp.status == 200:
            content = client_answer(content)
        return Answer(resp.status, resp.content_type, content)

    async def open(self, ctx: Ctx) -> Stream:
        """Choose the decode instance, decide the hand-off (``routing.disagg_policy``), run
        the prefill hop (disaggregated) and open the decode hop: a live stream (streaming,
        status 200) or the whole answer."""
        settings = self.table.settings
        by_slo = settings.disagg_policy == "slo"
        disagg = False
        slot: Lease | None = None
        if not by_slo:
            ctx.decision = handoff.by_threshold(ctx.prompt_tokens,
                                                settings.disagg_min_prompt_tokens,
                                                bool(self.table.ready(Role.PREFILL)))
            disagg = ctx.decision.disaggregated
            if disagg and settings.prefill_max_inflight:
                slot = await self._prefill_slot(ctx)
                disagg = slot is not None
        try:
            first = self.table.pick(Role.DECODE, set(), ctx.blocks)
            if first is None:
                raise self._no_decode()
            self._assign_decode(ctx, first)
            if by_slo:
                ctx.decision = self._decide(ctx, first)
                disagg = ctx.decision.disaggregated
                if disagg and settings.prefill_max_inflight:
                    slot = await self._prefill_slot(ctx)
                    disagg = slot is not None
            assert ctx.decision is not None
            self.metrics.child(self.metrics.handoff, settings.disagg_policy,
                               ctx.decision.name).inc()
            if disagg:
                ctx.path = RequestPath.DISAGGREGATED  # also when cancelled during the hop
                if ctx.decode_lease is not None:
                    ctx.decode_lease.queue(0)  # the prefill pool computes it, not decode
                taken, slot = slot, None  # the prefill hop owns the slot now
                if first.kv_mode == PUSH:
                    resp = await self._push(ctx, taken)
                else:
                    done = await self._prefill(ctx, taken)
                    resp = None if done is None else await self._decode_with_kv(ctx, done)
                if resp is not None:
                    return resp
                ctx.path = RequestPath.COLOCATED
            return await self._colocated(ctx)
        finally:
            if slot is not None:
                slot.release()

    def _decide(self, ctx: Ctx, decode: Instance) -> handoff.HandoffDecision:
        """The ``slo`` hand-off decision for ``ctx`` now that ``decode`` is chosen."""
        ttft_target, gap_target = self.targets()
        return handoff.by_slo(slo_inputs(
            self.table, ctx, decode, self.rates, self._router_queue_tokens,
            self._chunk_tokens, ttft_target, gap_target))

    async def _prefill_slot(self, ctx: Ctx) -> Lease | None:
        """Wait in the router's prefill queue; None: served colocated (waited too long, or
        no prefill instance is ready)."""
        t = time.perf_counter()
        timeout = self.table.settings.prefill_queue_timeout_s
        self._router_queue_tokens += ctx.prompt_tokens
        try:
            slot = await self.table.prefill_slot(timeout, ctx.blocks)
        finally:
            self._router_queue_tokens -= ctx.prompt_tokens
        ctx.router_queue_ms = (time.perf_counter() - t) * 1e3
        if slot is None:
            log.warning("%s: no prefill slot within %.1f s (routing.prefill_max_inflight %d); "
                        "serving colocated", ctx.rid, ctx.router_queue_ms / 1e3,
                        self.table.settings.prefill_max_inflight)
        return slot

    async def close(self) -> None:
        """Wait briefly for the releases in flight; cancel what is left."""
        if self._background:
            _, pending = await asyncio.wait(set(self._background), timeout=5.0)
            for task in pending:
                task.cancel()

    # ---- hops ------------------------------------------------------------------------

    def _assign_decode(self, ctx: Ctx, inst: Instance) -> None:
        """Make ``inst`` the request's decode instance, counted in its in-flight requests
        from now on (a draining instance waits for it)."""
        lease = ctx.decode_lease
        if lease is not None:
            if lease.instance is inst and lease.held:
                return
            lease.release()
        ctx.decode, ctx.decode_lease = inst, self.table.lease(inst)
        ctx.decode_cached_predicted = self._cached(ctx, ctx.decode_lease)

    def _cached(self, ctx: Ctx, lease: Lease) -> int | None:
        """The prompt tokens the lease's instance holds by the index (None: no blocks were
        computed), counting the rest as work queued there (until its first token)."""
        if ctx.blocks is None:
            lease.queue(ctx.prompt_tokens)
            return None
        cached = self.table.cached(lease.instance.id, ctx.blocks)
        lease.queue(ctx.prompt_tokens - cached)
        self.table.expect_blocks(lease.instance, ctx.blocks, cached)
        return cached

    async def _colocated(self, ctx: Ctx) -> Stream:
        body, ctx.strip_usage = decode_body(ctx.body, None)
        payload = orjson.dumps(body)
        tried: set[str] = set()
        inst: Instance | None = ctx.decode
        for attempt in range(self.table.settings.max_attempts):
            if inst is None or inst.id in tried or inst.id in ctx.failed_decodes:
                inst = self._pick_colocated(ctx, tried | ctx.failed_decodes, tried)
            if inst is None and tried:
                # Every ready decode instance was tried once (most could not be reached).
                # Nothing went to the client yet, so try again after a pause, not fail --
                # unless the controller is shutting down: no request starts any more.
                if self.upstream.closed is not None:
                    break
                await asyncio.sleep(RETRY_PAUSE_S * attempt)
                tried = set()
                inst = self._pick_colocated(ctx, ctx.failed_decodes, tried)
            if inst is None:
                break
            self._assign_decode(ctx, inst)
            tried.add(inst.id)
            self._sent(ctx, inst, None)
            try:
                return await self._hops.attempt(ctx, inst, payload, resend=True)
            except AttemptFailed:
                if ctx.reached_failures >= MAX_REACHED_FAILURES or \
                        self.upstream.closed is not None:
                    break
            inst = None
        if self.upstream.closed is not None:  # not the fleet's failure: the controller's exit
            raise NoInstanceAvailable(f"{self.upstream.closed}: the request was not served; "
                                      "send it again")
        if ctx.errors:
            raise UpstreamUnreachable("no decode instance could serve the request: "
                                      + "; ".join(ctx.errors[-3:]))
        raise self._no_decode()

    def _no_decode(self) -> RoutingError:
        if self.table.full(Role.DECODE):
            self._count_refused()
            cap = self.table.settings.max_inflight_per_instance
            return Overloaded(f"every ready decode instance has {cap} requests in flight "
                              "(routing.max_inflight_per_instance); retry shortly")
        return NoInstanceAvailable("no ready decode instance")

    def _pick_colocated(self, ctx: Ctx, avoid: set[str], tried: set[str]) -> Instance | None:
        """A decode instance for a colocated attempt: one that has not failed this request
        if there is one, else (a single-instance pool, say) one that did but is not yet
        tried again in this round; engines that died refuse the connection."""
        return (self.table.pick(Role.DECODE, avoid, ctx.blocks)
                or self.table.pick(Role.DECODE, tried, ctx.blocks))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # ---- accounting --------------------------------------------------------------------

    def record(self, ctx: Ctx, status: str, response: dict[str, Any] | None,
               error: str | None = None) -> RequestRecord:
        """Account and keep the finished request; ``response`` is the final JSON (or the
        stream's last event). ``Serving`` calls it once per request."""
        decode = ctx.decode
        rec = account(Measured(
            rid=ctx.rid, endpoint=ctx.endpoint, stream=ctx.stream, path=ctx.path,
            status=status, error=error, started_at=ctx.started_at, t0=ctx.t0,
            decode_sent=ctx.decode_sent, first_at=ctx.first_at, end=time.perf_counter(),
            counted_prompt_tokens=ctx.prompt_tokens, response=response,
            prefill_instance=ctx.prefill.id if ctx.prefill else None,
            decode_instance=decode.id if decode else None, prefill_times=ctx.prefill_times,
            prefill_wall_ms=ctx.prefill_wall_ms, router_queue_ms=ctx.router_queue_ms,
            decode_recent_xfer_ms=decode.recent_xfer_ms if decode else 0.0,
            retries=ctx.retries, kv_handle=ctx.kv_handle, gaps=ctx.gaps,
            cached_predicted=ctx.cached_predicted, prefill_cached=ctx.prefill_cached,
            decode_cached_predicted=ctx.decode_cached_predicted), self._costs)
        if ctx.decision is not None:
            rec.decision, rec.decision_reason = ctx.decision.name, ctx.decision.reason
        if ctx.prefill is not None:
            self.table.handle_done(ctx.prefill.id, ctx.rid)
        self.requests.add(rec)
        if self.fallback is not None:
            self.fallback.ended(rec)
        self.metrics.observe(rec, ctx.gaps)
        self.rates.observe(rec)
        if ctx.span is not None and self.tracer is not None:
            self.tracer.end(ctx.span, rec, int(ctx.started_at * 1e9))
        return rec
