"""The router retries the only decode instance after a connect failure instead of failing
the request (nothing has reached the client yet)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import httpx
import pytest

from controller.cluster import Cluster
from controller.config import load_settings
from controller.metrics import Metrics
from controller.models import Instance, InstanceState, Role
from controller.requests_log import RequestLog
from controller.router.proxy import Proxy
from controller.router.upstream import Reply, UpstreamError
from controller.store import Store
from controller.tokens import EstimatingCounter
from tests.unit.test_cluster import FakeLauncher


async def test_single_decode_instance_is_retried_after_a_connect_timeout(tmp_path: Path
                                                                        ) -> None:
    settings = load_settings(None, controller={"state_dir": tmp_path},
                             pools={"prefill": {"size": 0}})
    cluster = Cluster(settings, Store(tmp_path / "s.db"), FakeLauncher(), httpx.AsyncClient())
    cluster.instances["decode-1"] = Instance("decode-1", Role.DECODE, 2, "http://decode-1",
                                             state=InstanceState.READY)
    cluster._refresh_membership()
    upstream = FlakyEngine()
    proxy = Proxy(cluster, upstream, EstimatingCounter(), RequestLog(100), Metrics())
    ctx = proxy.new_ctx("/v1/completions", b'{"prompt": "hi", "max_tokens": 2}', "r1")
    resp = await proxy.open(ctx)
    assert resp.status == 200 and upstream.calls == ["http://decode-1/v1/completions"] * 2
    assert await resp.read() == b'{"choices": [{"text": "ok"}]}'
    resp.close()
    rec = proxy.finish(ctx, "ok", None)
    assert rec.retries == 1 and cluster.instances["decode-1"].inflight == 0


class Answer:
    status = 200
    content_type = "application/json"

    async def chunks(self) -> AsyncIterator[bytes]:
        yield await self.read()

    async def read(self) -> bytes:
        return b'{"choices": [{"text": "ok"}]}'

    def close(self) -> None:
        pass


class FlakyEngine:
    """An upstream whose first connection attempt times out."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def post(self, url: str, payload: bytes, headers: Mapping[str, str],
                   resend: bool = True) -> Reply:
        raise AssertionError("no prefill hop expected")

    async def open(self, url: str, payload: bytes, headers: Mapping[str, str],
                   resend: bool = True) -> Answer:
        self.calls.append(url)
        if len(self.calls) == 1:
            raise UpstreamError("ConnectionTimeoutError: slow accept", sent=False)
        return Answer()

    async def close(self) -> None:
        pass


async def test_a_request_cancelled_during_its_prefill_hop_is_recorded_disaggregated(
        tmp_path: Path) -> None:
    settings = load_settings(None, controller={"state_dir": tmp_path},
                             routing={"disagg_min_prompt_tokens": 1})
    cluster = Cluster(settings, Store(tmp_path / "s.db"), FakeLauncher(), httpx.AsyncClient())
    for iid, role in (("prefill-1", Role.PREFILL), ("decode-1", Role.DECODE)):
        cluster.instances[iid] = Instance(iid, role, 2, f"http://{iid}",
                                          state=InstanceState.READY)
    cluster._refresh_membership()

    gate = asyncio.Event()

    class SlowPrefill(FlakyEngine):
        async def post(self, url: str, payload: bytes, headers: Mapping[str, str],
                       resend: bool = True) -> Reply:
            await gate.wait()
            raise UpstreamError("the engine aborted the request")

    proxy = Proxy(cluster, SlowPrefill(), EstimatingCounter(), RequestLog(100), Metrics())
    ctx = proxy.new_ctx("/v1/completions", b'{"prompt": "a long prompt", "max_tokens": 2}',
                        None)
    task = asyncio.create_task(proxy.open(ctx))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    rec = proxy.finish(ctx, "cancelled", None, "client disconnected")
    assert rec.path.value == "disaggregated" and rec.status == "cancelled"
    assert rec.kv_bytes == 0  # no KV was produced, so none is counted as moved
    # The hop is left to end (so that KV it may hold is released), then stops counting.
    assert cluster.instances["prefill-1"].inflight == 1
    gate.set()
    await asyncio.sleep(0.05)
    assert cluster.instances["prefill-1"].inflight == 0
    assert cluster.instances["decode-1"].inflight == 0
