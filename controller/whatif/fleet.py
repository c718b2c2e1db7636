"""A layout of modelled engines behind the router's own routing table, policies and hand-off
decision, serving requests as ``controller.router.proxy.Proxy.open`` does.

Per request: with ``disagg_policy`` ``threshold`` the decision comes first (and, with
``prefill_max_inflight``, a place in the router's prefill queue); the decode instance is picked
by its pool's policy and leased, counting the prompt's uncached tokens as queued work there;
with ``slo`` the decision is ``handoff.by_slo`` on ``slo_inputs`` of the same table and of
``HandoffRates`` learning from every finished request. Disaggregated: a one-token prefill hop
on the picked prefill instance keeps its KV under a handle, then the decode hop pulls what its
own cache lacks. A request's TTFT parts are ``accounting.breakdown`` of the engines' own times,
as the controller accounts a live request. The router's cache view is the engines' caches
themselves (``EngineTruth``): the live index follows them through KV events, a little late.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from controller.config import RoutingSettings
from controller.engines.sim.scheduler import Seq
from controller.kvevents.index import BlockIndex
from controller.models import Instance, InstanceState, RequestPath, RequestRecord, Role
from controller.replay.prompts import Fitted
from controller.replay.summary import ReplayRow
from controller.replay.trace import TraceRequest
from controller.router import handoff
from controller.router.accounting import EngineTimes, Observation, breakdown, gap_summary
from controller.router.handoff_rates import HandoffRates, roofline_prior, slo_inputs
from controller.router.policies import PromptBlocks
from controller.router.request import Ctx
from controller.router.table import Lease, RoutingTable
from controller.store import Store
from controller.whatif.engine import DesEngine, EngineShape, Hop
from controller.whatif.events import EventQueue
from controller.whatif.layout import Layout
from controller.whatif.prompts import PromptHasher


@dataclass(frozen=True)
class Goals:
    """A request meets its targets when its TTFT and its own inter-token gap p99 are within
    them (``controller.replay.summary.met``)."""

    ttft_ms: float = 2000.0
    gap_ms: float = 150.0


class EngineTruth(BlockIndex):
    """The router's cache view read from the modelled engines' own prefix caches."""

    def __init__(self, engines: dict[str, DesEngine], block_size: int) -> None:
        super().__init__(block_size)
        self._engines = engines

    def longest_prefix(self, instance: str, chain_hashes: Sequence[int]) -> int:
        engine = self._engines.get(instance)
        if engine is None:
            return 0
        return len(engine.scheduler.pool.lookup(chain_hashes)) * self.block_size

    def trusted(self, instance: str) -> bool:
        return instance in self._engines

    def note_expected(self, instance: str, now: float) -> None:
        pass


@dataclass(eq=False, slots=True)
class Req:
    index: int
    trace: TraceRequest
    fitted: Fitted
    due_s: float
    ctx: Ctx
    hashes: list[int]
    prefill: Hop | None = None
    prefill_lease: Lease | None = None
    decode: Hop | None = None
    queued_at: float | None = None  # joined the router's prefill queue


@dataclass
class Outcomes:
    """What a run produced: one row and one record per request, in arrival order."""

    rows: list[ReplayRow] = field(default_factory=list)
    records: list[RequestRecord] = field(default_factory=list)


class DesFleet:
    def __init__(self, events: EventQueue, layout: Layout, shape: EngineShape,
                 routing: RoutingSettings, targets: Goals, fast: bool = True) -> None:
        self.events = events
        self.layout = layout
        self.shape = shape
        self.targets = targets
        routing = routing.model_copy(update={"disagg_policy": layout.disagg_policy})
        self.fast = fast
        self._queue: deque[tuple[Req, bool]] = deque()  # the router's prefill queue
        self._queue_tokens = 0
        self.table = RoutingTable(routing, Store(Path(":memory:")), events.clock)
        self.engines: dict[str, DesEngine] = {}
        self.members: dict[Role, list[Instance]] = {Role.PREFILL: [], Role.DECODE: []}
        self.held: dict[str, list[float]] = {}  # instance -> [started, stopped] (modelled s)
        self.tp = {Role.PREFILL: layout.prefill_tp, Role.DECODE: layout.decode_tp}
        for role, count in ((Role.PREFILL, layout.prefill_count),
                            (Role.DECODE, layout.decode_count)):
            for _ in range(count):
                self._add(role).state = InstanceState.READY
            self._publish(role)
        self.table.index = EngineTruth(self.engines, shape.block_size)
        self.rates = HandoffRates(roofline_prior(shape.model, shape.hardware, shape.link,
                                                 layout.prefill_tp, layout.decode_tp))
        self.hasher = PromptHasher(shape.block_size)
        self.chunk_tokens = shape.max_num_batched_tokens
        self.served = Outcomes()
        self.arrived = [0, 0]  # requests that arrived, and their prompt tokens
        self.gap_log: list[float] | None = None  # every inter-token gap (s), when a list

    # ---- pool changes ----------------------------------------------------------------------

    def _add(self, role: Role) -> Instance:
        inst = Instance(f"{role.value}-{len(self.members[role])}", role, self.tp[role],
                        "des://", InstanceState.STARTING)
        self.engines[inst.id] = DesEngine(self.events, inst, self.shape, fast=self.fast)
        self.members[role].append(inst)
        self.held[inst.id] = [self.events.now, math.inf]
        return inst

    def _publish(self, role: Role) -> None:
        self.table.set_members(role, [i for i in self.members[role] if i.state.routable])
        if role is Role.PREFILL:
            self._wake()

    def live(self, role: Role) -> list[Instance]:
        """Instances of ``role`` ready or starting (what the pool's size counts)."""
        return [i for i in self.members[role]
                if i.state in (InstanceState.READY, InstanceState.STARTING)]

    def resize(self, role: Role, count: int, start_s: float) -> None:
        """``count`` instances of ``role`` from now. New ones take requests after ``start_s``
        (an engine's start); surplus ones -- starting ones first, then the newest -- leave
        the routing table at once and stop when their last request has left (a drain)."""
        live = self.live(role)
        for _ in range(count - len(live)):
            self.events.at(self.events.now + start_s, self._started, self._add(role))
        order = sorted(range(len(live)), key=lambda k: (live[k].state.routable,
                                                         -self.held[live[k].id][0], -k))
        for inst in [live[k] for k in order[:max(0, len(live) - count)]]:
            inst.state = InstanceState.DRAINING
            self.engines[inst.id].on_idle = self._stop_if_done
            self._stop_if_done(self.engines[inst.id])
        self._publish(role)

    def _started(self, inst: Instance) -> None:
        if inst.state is InstanceState.STARTING:
            inst.state = InstanceState.READY
            self._publish(inst.role)

    def _stop_if_done(self, engine: DesEngine) -> None:
        """A draining instance stops when its engine holds nothing and no request has it
        leased (a decode hop may still be on its way from prefill)."""
        inst = engine.instance
        if inst.state is InstanceState.DRAINING and engine.idle \
                and not self.table.inflight(inst.id):
            inst.state = InstanceState.STOPPED
            engine.on_idle = None
            self.held[inst.id][1] = self.events.now

    def accelerator_seconds(self, until: float) -> float:
        """What every instance held, from its start until it stopped (or ``until``)."""
        return sum((min(stop, until) - start) * self.engines[i].instance.tp
                   for i, (start, stop) in self.held.items() if start < until)

    # ---- arrival ---------------------------------------------------------------------------

    def arrive(self, index: int, req: TraceRequest, fitted: Fitted, due_s: float) -> None:
        now = self.events.now
        prompt = fitted.prompt_tokens
        self.arrived[0] += 1
        self.arrived[1] += prompt
        ctx = Ctx(f"r{index}", "/v1/completions", {}, True, prompt, now, now)
        hashes = self.hasher.hashes(req.hash_ids, prompt)
        ctx.blocks = PromptBlocks(prompt, hashes)
        r = Req(index, req, fitted, due_s, ctx, hashes)
        s = self.table.settings
        if s.disagg_policy == "threshold":
            ctx.decision = handoff.by_threshold(prompt, s.disagg_min_prompt_tokens,
                                                bool(self.table.ready(Role.PREFILL)))
            if ctx.decision.disaggregated and s.prefill_max_inflight:
                self._wait_slot(r, before_decode=True)
                return
        self._route(r, None)

    def _route(self, r: Req, slot: Lease | None) -> None:
        """Pick and lease the decode instance, decide (``slo``), and send the first hop."""
        ctx, table = r.ctx, self.table
        decode = table.pick(Role.DECODE, set(), ctx.blocks)
        assert decode is not None, "a layout has decode instances"
        ctx.decode, ctx.decode_lease = decode, table.lease(decode)
        ctx.decode_cached_predicted = self._cached(ctx, ctx.decode_lease)
        if table.settings.disagg_policy == "slo":
            ctx.decision = handoff.by_slo(slo_inputs(
                table, ctx, decode, self.rates, self._queue_tokens, self.chunk_tokens,
                self.targets.ttft_ms, self.targets.gap_ms))
            if ctx.decision.disaggregated and table.settings.prefill_max_inflight:
                self._wait_slot(r, before_decode=False)
                return
        assert ctx.decision is not None
        self._send(r, slot if ctx.decision.disaggregated else None,
                   ctx.decision.disaggregated)

    def _send(self, r: Req, slot: Lease | None, disagg: bool) -> None:
        ctx = r.ctx
        if disagg and slot is None and not self.table.settings.prefill_max_inflight:
            inst = self.table.pick(Role.PREFILL, set(), ctx.blocks)
            slot = None if inst is None else self.table.lease(inst)
        if slot is None:  # colocated (no prefill instance, or the queue timed out)
            self._hop(r, ctx.decode_lease, None)
            return
        ctx.path = RequestPath.DISAGGREGATED
        assert ctx.decode_lease is not None
        ctx.decode_lease.queue(0)  # the prefill pool computes it, not decode
        ctx.prefill, r.prefill_lease = slot.instance, slot
        ctx.cached_predicted = self._cached(ctx, slot)
        seq = Seq(ctx.rid, ctx.prompt_tokens, 1, hold_kv=True, block_hashes=r.hashes)
        r.prefill = Hop(seq, self, tag=r)
        prefill = self.engines[slot.instance.id]
        prefill.submit(r.prefill)
        if self.layout.kv_mode == "push":  # both hops at once
            self._hop(r, ctx.decode_lease, (prefill, ctx.rid), push=True)

    def _hop(self, r: Req, lease: Lease | None, source: tuple[DesEngine, str] | None,
             push: bool = False) -> None:
        """The decode hop (colocated, or carrying the prefill's KV handle; with ``push``,
        sent beside the prefill hop)."""
        assert lease is not None
        f = r.fitted
        seq = Seq(r.ctx.rid, f.prompt_tokens, f.max_tokens, remote_kv=source is not None,
                  block_hashes=r.hashes)
        r.decode = Hop(seq, self, source=source, gaps=[], tag=r, push=push)
        self.engines[lease.instance.id].submit(r.decode)

    def _cached(self, ctx: Ctx, lease: Lease) -> int:
        assert ctx.blocks is not None
        cached = self.table.cached(lease.instance.id, ctx.blocks)
        lease.queue(ctx.prompt_tokens - cached)
        return cached

    # ---- the router's prefill queue --------------------------------------------------------

    def _wait_slot(self, r: Req, before_decode: bool) -> None:
        if not self._queue:
            inst = self.table.pick(Role.PREFILL, set(), r.ctx.blocks)
            if inst is not None:
                self._granted(r, before_decode, self.table.lease(inst))
                return
        r.queued_at = self.events.now
        self._queue.append((r, before_decode))
        self._queue_tokens += r.ctx.prompt_tokens
        timeout = self.table.settings.prefill_queue_timeout_s
        self.events.at(self.events.now + timeout, self._timed_out, r)

    def _granted(self, r: Req, before_decode: bool, slot: Lease | None) -> None:
        if r.queued_at is not None:
            r.ctx.router_queue_ms = (self.events.now - r.queued_at) * 1e3
            self._queue_tokens -= r.ctx.prompt_tokens
        if before_decode:
            self._route(r, slot)
        else:
            self._send(r, slot, slot is not None)

    def _timed_out(self, r: Req) -> None:
        for k, (waiting, before_decode) in enumerate(self._queue):
            if waiting is r:
                del self._queue[k]
                self._granted(r, before_decode, None)
                return

    def _wake(self) -> None:
        while self._queue:
            r, before_decode = self._queue[0]
            inst = self.table.pick(Role.PREFILL, set(), r.ctx.blocks)
            if inst is None:
                return
            self._queue.popleft()
            self._granted(r, before_decode, self.table.lease(inst))

    # ---- what the engines tell -------------------------------------------------------------

    def first_token(self, hop: Hop) -> None:
        r: Req = hop.tag  # type: ignore[assignment]
        if hop is r.decode and r.ctx.decode_lease is not None:
            r.ctx.decode_lease.queue(0)  # its prompt is computed: no longer queued work

    def finished(self, hop: Hop) -> None:
        r: Req = hop.tag  # type: ignore[assignment]
        if hop is r.prefill:
            assert r.prefill_lease is not None
            r.prefill_lease.release()
            if r.decode is not None and r.decode.push:  # it waits for this KV
                assert r.ctx.decode_lease is not None
                self.engines[r.ctx.decode_lease.instance.id].prefilled(r.ctx.rid)
            else:
                source = (self.engines[r.prefill_lease.instance.id], r.ctx.rid)
                self._hop(r, r.ctx.decode_lease, source)
            self._wake()
            return
        assert r.ctx.decode_lease is not None
        r.ctx.decode_lease.release()
        self._stop_if_done(self.engines[r.ctx.decode_lease.instance.id])
        self._record(r)

    def _record(self, r: Req) -> None:
        ctx, d, p = r.ctx, r.decode, r.prefill
        assert d is not None and d.first_at is not None and d.scheduled_at is not None
        now = self.events.now
        ttft_ms = (d.first_at - ctx.t0) * 1e3
        decode_times = EngineTimes((d.scheduled_at - d.arrived) * 1e3,
                                   (d.first_at - d.scheduled_at) * 1e3, 0.0,
                                   None if d.kv_s is None else d.kv_s * 1e3)
        prefill_times = None
        if p is not None:
            assert p.first_at is not None and p.scheduled_at is not None
            prefill_times = EngineTimes((p.scheduled_at - p.arrived) * 1e3,
                                        (p.first_at - p.scheduled_at) * 1e3, 0.0, None)
        b = breakdown(Observation(
            ttft_ms=ttft_ms, disaggregated=p is not None, prefill=prefill_times,
            prefill_wall_ms=0.0 if p is None else (p.finished_at - p.arrived) * 1e3,
            decode=decode_times, decode_wall_to_first_ms=(d.first_at - d.arrived) * 1e3,
            router_queue_ms=ctx.router_queue_ms))
        gap_p99, gap_max, n_gaps = gap_summary(d.gaps)
        if self.gap_log is not None and d.gaps:
            self.gap_log.extend(d.gaps)
        computed = p.seq if p is not None else d.seq
        e2e_ms = (now - ctx.t0) * 1e3
        rec = RequestRecord(
            id=ctx.rid, started_at=ctx.t0, endpoint=ctx.endpoint, path=ctx.path, status="ok",
            stream=True, prompt_tokens=ctx.prompt_tokens, output_tokens=d.seq.num_output,
            prefill_instance=None if ctx.prefill is None else ctx.prefill.id,
            decode_instance=None if ctx.decode is None else ctx.decode.id,
            queue_ms=b.queue_ms, prefill_ms=b.prefill_ms, transfer_ms=b.transfer_ms,
            decode_sched_ms=b.decode_sched_ms, overhead_ms=b.overhead_ms, ttft_ms=b.ttft_ms,
            e2e_ms=e2e_ms, kv_bytes=d.kv_bytes, gap_p99_ms=gap_p99, gap_max_ms=gap_max,
            gaps=n_gaps, cached_tokens_predicted=ctx.cached_predicted
            if p is not None else ctx.decode_cached_predicted,
            cached_tokens=computed.local_hit,
            decode_cached_tokens_predicted=ctx.decode_cached_predicted if p else None,
            decision=ctx.decision.name if ctx.decision else None,
            decision_reason=ctx.decision.reason if ctx.decision else None)
        if self.table.settings.disagg_policy == "slo":
            self.rates.observe(rec)
        f = r.fitted
        row = ReplayRow(
            index=r.index, line=r.trace.line, trace_s=r.trace.time_s, due_s=r.due_s,
            input_length=r.trace.input_length, prompt_tokens=f.prompt_tokens,
            max_tokens=f.max_tokens, clamped=f.clamped, ok=True, request_id=ctx.rid,
            sent_s=r.due_s, ttft_ms=round(ttft_ms, 3), e2e_ms=round(e2e_ms, 3),
            gap_p99_ms=gap_p99 if n_gaps else None, gap_max_ms=gap_max if n_gaps else None,
            gaps=n_gaps, output_chunks=d.seq.num_output, completion_tokens=d.seq.num_output,
            cached_tokens=computed.local_hit)
        self.served.rows.append(row)
        self.served.records.append(rec)
