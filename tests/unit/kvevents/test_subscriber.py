"""The subscriber against vLLM 0.32's own ZmqEventPublisher on loopback ports (real sockets,
vLLM's publisher thread and replay code, no engine), and against a raw socket sending
garbage."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import zmq
import zmq.asyncio

from controller.kvevents.hashing import prompt_chain_hashes
from controller.kvevents.index import BlockIndex
from controller.kvevents.subscriber import (
    KVEventSubscriber,
    connect_endpoint,
    engine_kv_events_config,
)
from controller.kvevents.wire import AllBlocksCleared, KVEventBatch, decode_message, encode_message
from tests.unit.kvevents import vllm_src
from tests.unit.kvevents.events import OTHER, PROMPT, B, stored

pytestmark = pytest.mark.timeout(30)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def vllm_events(*events: Any) -> Any:
    """A batch of vLLM's own classes, from ours (same fields)."""
    mod = vllm_src.kv_events()
    out = []
    for e in events:
        fields = {f: getattr(e, f) for f in e.__struct_fields__}
        out.append(getattr(mod, type(e).__name__)(**fields))
    return mod.KVEventBatch(ts=0.0, events=out)


@pytest.fixture
def actx() -> Iterator[zmq.asyncio.Context]:
    ctx = zmq.asyncio.Context()
    yield ctx
    ctx.term()


class Lab:
    def __init__(self, buffer_steps: int) -> None:
        self.port, self.replay_port = free_port(), free_port()
        cfg = engine_kv_events_config(self.port, self.replay_port, topic="kv",
                                      buffer_steps=buffer_steps)
        cfg.pop("enable_kv_cache_events"), cfg.pop("publisher")
        cfg["replay_endpoint"] = connect_endpoint(cfg["replay_endpoint"], "127.0.0.1")
        self.pub = vllm_src.kv_events().ZmqEventPublisher(data_parallel_rank=0, **cfg)
        self.index = BlockIndex(B)
        self.outcomes: list[Any] = []
        self.sent = 0  # the publisher numbers batches 0, 1, ...

    def subscriber(self, ctx: zmq.asyncio.Context, cls: type = KVEventSubscriber,
                   **kw: Any) -> KVEventSubscriber:
        sub: KVEventSubscriber = cls(
            "p0", connect_endpoint(f"tcp://*:{self.port}", "127.0.0.1"), self.index,
            replay_endpoint=f"tcp://127.0.0.1:{self.replay_port}", topic="kv", ctx=ctx,
            replay_timeout_s=1.0, poll_s=0.05, on_outcome=self.outcomes.append, **kw)
        return sub

    def publish(self, *events: Any) -> None:
        self.pub.publish(vllm_events(*events))
        self.sent += 1

    async def published(self, n: int) -> None:
        while not self.pub._buffer or self.pub._buffer[-1][0] != n - 1:
            await asyncio.sleep(0.01)

    async def until(self, cond: Callable[[], bool], probe: bool = True) -> None:
        """Wait for ``cond``, publishing empty batches meanwhile (a SUB misses what is sent
        before it is connected)."""
        for _ in range(200):
            if cond():
                return
            if probe:
                self.publish()
            await asyncio.sleep(0.05)
        raise AssertionError(f"timed out; outcomes: {self.outcomes[-5:]}")

    def held(self, tokens: list[int] = PROMPT) -> int:
        return self.index.longest_prefix("p0", prompt_chain_hashes(tokens, B)) // B


@pytest.fixture
async def lab() -> AsyncIterator[Any]:
    labs: list[Lab] = []

    def make(buffer_steps: int = 100) -> Lab:
        labs.append(Lab(buffer_steps))
        return labs[-1]

    yield make
    for one in labs:
        one.pub.shutdown()


