"""The engine loop: runs the scheduler in wall time and tells request handlers what happened.

Each step: ask the scheduler for a plan, sleep the plan's modelled duration times
``time_scale``, apply the step and deliver tokens. The loop task exists only while there are
requests (an idle engine uses no CPU); KV pulls run as their own tasks.

KV hand-off follows vLLM's NixlConnector lease model, in wall seconds (not scaled by
``time_scale``): a prefill keeps a finished request's blocks until the lease ends (one loop
timer at the earliest end) unless a decode engine reads or releases them first; a decode
engine renews the leases it still waits on with heartbeats (one task, only while it waits on
some), and releases a lease it will never read. All request timings are wall times from
``time.monotonic()``: uvloop's loop clock has only millisecond resolution.

Prefix caching and KV events (see ``blocks`` and ``scheduler``): with ``--kv-events-config``
the cache's events go out as one batch per engine step that produced some (vLLM publishes at
the end of each step); events from work between steps (a handle read or expired, an abort, a
KV pull done) go out as one batch on the event loop's next turn. The decode side of a
disaggregated request lives in ``decode_hop`` (pull mode) and ``push_hop`` (push mode,
``--kv-connector NixlPushConnector``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid

from controller.engines.sim.config import SimEngineConfig
from controller.engines.sim.cost import step_duration
from controller.engines.sim.decode_hop import DecodeHops
from controller.engines.sim.events import KvEventPublisher
from controller.engines.sim.kv_pull import KvPuller, KvRefused, PullResult, advertised_host
from controller.engines.sim.metrics import SimMetrics
from controller.engines.sim.protocol import EngineError, RemoteKv, SimRequest
from controller.engines.sim.push import PushBook, Pushed
from controller.engines.sim.push_hop import PushHops
from controller.engines.sim.scheduler import Handle, Scheduler, Seq, StepPlan, StepResult
from controller.engines.sim.stream import RequestStream
from pdctl_api import profiles

# How far (wall seconds) the loop may run behind its modelled clock and still catch up by
# shortening later sleeps: absorbs asyncio's oversleep without bursting after a long stall.
MAX_LAG_S = 0.01

logger = logging.getLogger(__name__)


def capacity_blocks(m: profiles.ModelProfile, hw: profiles.HardwareProfile, tp: int,
                    block_size: int) -> int:
    """KV blocks of an instance; never less than one full-length sequence needs."""
    blocks = profiles.kv_capacity_tokens(m, hw, tp) // block_size
    return max(blocks, math.ceil(m.max_model_len / block_size))


class SimEngine(DecodeHops, PushHops):
    def __init__(self, cfg: SimEngineConfig, engine_id: str, metrics: SimMetrics,
                 puller: KvPuller) -> None:
        self.cfg = cfg
        self.engine_id = engine_id
        self.metrics = metrics
        self._model = cfg.model_profile
        self._hw = profiles.hardware(cfg.hardware)
        self._link = profiles.link(cfg.link)
        self._puller = puller
        puller.unreachable = cfg.fault_kv_unreachable
        self._side_host = advertised_host(cfg.host)
        self.scheduler = Scheduler(capacity_blocks(self._model, self._hw, cfg.tp, cfg.block_size),
                                   cfg.block_size, cfg.max_num_seqs,
                                   cfg.max_num_batched_tokens, cfg.kv_lease_duration_s,
                                   record_events=cfg.kv_events_enabled,
                                   on_lookup=self._looked_up)
        self.publisher: KvEventPublisher | None = None
        self._flush: asyncio.Handle | None = None
        self._streams: dict[str, RequestStream] = {}
        self._remote: dict[str, RemoteKv] = {}  # decode hops whose pull has not started
        self._pulls: dict[str, asyncio.Task[None]] = {}
        self._draining: set[str] = set()  # aborted while their pull was in flight
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        # prefill side: one timer at (or before) the earliest lease end while handles exist
        self._expiry: asyncio.TimerHandle | None = None
        self._expiry_at = 0.0
        # decode side: leases this engine waits on, renewed by one task while there are any
        self._leases: dict[str, RemoteKv] = {}
        self._heartbeat_task: asyncio.Task[None] | None = None
        self._last_heartbeat = -math.inf
        self._background: set[asyncio.Task[None]] = set()  # heartbeats and releases in flight
        # push mode: decode hops registered with their prefill and waiting for the write;
        # on the prefill side, registrations waiting for a prefill and handles being written
        self._push_waits: dict[str, tuple[asyncio.Future[Pushed], RemoteKv]] = {}
        self._push_book = PushBook()
        self._writing: dict[str, Handle] = {}
        self.push_stalled = False  # the fault knob (POST /sim/fault)

    # ---- requests ----------------------------------------------------------------------

    def submit(self, req: SimRequest) -> RequestStream:
        """Queue a request; its stream reports tokens and the end."""
        seq_id = req.request_id
        if self.scheduler.in_use(seq_id):  # a reused X-Request-Id must not collide
            seq_id = f"{seq_id}-{uuid.uuid4().hex[:8]}"
        stream = RequestStream(seq_id, time.monotonic(), req.stream)
        self.scheduler.add(Seq(seq_id, req.prompt_tokens, req.max_tokens,
                               hold_kv=req.remote_decode,
                               remote_kv=req.remote_prefill is not None,
                               token_ids=req.token_ids))
        self._streams[seq_id] = stream
        if req.remote_prefill is not None:
            remote = req.remote_prefill
            # One line per KV handle received: tests check that no handle reaches two engines.
            logger.info("decode hop for KV handle %s of engine %s (request %s)",
                        remote.request_id, remote.engine_id, req.request_id)
            self._remote[seq_id] = remote
            self._hold_lease(seq_id, remote)
        self._kick()
        return stream

    def reject(self, remote: RemoteKv) -> None:
        """A decode hop was refused before it reached the engine: free the prefill's KV.

        vLLM's serving layer does the same (``notify_kv_transfer_request_rejected``), so a
        bad request does not strand blocks on the prefill until its lease ends.
        """
        self._release(remote)

    def abort(self, stream: RequestStream) -> None:
        """The client went away: drop the request from the batch and free its KV.

        Takes the stream, not an id, so a late abort never hits a newer request that
        reuses the id; a no-op once the request is over.
        """
        seq_id = stream.seq_id
        if self._streams.get(seq_id) is not stream:
            return
        del self._streams[seq_id]
        self._drop_lease(seq_id)
        if self._abort_push_wait(seq_id):  # registered: the prefill is told to drop it
            self.scheduler.abort(seq_id)
        elif seq_id in self._pulls:
            # The read is in flight: let it finish (it frees the prefill's handle), then the
            # pull drops the request and its blocks.
            self._draining.add(seq_id)
        else:
            self.scheduler.abort(seq_id)
            remote = self._remote.pop(seq_id, None)
            if remote is not None:  # never read: vLLM's request_finished notifies the prefill
                self._release(remote)
        stream.finish(EngineError("request aborted: the client disconnected", 499,
                               "RequestAborted"))
        self._kick()

    # ---- the side channel, prefill side ------------------------------------------------------

    def serve_pull(self, seq_id: str, engine_id: str, block_ids: list[int]
                   ) -> PullResult | None:
        """A decode engine reads ``block_ids`` of a prefill's KV (the tail of the handle's
        blocks: those the decode engine's prefix cache lacks) and the handle is freed.

        None when this engine no longer tracks the handle (lease expired, read or released
        already, never existed): the read still "succeeds", as a NIXL read of raw blocks
        does, and only the prefill counts and logs it. ``KvRefused`` for another engine id
        or other blocks than the handle's.
        """
        self._expire_due()
        self._check_engine(engine_id)
        handle = self.scheduler.handles.get(seq_id)
        if handle is None:
            self._unrecognized(seq_id)
            return None
        if len(block_ids) > len(handle.blocks) or \
                handle.blocks[len(handle.blocks) - len(block_ids):] != block_ids:
            raise KvRefused(f"KV handle {seq_id!r} holds other blocks than the "
                            f"{len(block_ids)} asked for")
        self._free_handle(seq_id)
        return PullResult(handle.prompt_tokens, self.block_bytes(len(block_ids)))

    def serve_release(self, seq_id: str, engine_id: str) -> bool:
        """A decode engine will not read a handle (vLLM's notification-only read): free it.

        False (counted and logged like any notification of an unknown request) when this
        engine no longer tracks it. ``KvRefused`` for another engine id.
        """
        self._expire_due()
        self._check_engine(engine_id)
        if self.push_mode and self._serve_push_release(seq_id):
            return True
        if seq_id not in self.scheduler.handles:
            self._unrecognized(seq_id)
            return False
        self._free_handle(seq_id)
        return True

    def serve_heartbeat(self, engine_id: str, seq_ids: list[str]) -> int:
        """Push the leases of known handles to at least now + the lease extension.

        Unknown ids are ignored; returns how many handles were known. ``KvRefused`` for
        another engine id.
        """
        self._expire_due()
        self._check_engine(engine_id)
        until = time.monotonic() + self.cfg.kv_lease_extension_s
        return self.scheduler.extend(seq_ids, until)

    @property
    def kv_unreachable(self) -> bool:
        """The fault knob: every prefill's side channel is unreachable from this engine."""
        return self._puller.unreachable

    @kv_unreachable.setter
    def kv_unreachable(self, value: bool) -> None:
        self._puller.unreachable = value

    @property
    def num_kv_handles(self) -> int:
        """Prefill KV held for decode engines: under a lease, or being pushed."""
        return len(self.scheduler.handles) + len(self._writing)

    @property
    def num_push_registrations(self) -> int:
        """Push mode, prefill side: registrations waiting for their prefill to finish."""
        return self._push_book.num_registrations

    @property
    def num_push_waiting(self) -> int:
        """Push mode, decode side: requests registered and waiting for the prefill's write."""
        return len(self._push_waits)

    def kv_bytes(self, prompt_tokens: int) -> int:
        return profiles.kv_bytes(self._model, prompt_tokens, self.cfg.block_size)

    def block_bytes(self, blocks: int) -> int:
        return profiles.kv_bytes(self._model, blocks * self.cfg.block_size, self.cfg.block_size)

    # ---- prefix cache and KV events ------------------------------------------------------

    async def start_events(self) -> None:
        """Bind the KV-event publisher when the config asks for one (the app's startup)."""
        if self.cfg.kv_events_enabled and self.publisher is None:
            assert self.cfg.kv_events_config is not None
            self.publisher = await KvEventPublisher.start(self.cfg.kv_events_config)

    def reset_prefix_cache(self) -> bool:
        """vLLM's ``reset_prefix_cache``: False while blocks are in use."""
        done = self.scheduler.pool.reset()
        self._note_events()
        return done

    def _looked_up(self, queried: int, hits: int) -> None:
        self.metrics.prefix_cache_queries.inc(queried)
        self.metrics.prefix_cache_hits.inc(hits)

    def _note_events(self) -> None:
        """Publish what happened between steps on the loop's next turn (one batch)."""
        if self.publisher is not None and self._flush is None \
                and self.scheduler.pool.has_events:
            self._flush = asyncio.get_running_loop().call_soon(self._publish_events)

    def _publish_events(self) -> None:
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        pool = self.scheduler.pool
        if pool.has_events:
            events = pool.take_events()
            if self.publisher is not None:
                self.publisher.publish(events)

    async def close(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        self._push_book.clear()
        tasks = [t for t in (self._task, self._heartbeat_task, *self._pulls.values(),
                             *self._background) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._puller.aclose()
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        if self.publisher is not None:
            await self.publisher.close()
            self.publisher = None

    # ---- the loop ------------------------------------------------------------------------

    def _kick(self) -> None:
        self._note_events()
        if self._task is None or self._task.done():
            if self.scheduler.num_running or self.scheduler.num_waiting:
                self._task = asyncio.get_running_loop().create_task(self._run())
        else:
            self._wake.set()

    async def _run(self) -> None:
        clock = time.monotonic()
        while self.scheduler.num_running or self.scheduler.num_waiting:
            plan = self.scheduler.schedule()
            if plan.kv_loads:
                (self._start_registrations if self.push_mode else self._start_pulls)(
                    plan.kv_loads)
            if plan.empty:  # only KV pulls in flight or blocked on KV space: wait for news
                self._publish_events()
                self._wake.clear()
                await self._wake.wait()
                clock = time.monotonic()  # time spent idle is not lag to catch up on
                continue
            start = time.monotonic()
            if clock < start - MAX_LAG_S:  # behind the model by more than it may catch up
                self.metrics.lag.inc(start - MAX_LAG_S - clock)
                clock = start - MAX_LAG_S
            self._scheduled(plan, start)
            step = self._duration(plan) * self.cfg.time_scale
            self.metrics.busy.inc(step)
            clock += step
            await asyncio.sleep(clock - start)
            now = time.monotonic()
            self._deliver(self.scheduler.complete(plan, now), now)
            self._publish_events()  # one batch per step, as vLLM publishes

    def _duration(self, plan: StepPlan) -> float:
        prefill, decode = plan.workload()
        return step_duration(self._model, self._hw, self.cfg.tp, prefill, decode)

    def _scheduled(self, plan: StepPlan, now: float) -> None:
        for seq in plan.first_scheduled:
            stream = self._streams[seq.seq_id]
            stream.scheduled_at = now
            self.metrics.queue_time.observe(now - stream.arrival)

    def _deliver(self, result: StepResult, now: float) -> None:
        m = self.metrics
        if result.tokens:
            m.generation_tokens.inc(len(result.tokens))
        for seq in result.tokens:
            stream = self._streams[seq.seq_id]
            gap = stream.token(now)
            if gap is None:
                self._first_token(seq, stream, now)
            else:
                m.itl.observe(gap)
        for seq in result.finished:
            self._finished(seq, self._streams.pop(seq.seq_id), now)

    def _first_token(self, seq: Seq, stream: RequestStream, now: float) -> None:
        m = self.metrics
        m.ttft.observe(now - stream.arrival)
        m.prefill_time.observe(now - (stream.scheduled_at or now))
        m.prompt_tokens.inc(seq.prompt_tokens)
        m.prompt_external.inc(seq.external_tokens)
        m.prompt_cache_hit.inc(seq.local_hit)
        m.prompt_local.inc(seq.prompt_tokens - seq.external_tokens - seq.local_hit)
        # vLLM's num_cached_tokens: prompt tokens not computed here (local hits + remote KV)
        stream.cached_tokens = seq.local_hit + seq.external_tokens

    def _finished(self, seq: Seq, stream: RequestStream, now: float) -> None:
        m = self.metrics
        m.success_length.inc()
        m.e2e.observe(now - stream.arrival)
        m.decode_time.observe(now - (stream.first_token_at or now))
        if seq.hold_kv:
            handle = self.scheduler.handles[seq.seq_id]
            stream.handle_blocks = handle.blocks
            if not (self.push_mode and self._push_finished(seq.seq_id)):
                self._arm_expiry(handle.expires_at)
        stream.finish()

    # ---- KV leases on the prefill side ---------------------------------------------------------

    def _check_engine(self, engine_id: str) -> None:
        if engine_id != self.engine_id:
            raise KvRefused(f"this is engine {self.engine_id!r}, not {engine_id!r}")

    def _unrecognized(self, seq_id: str) -> None:
        """A read or release of a handle this engine no longer tracks (vLLM's words)."""
        self.metrics.notifications_after_expiry.inc()
        logger.error("Potentially invalid KV blocks for unrecognized request %s were "
                     "retrieved by a decode worker. They may have expired.", seq_id)

    def _free_handle(self, seq_id: str) -> None:
        self.scheduler.pull(seq_id)
        if not self.scheduler.handles:
            self._disarm_expiry()
        self._kick()

    def _arm_expiry(self, at: float | None) -> None:
        """Keep the timer at or before ``at``, the end of a lease (None: no handle left).

        The timer may be early: heartbeats only move leases later, and a timer that finds
        nothing due re-arms at the earliest end. So ``_expiry_at`` never passes a lease end.
        """
        if at is None:
            self._disarm_expiry()
            return
        if self._expiry is not None:
            if self._expiry_at <= at:
                return
            self._expiry.cancel()
        delay = max(at - time.monotonic(), 0.0)
        self._expiry_at = at
        self._expiry = asyncio.get_running_loop().call_later(delay, self._on_expiry_timer)

    def _disarm_expiry(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None

    def _on_expiry_timer(self) -> None:
        self._expiry = None
        # The timer is due at _expiry_at even if the loop's coarser clock fired it a bit early.
        self._expire(max(time.monotonic(), self._expiry_at))
        self._arm_expiry(self.scheduler.next_expiry())

    def _expire_due(self) -> None:
        """Free leases that ended before the timer ran (a call racing the timer)."""
        now = time.monotonic()
        if self._expiry is not None and self._expiry_at <= now:
            self._expiry.cancel()
            self._on_expiry_timer()

    def _expire(self, now: float) -> None:
        expired = self.scheduler.expire(now)
        for handle in expired:
            self.metrics.expired_kv.inc()
            logger.warning("Releasing expired KV blocks for request %s which were retrieved "
                           "by %d remote worker(s) before lease expired.", handle.seq_id, 0)
        if expired:
            self._kick()
