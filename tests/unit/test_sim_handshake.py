"""The NixlConnector-shaped handshake between two in-process engines, and its failures."""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any

import httpx
import pytest

from controller.engines.sim import SimEngineConfig, create_engine_app
from controller.engines.sim.config import KvLoadFailurePolicy
from controller.engines.sim.engine import SimEngine
from controller.tokens import estimate_tokens
from pdctl_api import profiles

PREFILL = SimEngineConfig(port=8200, role="prefill", model="llama-3-8b", engine_id="P",
                          time_scale=0.01, block_size=16)
DECODE = replace(PREFILL, port=8300, role="decode", engine_id="D")
PROMPT = "disaggregated serving moves the KV cache " * 20
PROMPT_TOKENS = estimate_tokens(PROMPT)  # 205, the same count the engine makes
BLOCKS = math.ceil(PROMPT_TOKENS / 16)
BODY: dict[str, Any] = {"prompt": PROMPT, "max_tokens": 6}


@dataclass
class Pair:
    prefill: httpx.AsyncClient
    decode: httpx.AsyncClient
    prefill_engine: SimEngine
    decode_engine: SimEngine


def _fails(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("connection refused", request=request)


@asynccontextmanager
async def pair(policy: KvLoadFailurePolicy = "fail", prefill_reachable: bool = True,
               decode_kw: dict[str, Any] | None = None, **prefill_kw: Any) -> AsyncIterator[Pair]:
    p_app = create_engine_app(replace(PREFILL, **prefill_kw))
    transport = (httpx.ASGITransport(app=p_app) if prefill_reachable
                 else httpx.MockTransport(_fails))
    d_cfg = replace(DECODE, kv_load_failure_policy=policy, **(decode_kw or {}))
    d_app = create_engine_app(d_cfg, kv_transport=transport)
    async with p_app.router.lifespan_context(p_app), d_app.router.lifespan_context(d_app), \
            httpx.AsyncClient(transport=httpx.ASGITransport(app=p_app), base_url="http://p") as p, \
            httpx.AsyncClient(transport=httpx.ASGITransport(app=d_app), base_url="http://d") as d:
        yield Pair(p, d, p_app.state.sim.engine, d_app.state.sim.engine)


async def prefill_hop(c: httpx.AsyncClient, body: dict[str, Any] = BODY) -> dict[str, Any]:
    r = await c.post("/v1/completions", json={**body, "kv_transfer_params": {
        "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
        "remote_block_ids": None, "remote_host": None, "remote_port": None}})
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    assert data["usage"]["completion_tokens"] == 1  # max_tokens forced to 1
    params: dict[str, Any] = data["kv_transfer_params"]
    return params


def metric(text: str, name: str, **labels: str) -> float:
    want = {"model_name": "llama-3-8b", **labels}
    for line in text.splitlines():
        m = re.match(r"^([^{ ]+)(?:\{(.*)\})? (\S+)$", line)
        if not m or m.group(1) != name:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if got == want:
            return float(m.group(3))
    raise AssertionError(f"{name}{want} not in metrics")


async def test_prefill_hop_returns_nixl_shaped_params() -> None:
    async with pair() as pp:
        params = await prefill_hop(pp.prefill)
        assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
        assert len(params["remote_block_ids"]) == BLOCKS
        assert params["remote_engine_id"] == "P" and params["remote_host"] == "127.0.0.1"
        assert params["remote_port"] == 8200 and params["tp_size"] == 1
        assert params["remote_request_id"]
        assert pp.prefill_engine.scheduler.pool.used == BLOCKS  # held for the decode engine


async def test_decode_hop_matches_colocated_and_counts_external_tokens() -> None:
    async with pair() as pp:
        colocated = (await pp.decode.post("/v1/completions", json=BODY)).json()
        # forget the prompt's blocks the colocated request cached: the hop pulls them all
        assert (await pp.decode.post("/reset_prefix_cache")).status_code == 200
        params = await prefill_hop(pp.prefill)
        r = await pp.decode.post("/v1/completions", json={**BODY, "kv_transfer_params": params})
        assert r.status_code == 200, r.text
        hop = r.json()
        assert hop["choices"][0]["text"] == colocated["choices"][0]["text"]
        assert hop["metrics"]["kv_transfer_ms"] > 0
        assert hop["metrics"]["queue_time_ms"] >= hop["metrics"]["kv_transfer_ms"]
        assert pp.prefill_engine.scheduler.pool.used == 0  # the pull freed the handle
        text = (await pp.decode.get("/metrics")).text
        assert metric(text, "vllm:prompt_tokens_by_source_total",
                      source="external_kv_transfer") == PROMPT_TOKENS - 1
        # the colocated request, plus the last prompt token the decode hop recomputes
        assert metric(text, "vllm:prompt_tokens_by_source_total",
                      source="local_compute") == PROMPT_TOKENS + 1
        assert metric(text, "vllm:nixl_bytes_transferred_sum") == profiles.kv_bytes(
            profiles.model("llama-3-8b"), PROMPT_TOKENS, 16)
        assert metric(text, "vllm:nixl_num_descriptors_sum") == BLOCKS


async def test_decode_hop_streams_too() -> None:
    async with pair() as pp:
        params = await prefill_hop(pp.prefill)
        r = await pp.decode.post("/v1/completions", json={
            **BODY, "stream": True, "kv_transfer_params": params})
        chunks = [json.loads(x.removeprefix("data: ")) for x in r.text.split("\n\n")
                  if x and x != "data: [DONE]"]
        assert len(chunks) == 6 and chunks[-1]["metrics"]["kv_transfer_ms"] > 0


@pytest.mark.parametrize("policy", ["fail", "recompute"])
async def test_reused_handle_is_read_silently_and_only_the_prefill_notices(
        policy: KvLoadFailurePolicy) -> None:
    # vLLM 0.32: the decode engine reads raw blocks, so a second read of a handle the
    # prefill already freed "succeeds"; the prefill counts a notification after expiry.
    async with pair(policy) as pp:
        params = await prefill_hop(pp.prefill)
        body = {**BODY, "kv_transfer_params": params}
        first = await pp.decode.post("/v1/completions", json=body)
        assert first.status_code == 200
        # forget the blocks the first read cached, so that the second reads them all again
        assert (await pp.decode.post("/reset_prefix_cache")).status_code == 200
        r = await pp.decode.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == first.json()["choices"][0]["text"]
        assert r.json()["metrics"]["kv_transfer_ms"] > 0
        text = (await pp.decode.get("/metrics")).text
        assert metric(text, "vllm:nixl_num_failed_transfers_total") == 0
        assert metric(text, "vllm:prompt_tokens_by_source_total",
                      source="external_kv_transfer") == 2 * (PROMPT_TOKENS - 1)
        # the stale read moved the decode engine's own prompt worth of KV
        nbytes = profiles.kv_bytes(profiles.model("llama-3-8b"), PROMPT_TOKENS, 16)
        assert metric(text, "vllm:nixl_bytes_transferred_sum") == 2 * nbytes
        text = (await pp.prefill.get("/metrics")).text
        assert metric(text, "vllm:nixl_num_notifications_after_expiry_total") == 1
        assert metric(text, "vllm:nixl_num_kv_expired_reqs_total") == 0
        assert pp.decode_engine.scheduler.pool.used == 0


async def test_streaming_decode_hop_failure_is_a_500_before_any_chunk() -> None:
    async with pair("fail", prefill_reachable=False) as pp:
        params = await prefill_hop(pp.prefill)
        r = await pp.decode.post("/v1/completions", json={
            **BODY, "stream": True, "kv_transfer_params": params})
        assert r.status_code == 500
        assert "unreachable" in r.json()["error"]["message"]


async def test_unreachable_prefill_recomputes() -> None:
    async with pair("recompute", prefill_reachable=False) as pp:
        params = await prefill_hop(pp.prefill)
        r = await pp.decode.post("/v1/completions", json={**BODY, "kv_transfer_params": params})
        assert r.status_code == 200 and r.json()["metrics"]["kv_transfer_ms"] >= 0
        text = (await pp.decode.get("/metrics")).text
        assert metric(text, "vllm:prompt_tokens_by_source_total",
                      source="external_kv_transfer") == 0


async def test_engine_id_mismatch_fails_the_handshake() -> None:
    async with pair("fail") as pp:
        params = {**await prefill_hop(pp.prefill), "remote_engine_id": "someone-else"}
        r = await pp.decode.post("/v1/completions", json={**BODY, "kv_transfer_params": params})
        assert r.status_code == 500
        err = r.json()["error"]
        assert err["type"] == "kv_load_failure"
        assert "handshake with engine 'someone-else'" in err["message"]
        assert "this is engine 'P', not 'someone-else'" in err["message"]
        text = (await pp.decode.get("/metrics")).text
        assert metric(text, "vllm:nixl_num_failed_transfers_total") == 1
        text = (await pp.prefill.get("/metrics")).text
        assert metric(text, "vllm:nixl_num_notifications_after_expiry_total") == 0
        assert pp.prefill_engine.scheduler.pool.used == BLOCKS  # still under its lease


async def test_other_block_ids_fail_the_pull_and_keep_the_handle() -> None:
    async with pair("fail") as pp:
        params = await prefill_hop(pp.prefill)
        params = {**params, "remote_block_ids": params["remote_block_ids"][:-1]}
        r = await pp.decode.post("/v1/completions", json={**BODY, "kv_transfer_params": params})
        assert r.status_code == 500 and "holds other blocks" in r.json()["error"]["message"]
        assert pp.prefill_engine.scheduler.pool.used == BLOCKS


async def test_unpulled_handles_expire_and_a_late_read_still_succeeds() -> None:
    async with pair("fail", kv_lease_duration_s=0.05) as pp:
        params = await prefill_hop(pp.prefill)
        await asyncio.sleep(0.1)
        assert pp.prefill_engine.scheduler.pool.used == 0
        text = (await pp.prefill.get("/metrics")).text
        assert metric(text, "vllm:nixl_num_kv_expired_reqs_total") == 1
        r = await pp.decode.post("/v1/completions", json={**BODY, "kv_transfer_params": params})
        assert r.status_code == 200, r.text
        text = (await pp.prefill.get("/metrics")).text
        assert metric(text, "vllm:nixl_num_notifications_after_expiry_total") == 1


async def test_kv_transfer_time_follows_the_link() -> None:
    # 8B, 205 tokens of 128 KiB over IB NDR: ~0.5 ms wire + 10 ms latency, at time_scale 1.
    async with pair("fail", decode_kw={"time_scale": 1.0}) as pp:
        params = await prefill_hop(pp.prefill)
        decode_cfg = pp.decode_engine.cfg
        r = await pp.decode.post("/v1/completions", json={**BODY, "kv_transfer_params": params})
        nbytes = profiles.kv_bytes(profiles.model("llama-3-8b"), PROMPT_TOKENS, 16)
        modelled = profiles.transfer_seconds(nbytes, profiles.link(decode_cfg.link))
        assert decode_cfg.time_scale == 1.0
        kv_transfer_s = r.json()["metrics"]["kv_transfer_ms"] / 1e3
        assert modelled * 0.95 <= kv_transfer_s <= modelled + 0.05
