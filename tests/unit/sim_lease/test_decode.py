"""The decode side of the lease: a rejected or aborted request releases its prefill handle,
the engine heartbeats the leases it waits on (and stops once it reads them or lets them go),
failed heartbeats are ignored, and an abort during a read lets the read finish."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, MutableMapping
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from controller.engines.sim import create_engine_app
from controller.engines.sim.engine import SimEngine
from tests.unit.sim_lease.harness import (
    AFTER_EXPIRY,
    BLOCKS,
    BODY,
    DECODE,
    EXPIRED,
    PROMPT_TOKENS,
    Pair,
    messages,
    metric,
    pair,
    prefill_hop,
)
from tests.unit.test_sim_disconnect import scope, until


@pytest.mark.parametrize(("change", "status"), [
    ({"max_tokens": -1}, 400),
    ({"max_tokens": 100_000}, 400),  # longer than the model's max_model_len
    ({"model": "gpt-9"}, 404),
])
async def test_a_rejected_decode_request_releases_the_prefill_handle(
        change: dict[str, Any], status: int) -> None:
    async with pair() as pp:
        params = await prefill_hop(pp.prefill)
        r = await pp.decode.post("/v1/completions", json={
            **BODY, **change, "kv_transfer_params": params})
        assert r.status_code == status  # the client still gets its error
        await until(lambda: pp.p.scheduler.pool.used == 0, timeout=2.0)
        assert pp.side.calls["/sim/kv/release"] == 1 and pp.side.calls["/sim/kv/pull"] == 0
        assert await metric(pp.prefill, AFTER_EXPIRY) == 0
        assert await metric(pp.prefill, EXPIRED) == 0
        await until(lambda: not pp.d._background)


async def test_a_rejected_request_without_remote_prefill_notifies_nobody() -> None:
    async with pair() as pp:
        await prefill_hop(pp.prefill)
        r = await pp.decode.post("/v1/completions", json={**BODY, "max_tokens": -1})
        assert r.status_code == 400
        incomplete = {"do_remote_prefill": True, "remote_engine_id": "P"}
        r = await pp.decode.post("/v1/completions", json={
            **BODY, "max_tokens": -1, "kv_transfer_params": incomplete})
        assert r.status_code == 400
        assert not pp.d._background and sum(pp.side.calls.values()) == 0
        assert pp.p.scheduler.pool.used == BLOCKS


class Client:
    """One decode-hop request straight into the ASGI app, able to disconnect."""

    def __init__(self, app: Starlette, body: dict[str, Any]) -> None:
        self._body = json.dumps(body).encode()
        self._gone = asyncio.Event()
        self._delivered = False
        self.sent: list[MutableMapping[str, Any]] = []
        self.call = asyncio.create_task(app(scope("/v1/completions"), self._receive, self._send))

    async def _receive(self) -> dict[str, Any]:
        if not self._delivered:
            self._delivered = True
            return {"type": "http.request", "body": self._body, "more_body": False}
        await self._gone.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message: MutableMapping[str, Any]) -> None:
        self.sent.append(message)

    async def disconnect(self) -> None:
        self._gone.set()
        await asyncio.wait_for(self.call, 5.0)


@asynccontextmanager
async def busy(pp: Pair) -> AsyncIterator[None]:
    """Fill the decode engine's one batch slot, so a decode hop waits in its queue."""
    # ~7 ms decode steps at time scale 1: 3000 tokens would take ~20 s
    long = asyncio.create_task(pp.decode.post("/v1/completions", json={
        "prompt": "hold the slot", "max_tokens": 3000}))
    await until(lambda: pp.d.scheduler.num_running == 1)
    try:
        yield
    finally:
        long.cancel()
        with pytest.raises(asyncio.CancelledError):
            await long


QUEUED: dict[str, Any] = {"time_scale": 1.0, "max_num_seqs": 1}


async def test_a_decode_request_aborted_while_queued_releases_the_handle() -> None:
    async with pair(decode_kw=QUEUED) as pp, busy(pp):
        params = await prefill_hop(pp.prefill)
        hop = Client(pp.decode_app, {**BODY, "kv_transfer_params": params})
        await until(lambda: pp.d.scheduler.num_waiting == 1)
        assert pp.p.scheduler.pool.used == BLOCKS
        await hop.disconnect()
        await until(lambda: pp.p.scheduler.pool.used == 0, timeout=2.0)
        assert pp.side.calls["/sim/kv/release"] == 1 and pp.side.calls["/sim/kv/pull"] == 0
        assert pp.d.scheduler.num_waiting == 0
        assert await metric(pp.prefill, AFTER_EXPIRY) == 0
        assert pp.d._heartbeat_task is None  # nothing left to heartbeat