async def test_an_idle_engines_earlier_batches_are_caught_up_at_start(
        lab: Any, actx: zmq.asyncio.Context) -> None:
    lab = lab(buffer_steps=100)
    for i in range(3):
        lab.publish(stored(PROMPT, i, 1))
    await lab.published(3)  # sent before anyone listened; nothing is sent after
    sub = lab.subscriber(actx)
    sub.start()
    try:
        await lab.until(lambda: lab.held() == 3, probe=False)
        health = lab.index.health("p0", 0.0)
        assert health is not None and health.last_seq == 2 and not health.stale
        lab.publish(stored(PROMPT, 3, 2))
        await lab.until(lambda: lab.held() == 5, probe=False)
        assert sub.running and sub.garbage == 0
    finally:
        await sub.stop()
    assert not sub.running and sub._sub is None
    await sub.stop()  # twice is fine


class Lossy(KVEventSubscriber):
    """Loses one sequence number on the way, once, as a network would."""

    lose: int | None = None

    async def _handle(self, frames: list[bytes]) -> None:
        if decode_message(frames)[1] == self.lose:
            self.lose = None
            return
        await super()._handle(frames)


async def test_a_gap_mid_stream_is_replayed(lab: Any, actx: zmq.asyncio.Context) -> None:
    lab = lab(buffer_steps=100)
    sub = lab.subscriber(actx, cls=Lossy)
    sub.start()
    try:
        await lab.until(lambda: lab.index.last_seq("p0") is not None)
        replays = lab.index.health("p0", 0.0).replays
        assert isinstance(sub, Lossy)
        sub.lose = lab.sent + 1  # the second of the four below
        for i in range(4):
            lab.publish(stored(PROMPT, i, 1))
        await lab.until(lambda: lab.held() == 4, probe=False)
        assert sub.lose is None and lab.index.trusted("p0")
        assert lab.index.health("p0", 0.0).replays == replays + 1
    finally:
        await sub.stop()


async def test_a_gap_past_the_publishers_buffer_marks_stale_until_cleared(
        lab: Any, actx: zmq.asyncio.Context) -> None:
    lab = lab(buffer_steps=2)
    for i in range(4):
        lab.publish(stored(PROMPT, i, 1))
    await lab.published(4)  # seq 0 and 1 have left the buffer
    sub = lab.subscriber(actx)
    sub.start()
    try:
        await lab.until(lambda: not lab.index.trusted("p0") and lab.index.last_seq("p0")
                        is not None)
        health = lab.index.health("p0", 0.0)
        assert health is not None and "no longer holds seq 0" in (health.stale_reason or "")
        assert lab.held() == 0
        lab.publish(AllBlocksCleared(), stored(OTHER, 0, 2))  # e.g. /reset_prefix_cache
        await lab.until(lambda: lab.index.trusted("p0"), probe=False)
        await lab.until(lambda: lab.held(OTHER) == 2, probe=False)
        assert sub.running
    finally:
        await sub.stop()


async def test_a_stale_instance_is_rebuilt_from_the_publishers_replay(
        lab: Any, actx: zmq.asyncio.Context) -> None:
    """Stale for any reason (garbage, a lost gap): while the publisher still buffers seq 0
    the subscriber rebuilds the entry by itself, exactly; past the buffer it stays stale."""
    lab = lab(buffer_steps=100)
    for i in range(3):
        lab.publish(stored(PROMPT, i, 1))
    await lab.published(3)
    sub = lab.subscriber(actx, rebuild_s=0.2)
    sub.start()
    try:
        await lab.until(lambda: lab.held() == 3, probe=False)
        lab.index.mark_stale("p0", "garbage on the wire")
        assert lab.held() == 0
        await lab.until(lambda: lab.index.trusted("p0") and lab.held() == 3, probe=False)
        assert sub.rebuilds == 1 and lab.index.health("p0", 0.0).last_seq == 2
    finally:
        await sub.stop()


async def raw_pub(ctx: zmq.asyncio.Context) -> tuple[zmq.asyncio.Socket, int]:
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    return pub, port


