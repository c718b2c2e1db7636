"""The prefill side of the lease: a finished request's KV kept for the lease, renewed by
heartbeats, freed on expiry, on a read or on a release; a late or repeated read and an unknown
release counted and logged."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from pdctl_api import profiles
from tests.unit.sim_lease.harness import (
    AFTER_EXPIRY,
    BLOCKS,
    BODY,
    EXPIRED,
    PROMPT_TOKENS,
    expired_line,
    messages,
    metric,
    pair,
    prefill_hop,
    unrecognized_line,
)
from tests.unit.test_sim_disconnect import until


async def test_both_counters_are_exposed_from_the_start() -> None:
    async with pair() as pp:
        for c in (pp.prefill, pp.decode):
            assert await metric(c, EXPIRED) == 0.0
            assert await metric(c, AFTER_EXPIRY) == 0.0


async def test_expiry_frees_blocks_counts_and_logs(caplog: pytest.LogCaptureFixture) -> None:
    async with pair({"kv_lease_duration_s": 0.6}) as pp:
        await prefill_hop(pp.prefill)
        handle = pp.p.scheduler.handles["hop-1"]
        assert handle.expires_at == pytest.approx(handle.created_at + 0.6)  # wall seconds
        assert pp.p.scheduler.pool.used == BLOCKS
        await asyncio.sleep(0.2)
        if time.monotonic() < handle.expires_at - 0.05:  # unless the machine stalled
            assert pp.p.scheduler.pool.used == BLOCKS  # within the lease
            assert await metric(pp.prefill, EXPIRED) == 0
        await until(lambda: pp.p.scheduler.pool.used == 0, timeout=2.0)
        assert time.monotonic() >= handle.expires_at
        assert await metric(pp.prefill, "vllm:kv_cache_usage_perc") == 0.0
        assert await metric(pp.prefill, EXPIRED) == 1
        assert messages(caplog, logging.WARNING) == [expired_line("hop-1")]
        assert pp.p._expiry is None  # no handle, no timer: the idle engine sleeps


async def test_a_heartbeat_keeps_a_handle_alive_past_the_lease() -> None:
    # lease 1.2 s: a heartbeat pushes the lease to now + 0.8 s (two thirds of it)
    async with pair({"kv_lease_duration_s": 1.2}) as pp:
        await prefill_hop(pp.prefill)
        handle = pp.p.scheduler.handles["hop-1"]
        first_end = handle.expires_at
        for _ in range(9):  # 1.8 s, one and a half leases
            await asyncio.sleep(0.2)
            before = time.monotonic()
            r = await pp.prefill.post("/sim/kv/heartbeat", json={
                "remote_engine_id": "P", "request_ids": ["hop-1", "never-was"]})
            assert r.status_code == 200 and r.json() == {"extended": 1}  # unknown: ignored
            assert handle.expires_at >= before + 0.8
        assert handle.expires_at > first_end
        assert pp.p.scheduler.handles["hop-1"] is handle and pp.p.scheduler.pool.used == BLOCKS
        assert await metric(pp.prefill, EXPIRED) == 0
        await until(lambda: pp.p.scheduler.pool.used == 0, timeout=2.0)  # no more heartbeats
        assert await metric(pp.prefill, EXPIRED) == 1


async def test_a_heartbeat_for_another_engine_is_refused() -> None:
    async with pair() as pp:
        r = await pp.prefill.post("/sim/kv/heartbeat", json={
            "remote_engine_id": "X", "request_ids": ["hop-1"]})
        assert r.status_code == 404 and r.json()["error"]["type"] == "NotFoundError"


async def test_a_late_pull_after_expiry_succeeds_silently_on_decode(
        caplog: pytest.LogCaptureFixture) -> None:
    async with pair({"kv_lease_duration_s": 0.1}) as pp:
        colocated = (await pp.decode.post("/v1/completions", json=BODY)).json()
        # forget the prompt's blocks the colocated request cached: the read covers them all
        assert (await pp.decode.post("/reset_prefix_cache")).status_code == 200
        params = await prefill_hop(pp.prefill)
        await until(lambda: pp.p.scheduler.pool.used == 0, timeout=1.0)
        r = await pp.decode.post("/v1/completions", json={**BODY, "kv_transfer_params": params})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == colocated["choices"][0]["text"]
        assert r.json()["metrics"]["kv_transfer_ms"] > 0
        assert await metric(pp.decode, "vllm:nixl_num_failed_transfers_total") == 0
        # the decode engine sized the read from its own prompt
        assert await metric(pp.decode, "vllm:nixl_bytes_transferred_sum") == profiles.kv_bytes(
            profiles.model("llama-3-8b"), PROMPT_TOKENS, 16)
        assert await metric(pp.prefill, EXPIRED) == 1
        assert await metric(pp.prefill, AFTER_EXPIRY) == 1
        assert messages(caplog, logging.WARNING) == [expired_line("hop-1")]
        assert messages(caplog, logging.ERROR) == [unrecognized_line("hop-1")]


async def test_a_second_pull_of_the_same_handle_succeeds_and_counts(
        caplog: pytest.LogCaptureFixture) -> None:
    async with pair() as pp:
        params = await prefill_hop(pp.prefill)
        pull = {k: params[k] for k in ("remote_request_id", "remote_engine_id",
                                       "remote_block_ids")}
        first = await pp.prefill.post("/sim/kv/pull", json=pull)
        assert first.status_code == 200
        assert first.json()["prompt_tokens"] == PROMPT_TOKENS
        assert pp.p.scheduler.pool.used == 0  # one read frees the handle
        assert await metric(pp.prefill, AFTER_EXPIRY) == 0
        second = await pp.prefill.post("/sim/kv/pull", json=pull)
        assert second.status_code == 200 and second.json() == {"stale": True}
        assert await metric(pp.prefill, AFTER_EXPIRY) == 1
        assert messages(caplog, logging.ERROR) == [unrecognized_line("hop-1")]
        # and through a decode engine: the read succeeds, the prefill counts once more
        r = await pp.decode.post("/v1/completions", json={**BODY, "kv_transfer_params": params})
        assert r.status_code == 200, r.text
        assert await metric(pp.prefill, AFTER_EXPIRY) == 2


async def test_release_frees_the_handle_and_an_unknown_release_counts(
        caplog: pytest.LogCaptureFixture) -> None:
    async with pair() as pp:
        await prefill_hop(pp.prefill)
        assert await metric(pp.prefill, "vllm:kv_cache_usage_perc") > 0
        wrong = await pp.prefill.post("/sim/kv/release", json={
            "remote_request_id": "hop-1", "remote_engine_id": "X"})
        assert wrong.status_code == 404 and pp.p.scheduler.pool.used == BLOCKS
        release = {"remote_request_id": "hop-1", "remote_engine_id": "P"}
        r = await pp.prefill.post("/sim/kv/release", json=release)
        assert r.status_code == 200 and r.json() == {"released": True}
        assert await metric(pp.prefill, "vllm:kv_cache_usage_perc") == 0.0
        assert await metric(pp.prefill, AFTER_EXPIRY) == 0
        assert pp.p._expiry is None
        r = await pp.prefill.post("/sim/kv/release", json=release)
        assert r.status_code == 200 and r.json() == {"released": False}
        r = await pp.prefill.post("/sim/kv/release", json={**release,
                                                           "remote_request_id": "never-was"})
        assert r.status_code == 200 and r.json() == {"released": False}
        assert await metric(pp.prefill, AFTER_EXPIRY) == 2
        assert await metric(pp.prefill, EXPIRED) == 0
        assert messages(caplog, logging.ERROR) == [unrecognized_line("hop-1"),
                                                   unrecognized_line("never-was")]
