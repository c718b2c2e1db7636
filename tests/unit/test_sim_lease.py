"""vLLM 0.32's NixlConnector lease model in the simulated engine, in-process.

A prefill keeps a finished request's KV for ``kv_lease_duration_s`` wall seconds; a decode
engine renews the leases it waits on with heartbeats, reads a handle once, and releases a
handle it will not read (a rejected or aborted request). A read of a handle the prefill no
longer tracks still succeeds on the decode side; only the prefill counts and logs it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections import Counter
from collections.abc import AsyncIterator, MutableMapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from controller.engines.sim import SimEngineConfig, create_app
from controller.engines.sim.engine import SimEngine
from controller.tokens import estimate_tokens
from pdctl_api import profiles
from tests.unit.test_sim_disconnect import scope, until

PREFILL = SimEngineConfig(port=8500, role="prefill", model="llama-3-8b", engine_id="P",
                          time_scale=0.01)
DECODE = replace(PREFILL, port=8600, role="decode", engine_id="D")
PROMPT = "a lease on the prefill's KV blocks " * 20
PROMPT_TOKENS = estimate_tokens(PROMPT)
BLOCKS = math.ceil(PROMPT_TOKENS / 16)
BODY: dict[str, Any] = {"prompt": PROMPT, "max_tokens": 4}
HOP = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
       "remote_block_ids": None, "remote_host": None, "remote_port": None}
LOGGER = "controller.engines.sim.engine"
EXPIRED = "vllm:nixl_num_kv_expired_reqs_total"
AFTER_EXPIRY = "vllm:nixl_num_notifications_after_expiry_total"


def expired_line(request_id: str) -> str:
    return (f"Releasing expired KV blocks for request {request_id} which were retrieved by 0 "
            "remote worker(s) before lease expired.")


def unrecognized_line(request_id: str) -> str:
    return (f"Potentially invalid KV blocks for unrecognized request {request_id} were "
            "retrieved by a decode worker. They may have expired.")


class SideChannel(httpx.AsyncBaseTransport):
    """The decode engine's way to the prefill: records calls, can hold pulls at a gate."""

    def __init__(self, app: Starlette) -> None:
        self._inner = httpx.ASGITransport(app=app)
        self.calls: Counter[str] = Counter()
        self.heartbeats: list[dict[str, Any]] = []
        self.pull_gate: asyncio.Event | None = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        self.calls[path] += 1
        if path == "/sim/kv/heartbeat":
            self.heartbeats.append(json.loads(request.content))
        if path == "/sim/kv/pull" and self.pull_gate is not None:
            await self.pull_gate.wait()
        return await self._inner.handle_async_request(request)


@dataclass
class Pair:
    prefill: httpx.AsyncClient
    decode: httpx.AsyncClient
    decode_app: Starlette
    p: SimEngine
    d: SimEngine
    side: SideChannel


@asynccontextmanager
async def pair(prefill_kw: dict[str, Any] | None = None,
               decode_kw: dict[str, Any] | None = None) -> AsyncIterator[Pair]:
    p_app = create_app(replace(PREFILL, **(prefill_kw or {})))
    side = SideChannel(p_app)
    d_app = create_app(replace(DECODE, **(decode_kw or {})), kv_transport=side)
    async with p_app.router.lifespan_context(p_app), d_app.router.lifespan_context(d_app), \
            httpx.AsyncClient(transport=httpx.ASGITransport(app=p_app), base_url="http://p") as p, \
            httpx.AsyncClient(transport=httpx.ASGITransport(app=d_app), base_url="http://d") as d:
        yield Pair(p, d, d_app, p_app.state.sim.engine, d_app.state.sim.engine, side)


async def prefill_hop(c: httpx.AsyncClient, request_id: str = "hop-1") -> dict[str, Any]:
    r = await c.post("/v1/completions", json={**BODY, "kv_transfer_params": HOP},
                     headers={"X-Request-Id": request_id})
    assert r.status_code == 200, r.text
    params: dict[str, Any] = r.json()["kv_transfer_params"]
    assert params["remote_request_id"] == request_id
    return params


async def metric(c: httpx.AsyncClient, name: str) -> float:
    for line in (await c.get("/metrics")).text.splitlines():
        if line.startswith(f'{name}{{model_name="llama-3-8b"}} '):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in metrics")


def messages(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == level]


@pytest.fixture(autouse=True)
def _capture_engine_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)


# ---- the prefill side -------------------------------------------------------------------------

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


ANY = ["/sim/kv/pull", "/sim/kv/release", "/sim/kv/heartbeat"]
PULL_RELEASE = ["/sim/kv/pull", "/sim/kv/release"]


@pytest.mark.parametrize(("path", "content"), [
    *((path, content) for path in ANY
      for content in (b"{not json", b"[]", b"null", b'"x"', b"{}", b'{"remote_engine_id": {}}')),
    *((path, content) for path in PULL_RELEASE for content in (
        b'{"remote_request_id": 5, "remote_engine_id": "P", "remote_block_ids": [1]}',
        b'{"remote_request_id": ["a"], "remote_engine_id": "P", "remote_block_ids": [1]}',
        b'{"remote_request_id": "a", "remote_engine_id": null, "remote_block_ids": [1]}',
        b'{"remote_request_id": "a", "remote_block_ids": [1]}')),
    ("/sim/kv/pull", b'{"remote_request_id": "a", "remote_engine_id": "P"}'),
    ("/sim/kv/pull",
     b'{"remote_request_id": "a", "remote_engine_id": "P", "remote_block_ids": ["1"]}'),
    ("/sim/kv/pull",
     b'{"remote_request_id": "a", "remote_engine_id": "P", "remote_block_ids": 3}'),
    ("/sim/kv/heartbeat", b'{"remote_engine_id": "P", "request_ids": "hop-1"}'),
    ("/sim/kv/heartbeat", b'{"remote_engine_id": "P", "request_ids": [1, 2]}'),
    ("/sim/kv/heartbeat", b'{"remote_engine_id": "P"}'),
    ("/sim/kv/heartbeat", b'{"remote_engine_id": 7, "request_ids": []}'),
])
async def test_bad_side_channel_bodies_are_400(path: str, content: bytes) -> None:
    async with pair() as pp:
        r = await pp.prefill.post(path, content=content,
                                  headers={"content-type": "application/json"})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["type"] == "BadRequestError" and err["code"] == 400 and err["message"]


async def test_an_absurdly_nested_body_is_a_400_not_a_500() -> None:
    async with pair() as pp:
        r = await pp.prefill.post("/sim/kv/heartbeat", content=b"[" * 100_000,
                                  headers={"content-type": "application/json"})
        assert r.status_code == 400


# ---- the decode side ---------------------------------------------------------------------------

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
        assert pp.p.scheduler.pool.used == 2 * BLOCKS  # kept alive by the heartbeats
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

    app = create_app(replace(DECODE, **QUEUED, kv_lease_duration_s=0.6,
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