async def test_the_decode_engine_heartbeats_while_it_holds_a_request() -> None:
    # Both leases 1.2 s: heartbeats every 0.2 s push the prefill's lease 0.8 s ahead.
    lease = {"kv_lease_duration_s": 1.2}
    async with pair(lease, {**QUEUED, **lease}) as pp, busy(pp):
        params = await prefill_hop(pp.prefill)
        second = await prefill_hop(pp.prefill, "hop-2")
        hops = [Client(pp.decode_app, {**BODY, "kv_transfer_params": p})
                for p in (params, second)]
        await asyncio.sleep(1.8)  # one and a half leases
        # kept alive by the heartbeats; the second hop shares the first one's cached full
        # blocks (prefix caching: all but the last prompt token may hit)
        assert pp.p.scheduler.pool.used == 2 * BLOCKS - (PROMPT_TOKENS - 1) // 16
        assert await metric(pp.prefill, EXPIRED) == 0
        assert 4 <= len(pp.side.heartbeats) <= 11  # every 0.2 s, not more
        # one heartbeat per remote engine, naming every request held there
        assert pp.side.heartbeats[-1]["remote_engine_id"] == "P"
        assert sorted(pp.side.heartbeats[-1]["request_ids"]) == ["hop-1", "hop-2"]
        for hop in hops:
            await hop.disconnect()
        assert pp.d._heartbeat_task is None
        sent = len(pp.side.heartbeats)
        await asyncio.sleep(0.5)
        assert len(pp.side.heartbeats) == sent  # no request held, no heartbeat
        await until(lambda: pp.p.scheduler.pool.used == 0)  # released on abort


async def test_heartbeats_stop_once_the_pull_is_done() -> None:
    lease = {"kv_lease_duration_s": 0.6}
    async with pair(lease, lease) as pp:
        params = await prefill_hop(pp.prefill)
        r = await pp.decode.post("/v1/completions", json={**BODY, "kv_transfer_params": params})
        assert r.status_code == 200
        assert pp.d._heartbeat_task is None and not pp.d._leases
        assert pp.p.scheduler.pool.used == 0
        assert pp.side.calls["/sim/kv/release"] == 0


async def test_failed_heartbeats_are_ignored(caplog: pytest.LogCaptureFixture) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    app = create_engine_app(replace(DECODE, **QUEUED, kv_lease_duration_s=0.6,
                             kv_load_failure_policy="recompute"),
                     kv_transport=httpx.MockTransport(refuse))
    engine: SimEngine = app.state.sim.engine
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://d") as d:
        long = asyncio.create_task(d.post("/v1/completions", json={
            "prompt": "hold the slot", "max_tokens": 3000}))
        await until(lambda: engine.scheduler.num_running == 1)
        params = {"do_remote_prefill": True, "remote_engine_id": "P",
                  "remote_request_id": "gone", "remote_host": "127.0.0.1",
                  "remote_port": 1, "remote_block_ids": [0, 1]}
        hop = asyncio.create_task(d.post("/v1/completions", json={
            **BODY, "kv_transfer_params": params}))
        await asyncio.sleep(0.35)  # heartbeats every 0.1 s, every one refused
        failed = [m for m in messages(caplog, logging.DEBUG)
                  if m.startswith("Failed to send heartbeat to engine P")]
        assert len(failed) >= 2
        assert not hop.done() and engine.scheduler.num_waiting == 1
        long.cancel()
        with pytest.raises(asyncio.CancelledError):
            await long
        r = await hop
        assert r.status_code == 200  # the pull failed and the policy recomputed
        assert engine._heartbeat_task is None and not engine._leases


async def test_abort_during_the_pull_lets_the_read_finish(
        caplog: pytest.LogCaptureFixture) -> None:
    async with pair() as pp:
        pp.side.pull_gate = gate = asyncio.Event()
        params = await prefill_hop(pp.prefill)
        hop = Client(pp.decode_app, {**BODY, "kv_transfer_params": params})
        await until(lambda: pp.side.calls["/sim/kv/pull"] == 1)
        await hop.disconnect()
        assert hop.sent[0]["status"] == 499  # the client is gone; the read goes on
        assert pp.d.scheduler.pool.used == BLOCKS  # the read still writes into these
        assert pp.d._heartbeat_task is None
        gate.set()
        await until(lambda: pp.d.scheduler.pool.used == 0 and not pp.d._pulls)
        assert pp.p.scheduler.pool.used == 0  # the read freed the prefill's handle
        assert pp.side.calls["/sim/kv/release"] == 0
        assert await metric(pp.prefill, AFTER_EXPIRY) == 0
        assert pp.d.scheduler.num_waiting == pp.d.scheduler.num_running == 0
        assert not messages(caplog, logging.ERROR)
