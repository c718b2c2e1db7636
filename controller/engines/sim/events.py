"""vLLM's KV-event publisher for the simulated engine (``--kv-events-config``).

Mirrors ``ZmqEventPublisher`` of vLLM 0.32 (``vllm/distributed/kv_events.py``): a PUB socket
bound on ``endpoint`` sends each batch as ``(topic, seq, payload)`` (``wire.encode_message``),
``seq`` counting 0, 1, 2, ... from the publisher's start; the last ``buffer_steps`` batches
are kept for a ROUTER bound on ``replay_endpoint``, which answers ``[b"", seq]`` with every
buffered batch from ``seq`` on and then the end marker. The engine publishes one batch per
step that produced events (and one for the events of work between steps).

Sends never block the engine's loop: the PUB socket drops past its high-water mark
(``hwm``), as vLLM's does, and the replay ROUTER is served by one asyncio task. ``close``
closes both sockets at once (linger 0): a restarted engine binds the same ports again
(binding retries for a moment while the old sockets finish closing)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from typing import Any

import zmq
import zmq.asyncio

from controller.engines.sim.config import KvEventsSettings, kv_events_settings
from controller.kvevents.wire import END_SEQ, KVEvent, KVEventBatch, encode_message

log = logging.getLogger(__name__)

BIND_RETRY_S = 2.0  # how long a bind waits for a closing engine's sockets to let go


class KvEventPublisher:
    """One engine's PUB and replay ROUTER sockets; create with ``await start(...)``."""

    def __init__(self, s: KvEventsSettings, ctx: zmq.asyncio.Context) -> None:
        self.settings = s
        self._ctx = ctx
        self._pub: zmq.asyncio.Socket | None = None
        self._replay: zmq.asyncio.Socket | None = None
        # a plain socket on the PUB's ZMQ socket: a NOBLOCK send returns or raises at once
        self._send: zmq.Socket[bytes] | None = None
        self._task: asyncio.Task[None] | None = None
        self._buffer: collections.deque[tuple[int, list[bytes]]] = collections.deque(
            maxlen=s.buffer_steps)
        self.next_seq = 0
        self.dropped = 0

    @classmethod
    async def start(cls, cfg: dict[str, Any], ctx: zmq.asyncio.Context | None = None
                    ) -> KvEventPublisher:
        pub = cls(kv_events_settings(cfg), ctx or zmq.asyncio.Context.instance())
        try:
            pub._pub = await pub._bind(zmq.PUB, pub.settings.endpoint, pub.settings.hwm)
            pub._send = zmq.Socket.shadow(pub._pub.underlying)
            if pub.settings.replay_endpoint:
                pub._replay = await pub._bind(zmq.ROUTER, pub.settings.replay_endpoint)
                pub._task = asyncio.get_running_loop().create_task(pub._serve_replays())
        except BaseException:
            await pub.close()
            raise
        return pub

    async def _bind(self, kind: int, endpoint: str, hwm: int | None = None
                    ) -> zmq.asyncio.Socket:
        sock = self._ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        if hwm is not None:  # before bind: it applies to connections made later
            sock.setsockopt(zmq.SNDHWM, hwm)
        deadline = time.monotonic() + BIND_RETRY_S
        while True:
            try:
                sock.bind(endpoint)
                return sock
            except zmq.ZMQError as exc:
                if exc.errno != zmq.EADDRINUSE or time.monotonic() > deadline:
                    sock.close(linger=0)
                    raise OSError(f"cannot bind KV events endpoint {endpoint}: {exc}") \
                        from exc
                await asyncio.sleep(0.05)

    def publish(self, events: list[KVEvent]) -> int:
        """Send one batch now (never blocks); its sequence number."""
        seq = self.next_seq
        self.next_seq += 1
        frames = encode_message(self.settings.topic, seq,
                                KVEventBatch(ts=time.time(), events=events))
        self._buffer.append((seq, frames))
        if self._send is not None:
            try:
                self._send.send_multipart(frames, zmq.NOBLOCK)
            except zmq.ZMQError:
                self.dropped += 1
        return seq

    async def _serve_replays(self) -> None:
        assert self._replay is not None
        sock = self._replay
        while True:
            try:
                frames = await sock.recv_multipart()
                if len(frames) != 3:
                    log.warning("Invalid replay request: %s", frames)
                    continue
                client, _, start = frames
                start_seq = int.from_bytes(start, "big")
                for seq, batch in list(self._buffer):
                    if seq >= start_seq:
                        await sock.send_multipart([client, b"", *batch])
                await sock.send_multipart([client, b"", b"", END_SEQ, b""])
            except asyncio.CancelledError:
                raise
            except Exception:  # a broken request must not end the replay service
                log.exception("Error in replay")

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for sock in (self._pub, self._replay):
            if sock is not None:
                sock.close(linger=0)
        self._pub = self._replay = self._send = None