async def until(cond: Callable[[], bool], send: Callable[[], Any]) -> None:
    for _ in range(100):
        if cond():
            return
        await send()
        await asyncio.sleep(0.05)
    raise AssertionError("timed out")


async def test_garbage_marks_stale_and_the_task_lives_on(actx: zmq.asyncio.Context) -> None:
    pub, port = await raw_pub(actx)
    index = BlockIndex(B)
    sub = KVEventSubscriber("p0", f"tcp://127.0.0.1:{port}", index, ctx=actx, poll_s=0.05)
    sub.start()
    try:
        good = KVEventBatch(ts=0.0, events=[AllBlocksCleared(), stored(PROMPT, 0, 2)])
        seq = iter(range(10**6))
        await until(lambda: index.trusted("p0"),
                    lambda: pub.send_multipart(encode_message("", next(seq), good)))
        for frames in ([b"only one"], [b"", b"\x00" * 8, b"\xc1garbage"],
                       [b"", b"short", b""]):
            await pub.send_multipart(frames)
        await until(lambda: sub.garbage == 3, lambda: asyncio.sleep(0))
        assert not index.trusted("p0") and sub.running
        await until(lambda: index.trusted("p0"),
                    lambda: pub.send_multipart(encode_message("", next(seq), good)))
        assert index.longest_prefix("p0", prompt_chain_hashes(PROMPT, B)) == 2 * B
    finally:
        await sub.stop()
        pub.close()


@pytest.mark.parametrize("replay", ["none", "silent"])
async def test_a_gap_without_a_working_replay_marks_stale(actx: zmq.asyncio.Context,
                                                          replay: str) -> None:
    pub, port = await raw_pub(actx)
    router = actx.socket(zmq.ROUTER)  # takes requests, never answers
    router.setsockopt(zmq.LINGER, 0)
    rport = router.bind_to_random_port("tcp://127.0.0.1")
    index = BlockIndex(B)
    index.add("p0")
    sub = KVEventSubscriber(
        "p0", f"tcp://127.0.0.1:{port}", index, ctx=actx, poll_s=0.05, replay_timeout_s=0.2,
        replay_endpoint=None if replay == "none" else f"tcp://127.0.0.1:{rport}")
    sub.start()
    try:
        batch = KVEventBatch(ts=0.0, events=[stored(PROMPT, 0, 1)])
        await until(lambda: index.last_seq("p0") is not None or not index.trusted("p0"),
                    lambda: pub.send_multipart(encode_message("", 7, batch)))
        await until(lambda: not index.trusted("p0"), lambda: asyncio.sleep(0))
        health = index.health("p0", 0.0)
        assert health is not None
        assert ("no replay endpoint" if replay == "none" else "no answer") in (
            health.stale_reason or "")
        assert sub.running
    finally:
        await sub.stop()
        pub.close()
        router.close()


async def test_an_engine_not_up_yet_is_no_fault(actx: zmq.asyncio.Context) -> None:
    index = BlockIndex(B)
    index.add("p0")
    sub = KVEventSubscriber("p0", f"tcp://127.0.0.1:{free_port()}", index, ctx=actx,
                            replay_endpoint=f"tcp://127.0.0.1:{free_port()}",
                            replay_timeout_s=0.1, poll_s=0.05)
    sub.start()
    await asyncio.sleep(0.3)
    assert index.trusted("p0") and sub.running
    await sub.stop()


def test_engine_config_and_endpoints() -> None:
    cfg = engine_kv_events_config(5557, 5558, topic="kv")
    assert cfg["endpoint"] == "tcp://*:5557" and cfg["replay_endpoint"] == "tcp://*:5558"
    assert set(cfg) <= set(vllm_src.kv_events().KVEventsConfig.__dataclass_fields__)
    assert connect_endpoint("tcp://*:5557", "10.0.0.2") == "tcp://10.0.0.2:5557"
    assert connect_endpoint("ipc:///tmp/kv", "x") == "ipc:///tmp/kv"
