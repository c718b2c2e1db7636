"""The engine loop: runs the scheduler in wall time and tells request handlers what happened.

Each step: ask the scheduler for a plan, sleep the plan's modelled duration times
``time_scale``, apply the step and deliver tokens. The loop task exists only while there are
requests (an idle engine uses no CPU); KV pulls run as their own tasks; handle expiry is a
loop timer. All request timings are wall times from ``time.monotonic()``: uvloop's loop
clock has only millisecond resolution.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid

from controller import profiles
from controller.engines.sim.config import SimEngineConfig
from controller.engines.sim.cost import step_duration
from controller.engines.sim.kv_pull import KvPuller, KvPullError, PullResult
from controller.engines.sim.metrics import SimMetrics
from controller.engines.sim.protocol import ApiError, KvLoadFailure, RemoteKv, SimRequest
from controller.engines.sim.scheduler import Handle, Scheduler, Seq, StepPlan, StepResult
from controller.engines.sim.stream import RequestStream

# How far (wall seconds) the loop may run behind its modelled clock and still catch up by
# shortening later sleeps: absorbs asyncio's oversleep without bursting after a long stall.
MAX_LAG_S = 0.01


def capacity_blocks(cfg: SimEngineConfig) -> int:
    """KV blocks of the instance; never less than one full-length sequence needs."""
    m, hw = profiles.model(cfg.model), profiles.hardware(cfg.hardware)
    blocks = profiles.kv_capacity_tokens(m, hw, cfg.tp) // cfg.block_size
    return max(blocks, math.ceil(m.max_model_len / cfg.block_size))


class SimEngine:
    def __init__(self, cfg: SimEngineConfig, engine_id: str, metrics: SimMetrics,
                 puller: KvPuller) -> None:
        self.cfg = cfg
        self.engine_id = engine_id
        self.metrics = metrics
        self._model = profiles.model(cfg.model)
        self._hw = profiles.hardware(cfg.hardware)
        self._link = profiles.link(cfg.link)
        self._puller = puller
        self.scheduler = Scheduler(capacity_blocks(cfg), cfg.block_size, cfg.max_num_seqs,
                                   cfg.max_num_batched_tokens)
        self._streams: dict[str, RequestStream] = {}
        self._remote: dict[str, RemoteKv] = {}
        self._pulls: dict[str, asyncio.Task[None]] = {}
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._expiry: asyncio.TimerHandle | None = None

    # ---- requests ----------------------------------------------------------------------

    def submit(self, req: SimRequest) -> RequestStream:
        """Queue a request; its stream reports tokens and the end."""
        seq_id = req.request_id
        if self.scheduler.in_use(seq_id):  # a reused X-Request-Id must not collide
            seq_id = f"{seq_id}-{uuid.uuid4().hex[:8]}"
        stream = RequestStream(seq_id, time.monotonic(), req.stream)
        self.scheduler.add(Seq(seq_id, req.prompt_tokens, req.max_tokens,
                               hold_kv=req.remote_decode,
                               remote_kv=req.remote_prefill is not None))
        self._streams[seq_id] = stream
        if req.remote_prefill is not None:
            self._remote[seq_id] = req.remote_prefill
        self._kick()
        return stream

    def abort(self, stream: RequestStream) -> None:
        """The client went away: drop the request from the batch and free its KV.

        Takes the stream, not an id, so a late abort never hits a newer request that
        reuses the id; a no-op once the request is over.
        """
        seq_id = stream.seq_id
        if self._streams.get(seq_id) is not stream:
            return
        del self._streams[seq_id]
        self.scheduler.abort(seq_id)
        self._remote.pop(seq_id, None)
        pull = self._pulls.pop(seq_id, None)
        if pull is not None:
            pull.cancel()
        stream.finish(ApiError("request aborted: the client disconnected", 499,
                               "RequestAborted"))
        self._kick()

    def serve_pull(self, seq_id: str, engine_id: str, block_ids: list[int]) -> Handle | None:
        """A decode engine takes a prefill's KV; None if unknown, expired or not ours."""
        self._expire()
        if engine_id != self.engine_id:
            return None
        handle = self.scheduler.handles.get(seq_id)
        if handle is None or handle.blocks != block_ids:
            return None
        self.scheduler.pull(seq_id)
        self._kick()
        return handle

    def kv_bytes(self, prompt_tokens: int) -> int:
        return profiles.kv_bytes(self._model, prompt_tokens, self.cfg.block_size)

    async def close(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
        tasks = [t for t in (self._task, *self._pulls.values()) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._puller.aclose()

    # ---- the loop ------------------------------------------------------------------------

    def _kick(self) -> None:
        if self._task is None or self._task.done():
            if self.scheduler.num_running or self.scheduler.num_waiting:
                self._task = asyncio.get_running_loop().create_task(self._run())
        else:
            self._wake.set()

    async def _run(self) -> None:
        clock = time.monotonic()
        while self.scheduler.num_running or self.scheduler.num_waiting:
            plan = self.scheduler.schedule()
            self._start_pulls(plan.kv_loads)
            if plan.empty:  # only KV pulls in flight or blocked on KV space: wait for news
                self._wake.clear()
                await self._wake.wait()
                clock = time.monotonic()  # time spent idle is not lag to catch up on
                continue
            start = time.monotonic()
            clock = max(clock, start - MAX_LAG_S)
            self._scheduled(plan, start)
            clock += self._duration(plan) * self.cfg.time_scale
            await asyncio.sleep(clock - start)
            now = time.monotonic()
            self._deliver(self.scheduler.complete(plan, now), now)

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
        m.prompt_local.inc(seq.prompt_tokens - seq.external_tokens)

    def _finished(self, seq: Seq, stream: RequestStream, now: float) -> None:
        m = self.metrics
        m.success_length.inc()
        m.e2e.observe(now - stream.arrival)
        m.decode_time.observe(now - (stream.first_token_at or now))
        if seq.hold_kv:
            stream.handle_blocks = self.scheduler.handles[seq.seq_id].blocks
            self._arm_expiry()
        stream.finish()

    # ---- KV handles on the prefill side ------------------------------------------------------

    def _arm_expiry(self) -> None:
        if self._expiry is not None or not self.scheduler.handles:
            return
        oldest = next(iter(self.scheduler.handles.values()))
        loop = asyncio.get_running_loop()
        delay = max(oldest.created_at + self.cfg.kv_handle_ttl_s - time.monotonic(), 0.0)
        self._expiry = loop.call_later(delay, self._on_expiry_timer)

    def _on_expiry_timer(self) -> None:
        self._expiry = None
        self._expire()
        self._arm_expiry()

    def _expire(self) -> None:
        now = time.monotonic()
        expired = self.scheduler.expire(now, self.cfg.kv_handle_ttl_s)
        if expired:
            self.metrics.expired_kv.inc(len(expired))
            self._kick()

    # ---- KV pulls on the decode side -------------------------------------------------------

    def _start_pulls(self, seqs: list[Seq]) -> None:
        loop = asyncio.get_running_loop()
        for seq in seqs:
            remote = self._remote.pop(seq.seq_id)
            self._pulls[seq.seq_id] = loop.create_task(self._pull(seq.seq_id, remote))

    async def _pull(self, seq_id: str, remote: RemoteKv) -> None:
        started = time.monotonic()
        try:
            result = await self._puller.pull(remote)
        except KvPullError as exc:
            self._pull_failed(seq_id, exc.reason, time.monotonic() - started)
            return
        posted = time.monotonic()
        await asyncio.sleep(profiles.transfer_seconds(result.kv_bytes, self._link)
                            * self.cfg.time_scale)
        self._pull_done(seq_id, remote, result, posted - started, time.monotonic() - posted)

    def _pull_done(self, seq_id: str, remote: RemoteKv, result: PullResult, post_s: float,
                   xfer_s: float) -> None:
        m = self.metrics
        m.post_time.observe(post_s)
        m.xfer_time.observe(xfer_s)
        m.bytes_transferred.observe(result.kv_bytes)
        m.descriptors.observe(len(remote.block_ids))
        del self._pulls[seq_id]
        self._streams[seq_id].kv_transfer_s = post_s + xfer_s
        self.scheduler.kv_loaded(seq_id)
        self._kick()

    def _pull_failed(self, seq_id: str, reason: str, elapsed_s: float) -> None:
        self.metrics.failed_transfers.inc()
        del self._pulls[seq_id]
        stream = self._streams[seq_id]
        stream.kv_transfer_s = elapsed_s
        if self.cfg.kv_load_failure_policy == "recompute":
            self.scheduler.kv_failed(seq_id)
        else:
            self.scheduler.abort(seq_id)
            del self._streams[seq_id]
            stream.finish(KvLoadFailure(reason))
        self._kick()
