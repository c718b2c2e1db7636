"""The simulated engine's KV events on real ZMQ sockets, read by the controller's own
subscriber and block index: what the index holds is what the engine's cache holds, replay
fills a late subscriber in, usage and metrics report the cache hits, a decode hop pulls only
the blocks it lacks, and the sockets let go of their ports when the engine stops."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import httpx
import pytest
import zmq
import zmq.asyncio

from controller.engines.sim import SimConfigError, SimEngineConfig, create_engine_app
from controller.engines.sim.config import parse_kv_events_config
from controller.engines.sim.engine import SimEngine
from controller.engines.sim.host import SimHost
from controller.kvevents.hashing import prompt_chain_hashes
from controller.kvevents.index import BlockIndex
from controller.kvevents.subscriber import (
    KVEventSubscriber,
    connect_endpoint,
    engine_kv_events_config,
)
from controller.kvevents.wire import decode_replay_frame, replay_request
from controller.launchers.process import free_ports
from pdctl_api import profiles

BS = 16
BASE = SimEngineConfig(port=8900, model="llama-3-8b", time_scale=0.01, block_size=BS,
                       enable_prompt_tokens_details=True)
PREFIX = list(range(1000, 1096))  # 96 tokens: 6 full blocks shared
PROMPT_A = PREFIX + list(range(1, 21))  # 116 tokens: 7 full blocks and a partial one
PROMPT_B = PREFIX + list(range(501, 521))
KV_PER_BLOCK = profiles.kv_bytes(profiles.model("llama-3-8b"), BS, BS)


def events_cfg() -> tuple[dict[str, Any], int, int]:
    pub, replay = free_ports("127.0.0.1", 2)
    return engine_kv_events_config(pub, replay), pub, replay


@asynccontextmanager
async def engine_app(cfg: SimEngineConfig, **kw: Any) -> AsyncIterator[
        tuple[httpx.AsyncClient, SimEngine]]:
    app = create_engine_app(cfg, **kw)
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://sim") as client:
        yield client, app.state.sim.engine


@asynccontextmanager
async def subscribed(index: BlockIndex, name: str, pub: int, replay: int
                     ) -> AsyncIterator[KVEventSubscriber]:
    sub = KVEventSubscriber(name, connect_endpoint(f"tcp://*:{pub}", "127.0.0.1"), index,
                            replay_endpoint=f"tcp://127.0.0.1:{replay}")
    sub.start()
    try:
        yield sub
    finally:
        await sub.stop()


async def until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def complete(c: httpx.AsyncClient, prompt: list[int], **kw: Any) -> dict[str, Any]:
    r = await c.post("/v1/completions", json={"prompt": prompt, "max_tokens": 2, **kw})
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def metric(text: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in {"model_name": "llama-3-8b", **labels}.items())
    for line in text.splitlines():
        if line.startswith(f"{name}{{{want}}} "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name}{{{want}}} not in metrics")


def index_view(index: BlockIndex, name: str) -> set[Any]:
    """The engine hashes the index holds for ``name``."""
    st = index._by_name.get(name)
    return set() if st is None else set(st.engine)


def held(index: BlockIndex, name: str, prompt: list[int]) -> int:
    return index.longest_prefix(name, prompt_chain_hashes(prompt, BS))


async def test_the_index_mirrors_the_engine_cache_with_replay_and_live_events() -> None:
    kv, pub, replay = events_cfg()
    index = BlockIndex(BS)
    index.add("e")
    async with engine_app(replace(BASE, kv_events_config=kv)) as (c, engine):
        first = await complete(c, PROMPT_A)
        second = await complete(c, PROMPT_B)
        assert first["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
        assert second["usage"]["prompt_tokens_details"] == {"cached_tokens": 96}
        assert engine.publisher is not None and engine.publisher.next_seq >= 2
        # subscribed late: the catch-up replays from seq 0
        async with subscribed(index, "e", pub, replay):
            pool = engine.scheduler.pool
            await until(lambda: index_view(index, "e") == pool.cached_hashes())
            assert len(pool.cached_hashes()) == 8  # 6 shared + 1 of each tail
            assert held(index, "e", PROMPT_A) == held(index, "e", PROMPT_B) == 112
            assert index.last_seq("e") == engine.publisher.next_seq - 1
            # live: a new prompt's blocks arrive on the PUB socket
            third = list(range(7000, 7040))
            await complete(c, third)
            await until(lambda: held(index, "e", third) == 32)
            assert index_view(index, "e") == pool.cached_hashes()
            assert index.health("e", time.monotonic()).replays == 0  # type: ignore[union-attr]
            # a reset clears the index too
            assert (await c.post("/reset_prefix_cache")).status_code == 200
            await until(lambda: not index_view(index, "e"))
            assert pool.cached_hashes() == set()
        text = (await c.get("/metrics")).text
    assert metric(text, "vllm:prefix_cache_queries_total") == 116 + 116 + 40
    assert metric(text, "vllm:prefix_cache_hits_total") == 96
    by_source = {s: metric(text, "vllm:prompt_tokens_by_source_total", source=s)
                 for s in ("local_compute", "local_cache_hit", "external_kv_transfer")}
    assert by_source == {"local_compute": 272 - 96, "local_cache_hit": 96,
                         "external_kv_transfer": 0}
    assert metric(text, "vllm:prompt_tokens_total") == sum(by_source.values())


async def test_replay_answers_buffered_batches_from_a_seq_then_the_end() -> None:
    kv, pub, replay = events_cfg()
    kv["buffer_steps"] = 2
    async with engine_app(replace(BASE, kv_events_config=kv)) as (c, engine):
        for i in range(4):  # four steps with events (one prefill step each)
            await complete(c, list(range(100 * i, 100 * i + 20)), max_tokens=1)
        assert engine.publisher is not None and engine.publisher.next_seq == 4
        ctx = zmq.asyncio.Context.instance()
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(f"tcp://127.0.0.1:{replay}")
        try:
            await dealer.send_multipart(replay_request(0))
            seqs = []
            while True:
                assert await dealer.poll(2000)
                item = decode_replay_frame(await dealer.recv_multipart())
                if item is None:
                    break
                seqs.append(item[1])
        finally:
            dealer.close(linger=0)
    assert seqs == [2, 3]  # only the last buffer_steps batches are kept


async def test_streaming_usage_carries_the_cached_tokens() -> None:
    async with engine_app(BASE) as (c, engine):
        await complete(c, PROMPT_A)
        r = await c.post("/v1/completions", json={
            "prompt": PROMPT_B, "max_tokens": 3, "stream": True,
            "stream_options": {"include_usage": True}})
        assert engine.publisher is None
    chunks = [json.loads(x.removeprefix("data: ")) for x in r.text.split("\n\n")
              if x and x != "data: [DONE]"]
    assert chunks[-1]["usage"]["prompt_tokens_details"] == {"cached_tokens": 96}


async def test_details_are_off_by_default() -> None:
    async with engine_app(replace(BASE, enable_prompt_tokens_details=False)) as (c, _):
        body = await complete(c, PROMPT_A)
    assert "prompt_tokens_details" not in body["usage"]


@pytest.mark.parametrize("path", ["http", "peer"])
async def test_a_decode_hop_pulls_only_the_blocks_its_cache_lacks(path: str) -> None:
    kv, pub, replay = events_cfg()
    prefill_cfg = replace(BASE, port=8901, role="prefill", engine_id="P")
    decode_cfg = replace(BASE, port=8902, role="decode", engine_id="D", kv_events_config=kv)
    index = BlockIndex(BS)
    async with engine_app(prefill_cfg) as (p, p_engine):
        kw: dict[str, Any] = (
            {"kv_transport": p._transport} if path == "http"  # the prefill's ASGI transport
            else {"kv_peers": lambda host, port: p_engine})
        async with engine_app(decode_cfg, **kw) as (d, d_engine), \
                subscribed(index, "D", pub, replay):
            await complete(d, PROMPT_A)  # the decode engine caches the shared prefix
            await complete(p, PREFIX + [7] * 20)  # and the prefill engine too
            hop = await complete(p, PROMPT_B, kv_transfer_params={"do_remote_decode": True})
            params = hop["kv_transfer_params"]
            assert params["remote_prefill_cached_tokens"] == 96
            assert len(params["remote_block_ids"]) == 8
            r = await complete(d, PROMPT_B, kv_transfer_params=params)
            # vLLM reports the prefill's hits on the decode hop
            assert r["usage"]["prompt_tokens_details"] == {"cached_tokens": 96}
            assert p_engine.scheduler.pool.used == 0  # the read freed the handle
            await until(lambda: held(index, "D", PROMPT_B) == 112)
            assert index_view(index, "D") == d_engine.scheduler.pool.cached_hashes()
            text = (await d.get("/metrics")).text
    # 8 blocks, 6 of them in the decode engine's cache: 2 read
    assert metric(text, "vllm:nixl_bytes_transferred_sum") == 2 * KV_PER_BLOCK
    assert metric(text, "vllm:nixl_num_descriptors_sum") == 2
    assert metric(text, "vllm:prompt_tokens_by_source_total",
                  source="external_kv_transfer") == 115 - 96
    assert metric(text, "vllm:prompt_tokens_by_source_total", source="local_cache_hit") == 96


async def test_a_restarted_engine_binds_the_same_ports() -> None:
    kv, pub, replay = events_cfg()
    index = BlockIndex(BS)
    cfg = replace(BASE, kv_events_config=kv)
    async with engine_app(cfg) as (c, _):
        await complete(c, PROMPT_A)
    async with engine_app(cfg) as (c, engine), subscribed(index, "e", pub, replay):
        await complete(c, PROMPT_B)
        await until(lambda: held(index, "e", PROMPT_B) == 112)
        assert index.last_seq("e") == 0  # a fresh publisher counts from 0
        assert index_view(index, "e") == engine.scheduler.pool.cached_hashes()


async def test_each_hosted_engine_has_its_own_publisher() -> None:
    host = SimHost()
    cfgs = [events_cfg() for _ in range(2)]
    try:
        engines = []
        for i, (kv, _, _) in enumerate(cfgs):
            hosted = await host.start(
                ["--port", str(free_ports("127.0.0.1", 1)[0]), "--engine-id", f"e{i}",
                 "--model", "llama-3-8b", "--time-scale", "0.01",
                 "--kv-events-config", json.dumps(kv)], None)
            engines.append(hosted.app.state.sim.engine)
        pubs = [e.publisher for e in engines]
        assert all(p is not None for p in pubs) and pubs[0] is not pubs[1]
        assert [p.settings.endpoint for p in pubs] == [kv["endpoint"] for kv, _, _ in cfgs]
    finally:
        await host.close()
    assert all(e.publisher is None for e in engines)  # closed with the engine


@pytest.mark.parametrize(("text", "field"), [
    ("{not json", "not valid JSON"),
    ('["zmq"]', "a JSON object"),
    ('{"enable_kv_cache_events": true, "publisher": "null", "endpoint": "tcp://*:1"}',
     "kv_events_config.publisher"),
    ('{"enable_kv_cache_events": true, "publisher": "zmq"}', "kv_events_config.endpoint"),
    ('{"enable_kv_cache_events": true, "endpoint": "tcp://*:1", "hwm": 0}',
     "kv_events_config.hwm"),
    ('{"enable_kv_cache_events": "yes", "endpoint": "tcp://*:1"}',
     "kv_events_config.enable_kv_cache_events"),
])
def test_bad_kv_events_configs_name_the_field(text: str, field: str) -> None:
    with pytest.raises(SimConfigError, match=field):
        parse_kv_events_config(text)


def test_the_flags_reach_the_config() -> None:
    import argparse

    from controller.engines.sim import add_arguments, config_from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    kv = engine_kv_events_config(5557, 5558)
    cfg = config_from_args(parser.parse_args([
        "--port", "1", "--model", "llama-3-8b", "--kv-events-config", json.dumps(kv),
        "--enable-prompt-tokens-details"]))
    assert cfg.kv_events_config == kv and cfg.kv_events_enabled
    assert cfg.enable_prompt_tokens_details
    plain = config_from_args(parser.parse_args(["--port", "1", "--model", "llama-3-8b"]))
    assert plain.kv_events_config is None and not plain.enable_prompt_tokens_details
