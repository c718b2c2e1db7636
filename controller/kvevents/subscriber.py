"""One asyncio ZMQ subscriber per engine instance: SUB to the engine's KV-event endpoint,
feed the block index in sequence order, fill gaps from the engine's replay endpoint (and,
at the start, catch up from seq 0 there: an idle engine may publish nothing for long).

Nothing leaves the task as an exception: an undecodable message, a gap the replay cannot
fill, a replay endpoint that does not answer, or silence after work that should have stored
blocks (``silence_s``) marks the instance stale in the index (routing falls back to load);
an ``AllBlocksCleared`` or a publisher restart rebuilds it, and so does the subscriber itself:
while the instance is stale it asks, ``rebuild_s`` after the fault and then at doubling
intervals (up to ``REBUILD_MAX_S``), for a replay of everything from seq 0 into a fresh entry,
which rebuilds it exactly as long as the publisher's buffer still holds seq 0 (vLLM keeps
the last 10,000 batches). ``stop()`` closes the sockets.

The engines are started with ``engine_kv_events_config`` (``--kv-events-config``): vLLM's
publisher binds both endpoints, the subscriber connects to them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import zmq
import zmq.asyncio

from controller.kvevents.index import BlockIndex, NeedReplay, Outcome
from controller.kvevents.wire import (
    WireError,
    decode_message,
    decode_replay_frame,
    replay_request,
)

log = logging.getLogger(__name__)

DEFAULT_BUFFER_STEPS = 10_000  # vLLM's defaults (vllm/config/kv_events.py)
REBUILD_S = 5.0  # a stale instance's first rebuild attempt, after the fault
REBUILD_MAX_S = 120.0
DEFAULT_HWM = 100_000


def engine_kv_events_config(port: int, replay_port: int, *, topic: str = "",
                            buffer_steps: int = DEFAULT_BUFFER_STEPS, hwm: int = DEFAULT_HWM,
                            max_queue_size: int = DEFAULT_HWM) -> dict[str, Any]:
    """The ``--kv-events-config`` of one engine (JSON-encode it): publish on ``port``,
    answer replays on ``replay_port``, both bound on every interface."""
    return {"enable_kv_cache_events": True, "publisher": "zmq",
            "endpoint": f"tcp://*:{port}", "replay_endpoint": f"tcp://*:{replay_port}",
            "topic": topic, "buffer_steps": buffer_steps, "hwm": hwm,
            "max_queue_size": max_queue_size}


def connect_endpoint(bound: str, host: str) -> str:
    """Where to connect to an endpoint an engine on ``host`` bound (``tcp://*:5557``)."""
    return bound.replace("*", host, 1) if "://*:" in bound else bound


class KVEventSubscriber:
    def __init__(self, instance: str, endpoint: str, index: BlockIndex, *,
                 replay_endpoint: str | None = None, topic: str = "",
                 ctx: zmq.asyncio.Context | None = None, replay_timeout_s: float = 2.0,
                 silence_s: float | None = None, poll_s: float = 0.5,
                 clock: Callable[[], float] = time.monotonic,
                 on_outcome: Callable[[Outcome], None] | None = None,
                 rebuild_s: float = REBUILD_S) -> None:
        self.instance = instance
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.topic = topic
        self.index = index
        self.replay_timeout_s = replay_timeout_s
        self.silence_s = silence_s
        self.poll_s = poll_s
        self.clock = clock
        self.on_outcome = on_outcome
        self.garbage = 0
        self.rebuild_s = rebuild_s
        self.rebuilds = 0  # attempts made
        self._rebuild_at: float | None = None  # when to try next, while stale
        self._rebuild_wait = rebuild_s
        self._ctx = ctx or zmq.asyncio.Context.instance()
        self._sub: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is not None:
            return
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, self.topic.encode())
        sub.connect(self.endpoint)
        self._sub = sub
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"kv-events {self.instance}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._sub is not None:
            self._sub.close(linger=0)
            self._sub = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def _run(self) -> None:
        assert self._sub is not None
        sub = self._sub
        if self.replay_endpoint is not None and self.index.last_seq(self.instance) is None:
            await self._catch_up()
        while True:
            try:
                if await sub.poll(int(self.poll_s * 1000)):
                    await self._handle(await sub.recv_multipart())
                elif self.silence_s is not None:
                    for out in self.index.check_silence(self.clock(), self.silence_s,
                                                        self.instance):
                        self._report(out)
                await self._maybe_rebuild()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a bug or a socket error: never out of the task
                log.exception("kv events of %s", self.instance)
                self._report(self.index.mark_stale(self.instance, f"subscriber error: {e}"))
                await asyncio.sleep(self.poll_s)

    async def _handle(self, frames: list[bytes]) -> None:
        try:
            _, seq, batch = decode_message(frames)
        except WireError as e:
            self.garbage += 1
            self._report(self.index.mark_stale(self.instance, str(e)))
            return
        out = self.index.apply(self.instance, seq, batch, self.clock())
        self._report(out)
        if isinstance(out, NeedReplay):
            await self._replay(out.from_seq)

    async def _maybe_rebuild(self) -> None:
        """While stale: replay from seq 0 into a fresh entry when the next attempt is due."""
        if self.index.trusted(self.instance):
            self._rebuild_at, self._rebuild_wait = None, self.rebuild_s
            return
        if self.replay_endpoint is None or self.instance not in self.index.instances():
            return
        now = self.clock()
        if self._rebuild_at is None:
            self._rebuild_at = now + self._rebuild_wait
        if now < self._rebuild_at:
            return
        self.rebuilds += 1
        self._rebuild_wait = min(self._rebuild_wait * 2, REBUILD_MAX_S)
        self._rebuild_at = now + self._rebuild_wait
        self.index.reset(self.instance)
        try:
            reason, _ = await self._ask_replay(0)
        except Exception as e:  # never out of the task
            reason = f"subscriber error: {e}"
        if reason is not None:
            self._report(self.index.replay_failed(self.instance, f"rebuild: {reason}"))
        else:
            log.info("KV index of %s rebuilt from its publisher's replay", self.instance)

    async def _catch_up(self) -> None:
        """Ask for everything from seq 0 once at the start: batches sent before this SUB was
        connected would otherwise wait for the engine's next batch to be noticed, and an idle
        engine may send none for long. No answer or an empty one is no fault here (an engine
        still starting, or one that has stored nothing yet)."""
        try:
            reason, received = await self._ask_replay(0)
        except Exception as e:  # never out of the task
            reason, received = f"subscriber error: {e}", 1
        if reason is not None and received:
            self._report(self.index.replay_failed(self.instance, reason))

    async def _replay(self, from_seq: int) -> None:
        if self.replay_endpoint is None:
            self._report(self.index.replay_failed(self.instance, "no replay endpoint"))
            return
        reason, _ = await self._ask_replay(from_seq)
        last = self.index.last_seq(self.instance)
        if reason is None and (last is None or last < from_seq):
            reason = f"the publisher no longer holds seq {from_seq}"
        if reason is not None:
            self._report(self.index.replay_failed(self.instance, reason))

    async def _ask_replay(self, from_seq: int) -> tuple[str | None, int]:
        """Replay from ``from_seq`` into the index: why it failed (or None), and how many
        frames came back."""
        assert self.replay_endpoint is not None
        got = [0]
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        try:
            dealer.connect(self.replay_endpoint)
            await asyncio.wait_for(dealer.send_multipart(replay_request(from_seq)),
                                   self.replay_timeout_s)
            return await self._receive_replay(dealer, got), got[0]
        except TimeoutError:
            return (f"could not ask {self.replay_endpoint} in {self.replay_timeout_s:g} s",
                    got[0])
        finally:
            dealer.close(linger=0)

    async def _receive_replay(self, dealer: zmq.asyncio.Socket, got: list[int]) -> str | None:
        """Apply the replayed batches; the reason the replay failed, or None."""
        timeout_ms = int(self.replay_timeout_s * 1000)
        while True:
            if not await dealer.poll(timeout_ms):
                return f"no answer from {self.replay_endpoint} in {self.replay_timeout_s:g} s"
            frames = await dealer.recv_multipart()
            got[0] += 1
            try:
                item = decode_replay_frame(frames)
            except WireError as e:
                self.garbage += 1
                return str(e)
            if item is None:
                return None
            _, seq, batch = item
            out = self.index.apply(self.instance, seq, batch, self.clock())
            self._report(out)
            if isinstance(out, NeedReplay):
                return f"the publisher no longer holds seq {out.from_seq}"

    def _report(self, out: Outcome) -> None:
        if self.on_outcome is not None:
            try:
                self.on_outcome(out)
            except Exception:
                log.exception("on_outcome of %s", self.instance)
