"""The decode side of a disaggregated request in the simulated engine: the lease it waits on
(heartbeats to the prefill, a release when it will not read) and the KV pull itself.

A mixin of ``SimEngine`` (split out to keep modules short). With prefix caching the pull
reads only the blocks this engine does not hold already (vLLM's NixlConnector in pull mode:
``nixl/pull_scheduler.py`` asks for ``prompt - local hit`` tokens and the worker trims the
prefill's block list to its tail), so its bytes, descriptors and transfer time scale with the
missing blocks; a stale read (the prefill no longer tracks the handle) moves as many.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import Any

from controller.engines.sim.config import SimEngineConfig
from controller.engines.sim.kv_pull import PULL_TIMEOUT_S, KvPuller, KvPullError
from controller.engines.sim.metrics import SimMetrics
from controller.engines.sim.protocol import KvLoadFailure, RemoteKv
from controller.engines.sim.scheduler import Scheduler, Seq
from controller.engines.sim.stream import RequestStream
from pdctl_api import profiles

# the engine's logger: its lines are the engine's (tests and the sim host read them by name)
log = logging.getLogger("controller.engines.sim.engine")


class DecodeHops:
    """Leases and pulls of decode hops; ``SimEngine`` provides the state below."""

    cfg: SimEngineConfig
    metrics: SimMetrics
    scheduler: Scheduler
    _puller: KvPuller
    _link: profiles.LinkProfile
    _streams: dict[str, RequestStream]
    _remote: dict[str, RemoteKv]  # decode hops whose pull has not started
    _pulls: dict[str, asyncio.Task[None]]
    _draining: set[str]  # aborted while their pull was in flight
    _leases: dict[str, RemoteKv]
    _heartbeat_task: asyncio.Task[None] | None
    _last_heartbeat: float
    _background: set[asyncio.Task[None]]  # heartbeats and releases in flight

    def _kick(self) -> None:
        raise NotImplementedError

    def block_bytes(self, blocks: int) -> int:
        raise NotImplementedError

    # ---- KV leases on the decode side ----------------------------------------------------------

    def _hold_lease(self, seq_id: str, remote: RemoteKv) -> None:
        """Heartbeat ``remote`` until its read is over (vLLM: on_new_request)."""
        self._leases[seq_id] = remote
        if self._heartbeat_task is None or self._heartbeat_task.done():
            self._heartbeat_task = asyncio.get_running_loop().create_task(self._heartbeats())

    def _drop_lease(self, seq_id: str) -> None:
        """Stop heartbeating for ``seq_id`` (vLLM: _stop_heartbeat); the task ends with the
        last lease, so an idle engine has none."""
        if self._leases.pop(seq_id, None) is not None and not self._leases:
            if self._heartbeat_task is not None:
                self._heartbeat_task.cancel()
                self._heartbeat_task = None

    async def _heartbeats(self) -> None:
        """One heartbeat per remote engine every ``lease / 6`` seconds, naming every lease
        this engine waits on there. Like vLLM's throttle, the first one goes at once unless
        one went less than an interval ago."""
        interval = self.cfg.kv_heartbeat_interval_s
        while self._leases:
            wait = self._last_heartbeat + interval - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
                continue
            self._last_heartbeat = time.monotonic()
            by_engine: dict[tuple[str, str, int], dict[str, None]] = {}
            for remote in self._leases.values():
                key = (remote.engine_id, remote.host, remote.port)
                by_engine.setdefault(key, {})[remote.request_id] = None
            for (engine_id, host, port), ids in by_engine.items():
                self._spawn(self._send_heartbeat(engine_id, host, port, list(ids),
                                                 min(interval, PULL_TIMEOUT_S)))

    async def _send_heartbeat(self, engine_id: str, host: str, port: int, ids: list[str],
                              timeout_s: float) -> None:
        try:
            await self._puller.heartbeat(host, port, engine_id, ids, timeout_s)
        except KvPullError as exc:
            log.debug("Failed to send heartbeat to engine %s: %s", engine_id, exc.reason)

    def _release(self, remote: RemoteKv) -> None:
        """Tell the prefill it can free a handle this engine will not read."""
        self._spawn(self._send_release(remote))

    async def _send_release(self, remote: RemoteKv) -> None:
        try:
            await self._puller.release(remote)
        except KvPullError as exc:
            log.warning("Failed to notify engine %s to release the KV blocks of request %s; "
                           "they will be freed when their lease expires: %s",
                           remote.engine_id, remote.request_id, exc.reason)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run a notification in the background; ``close`` cancels those still running."""
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # ---- KV pulls on the decode side -------------------------------------------------------

    def _start_pulls(self, seqs: list[Seq]) -> None:
        loop = asyncio.get_running_loop()
        for seq in seqs:
            remote = self._remote.pop(seq.seq_id)
            # The blocks this engine's prefix cache does not hold: the tail of the prefill's.
            missing = remote.block_ids[seq.hit_blocks:]
            self._pulls[seq.seq_id] = loop.create_task(self._pull(seq.seq_id, remote, missing))

    async def _pull(self, seq_id: str, remote: RemoteKv, block_ids: list[int]) -> None:
        started = time.monotonic()
        try:
            result = await self._puller.pull(remote, block_ids)
        except KvPullError as exc:
            self._pull_failed(seq_id, exc.reason, time.monotonic() - started)
            return
        # A stale read (the prefill no longer tracked the handle) moves the blocks asked
        # for all the same, as a NIXL read of the raw blocks would.
        kv_bytes = self.block_bytes(len(block_ids)) if result.stale else result.kv_bytes
        posted = time.monotonic()
        await asyncio.sleep(profiles.transfer_seconds(kv_bytes, self._link)
                            * self.cfg.time_scale)
        self._pull_done(seq_id, len(block_ids), kv_bytes, posted - started,
                        time.monotonic() - posted)

    def _pull_done(self, seq_id: str, blocks: int, kv_bytes: int, post_s: float,
                   xfer_s: float) -> None:
        m = self.metrics
        m.post_time.observe(post_s)
        m.xfer_time.observe(xfer_s)
        m.bytes_transferred.observe(kv_bytes)
        m.descriptors.observe(blocks)
        del self._pulls[seq_id]
        self._drop_lease(seq_id)
        if self._dropped_after_pull(seq_id):
            return
        self._streams[seq_id].kv_transfer_s = post_s + xfer_s
        self.scheduler.kv_loaded(seq_id)
        self._kick()

    def _dropped_after_pull(self, seq_id: str) -> bool:
        """A request aborted while its pull ran leaves once the pull is over."""
        if seq_id not in self._draining:
            return False
        self._draining.discard(seq_id)
        self.scheduler.abort(seq_id)
        self._kick()
        return True

    def _pull_failed(self, seq_id: str, reason: str, elapsed_s: float) -> None:
        self.metrics.failed_transfers.inc()
        del self._pulls[seq_id]
        self._drop_lease(seq_id)
        if self._dropped_after_pull(seq_id):
            return
        stream = self._streams[seq_id]
        stream.kv_transfer_s = elapsed_s
        if self.cfg.kv_load_failure_policy == "recompute":
            self.scheduler.kv_failed(seq_id)
        else:
            self.scheduler.abort(seq_id)
            del self._streams[seq_id]
            stream.finish(KvLoadFailure(reason))
        self._kick()
