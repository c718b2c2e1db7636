"""Push mode of the KV hand-off in the simulated engine (vLLM 0.32's ``NixlPushConnector``).

A mixin of ``SimEngine``, beside ``decode_hop`` (pull). See ``push`` for the flow. Here:

Decode side. When the scheduler admits a decode hop (blocks allocated for the whole prompt,
its own prefix-cache hits first, state ``WAITING_FOR_REMOTE_KV``), the engine registers the
blocks its cache lacks with the prefill (``POST /sim/kv/register``, or a direct call to a
prefill of this process) and waits for the prefill's ``pushed`` call. The wait counts as
queue time, as in vLLM. A registration the prefill refuses (wrong engine id, a prefill not in
push mode) or cannot take (unreachable, or the fault knob) is a failed KV load at once; one
not fulfilled within ``push_registration_timeout`` (default: the KV lease, vLLM's
``decoder_kv_blocks_ttl``) fails too and tells the prefill to drop it. A failed load follows
``kv_load_failure_policy``: ``fail`` answers 500, ``recompute`` prefills locally (silently,
counted as ``local_compute``), and ``vllm:nixl_num_failed_transfers_total`` counts it. Until
it registers the decode engine heartbeats the prefill's lease, as in pull mode. A request
aborted while it waits for the write is dropped at once and the prefill is told to release;
unlike vLLM, its blocks are not held until a write in flight ends (the simulator moves no
data, so nothing can be corrupted). Transfer metrics are observed on the decode side as in
pull mode: ``post`` is the registration's handshake, ``xfer`` the prefill's write.

Prefill side. A finished prefill with ``do_remote_decode`` keeps its blocks under the lease
(as in pull mode). A registration that matches it (before or after it finished) starts the
write: the handle leaves the lease (it can no longer expire), the write takes the modelled
transfer time of the written blocks' bytes on this engine's link, then the decode engine is
told and the blocks are freed. No registration within the lease: the blocks are freed and
counted in ``vllm:nixl_num_kv_expired_reqs_total``, as in pull mode.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import Any

from controller.engines.sim.config import SimEngineConfig
from controller.engines.sim.kv_pull import KvPuller, KvPullError, KvRefused
from controller.engines.sim.protocol import RemoteKv
from controller.engines.sim.push import PushBook, Pushed, Registration, find_handle
from controller.engines.sim.scheduler import Handle, Scheduler, Seq
from pdctl_api import profiles

log = logging.getLogger("controller.engines.sim.engine")


class PushHops:
    """Registrations, waits and writes of push mode; ``SimEngine`` provides the state below."""

    cfg: SimEngineConfig
    engine_id: str
    scheduler: Scheduler
    _puller: KvPuller
    _link: profiles.LinkProfile
    _remote: dict[str, RemoteKv]
    _pulls: dict[str, asyncio.Task[None]]
    _draining: set[str]
    _side_host: str  # where other engines reach this engine's side channel
    _push_waits: dict[str, tuple[asyncio.Future[Pushed], RemoteKv]]  # registered, not written
    _push_book: PushBook
    _writing: dict[str, Handle]  # prefill handles being written, out of the lease
    push_stalled: bool  # the fault knob: registrations are taken and never written

    def _kick(self) -> None:
        raise NotImplementedError

    def block_bytes(self, blocks: int) -> int:
        raise NotImplementedError

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        raise NotImplementedError

    def _release(self, remote: RemoteKv) -> None:
        raise NotImplementedError

    def _drop_lease(self, seq_id: str) -> None:
        raise NotImplementedError

    def _pull_done(self, seq_id: str, blocks: int, kv_bytes: int, post_s: float,
                   xfer_s: float) -> None:
        raise NotImplementedError

    def _dropped_after_pull(self, seq_id: str) -> bool:
        raise NotImplementedError

    def _pull_failed(self, seq_id: str, reason: str, elapsed_s: float) -> None:
        raise NotImplementedError

    def _expire_due(self) -> None:
        raise NotImplementedError

    def _check_engine(self, engine_id: str) -> None:
        raise NotImplementedError

    def _free_handle(self, seq_id: str) -> None:
        raise NotImplementedError

    def _disarm_expiry(self) -> None:
        raise NotImplementedError

    @property
    def push_mode(self) -> bool:
        return self.cfg.kv_transfer_mode == "push"

    # ---- decode side -------------------------------------------------------------------

    def _start_registrations(self, seqs: list[Seq]) -> None:
        loop = asyncio.get_running_loop()
        for seq in seqs:
            remote = self._remote.pop(seq.seq_id)
            reg = Registration(
                request_id=seq.seq_id, remote_engine_id=remote.engine_id,
                remote_host=remote.host, remote_port=remote.port,
                decode_engine_id=self.engine_id, decode_host=self._side_host,
                decode_port=self.cfg.port,
                num_blocks=len(seq.blocks) - seq.hit_blocks)  # what the cache lacks
            self._pulls[seq.seq_id] = loop.create_task(self._await_push(remote, reg))

    async def _await_push(self, remote: RemoteKv, reg: Registration) -> None:
        seq_id = reg.request_id
        started = time.monotonic()
        try:
            await self._puller.register(reg)
        except KvPullError as exc:
            self._pull_failed(seq_id, exc.reason, time.monotonic() - started)
            return
        registered = time.monotonic()
        if seq_id in self._draining:  # aborted while it registered: the prefill may free
            self._release(remote)
            del self._pulls[seq_id]
            self._drop_lease(seq_id)
            self._dropped_after_pull(seq_id)
            return
        self._drop_lease(seq_id)  # the prefill holds the registration now: no heartbeats
        waiter: asyncio.Future[Pushed] = asyncio.get_running_loop().create_future()
        self._push_waits[seq_id] = (waiter, remote)
        timeout = self.cfg.push_timeout_s
        try:
            done = await asyncio.wait_for(waiter, timeout)
        except TimeoutError:
            log.warning("NixlPushConnector: registration for request %s timed out after "
                        "%.1fs without a push completion", seq_id, timeout)
            self._release(remote)  # the prefill drops the registration and frees its blocks
            self._pull_failed(seq_id, f"engine {remote.engine_id!r} at {remote.host}:"
                              f"{remote.port} did not push the KV within {timeout:g} s of "
                              "the registration", time.monotonic() - started)
            return
        finally:
            self._push_waits.pop(seq_id, None)
        self._pull_done(seq_id, done.num_blocks, done.kv_bytes, registered - started,
                        done.xfer_s)

    def _abort_push_wait(self, seq_id: str) -> bool:
        """Drop an aborted request that waits for its write; False if it does not wait."""
        entry = self._push_waits.pop(seq_id, None)
        if entry is None:
            return False
        self._pulls.pop(seq_id).cancel()
        self._release(entry[1])
        return True

    def serve_pushed(self, done: Pushed) -> bool:
        """The prefill wrote a registered request's KV; False (ignored) for a request that
        no longer waits (its registration timed out, or it was aborted). ``KvRefused`` for
        another engine id."""
        self._check_engine(done.decode_engine_id)
        entry = self._push_waits.get(done.request_id)
        if entry is None or entry[0].done():
            log.info("KV pushed for request %s which no longer waits for it", done.request_id)
            return False
        entry[0].set_result(done)
        return True

    # ---- prefill side ------------------------------------------------------------------

    def serve_register(self, reg: Registration) -> bool:
        """A decode engine's blocks for a request: write them now if its prefill finished
        (True), else keep the registration until it does (False). ``KvRefused`` for another
        engine id or an engine in pull mode."""
        self._expire_due()
        self._check_engine(reg.remote_engine_id)
        if not self.push_mode:
            raise KvRefused(f"engine {self.engine_id!r} runs {self.cfg.kv_connector} (pull "
                            "mode) and takes no push registrations")
        if self.push_stalled:
            log.error("NIXL transfer failure: push_handshake_failed for request %s (fault "
                      "injected: push_stalled); the registration is dropped",
                      reg.request_id)
            return False
        now = time.monotonic()
        self._prune_push(now)
        key = find_handle(self.scheduler.handles, reg.request_id)
        if key is not None:
            self._start_write(key, reg)
            return True
        self._push_book.register(reg, now + self.cfg.push_timeout_s)
        return False

    def _serve_push_release(self, seq_id: str) -> bool:
        """A decode hop will not take its KV: free the prefill's blocks now, or as soon as its
        prefill finishes. False when this engine knows nothing of the request."""
        now = time.monotonic()
        self._prune_push(now)
        dropped = self._push_book.drop_registration(seq_id)
        key = find_handle(self.scheduler.handles, seq_id)
        if key is not None:
            self._free_handle(key)
            return True
        if self._live_prefill(seq_id):
            self._push_book.remember_release(seq_id, now + self.cfg.kv_lease_duration_s)
            return True
        return dropped or find_handle(self._writing, seq_id) is not None

    def _live_prefill(self, seq_id: str) -> bool:
        return find_handle(dict.fromkeys(self.scheduler.live_ids()), seq_id) is not None

    def _push_finished(self, seq_id: str) -> bool:
        """A prefill hop finished with its blocks under a handle: write them if a
        registration waits, free them if its decode hop was released. False: the handle
        stays under its lease."""
        if self._push_book.take_released(seq_id):
            self._free_handle(seq_id)
            return True
        reg = self._push_book.take_registration(seq_id)
        if reg is None:
            return False
        self._start_write(seq_id, reg)
        return True

    def _prune_push(self, now: float) -> None:
        for reg in self._push_book.prune(now):
            log.info("Dropping the push registration of request %s by engine %s: no "
                     "prefill of it finished in time", reg.request_id, reg.decode_engine_id)

    def _start_write(self, seq_id: str, reg: Registration) -> None:
        handle = self.scheduler.handles.pop(seq_id)  # out of the lease while it is written
        if not self.scheduler.handles:
            self._disarm_expiry()
        self._writing[seq_id] = handle
        self._spawn(self._write(handle, reg))

    async def _write(self, handle: Handle, reg: Registration) -> None:
        """Write the tail of the handle's blocks the decode engine registered, tell it, free
        the blocks."""
        blocks = min(reg.num_blocks, len(handle.blocks))
        kv_bytes = self.block_bytes(blocks)
        started = time.monotonic()
        try:
            await asyncio.sleep(profiles.transfer_seconds(kv_bytes, self._link)
                                * self.cfg.time_scale)
            done = Pushed(reg.request_id, reg.decode_engine_id, handle.prompt_tokens, blocks,
                          kv_bytes, time.monotonic() - started)
            try:
                await self._puller.pushed(reg, done)
            except KvPullError as exc:
                log.warning("Failed to notify engine %s that the KV of request %s was "
                            "pushed: %s", reg.decode_engine_id, reg.request_id, exc.reason)
        finally:
            self._writing.pop(handle.seq_id, None)
            self.scheduler.pool.give_back(handle.blocks)
        self._kick()
