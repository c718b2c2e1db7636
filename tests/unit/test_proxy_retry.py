"""The router retries the only decode instance after a connect failure instead of failing
the request (nothing has reached the client yet)."""

from __future__ import annotations

from pathlib import Path

import httpx

from controller.cluster import Cluster
from controller.config import load_settings
from controller.metrics import Metrics
from controller.models import Instance, InstanceState, Role
from controller.requests_log import RequestLog
from controller.router.proxy import Proxy
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
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.host)
        if len(calls) == 1:
            raise httpx.ConnectTimeout("slow accept", request=request)
        return httpx.Response(200, json={"choices": [{"text": "ok"}]})

    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    proxy = Proxy(cluster, client, EstimatingCounter(), RequestLog(100), Metrics())
    ctx = proxy.new_ctx("/v1/completions", b'{"prompt": "hi", "max_tokens": 2}', "r1")
    resp = await proxy.open(ctx)
    assert resp.status_code == 200 and calls == ["decode-1", "decode-1"]
    await resp.aclose()
    rec = proxy.finish(ctx, "ok", None)
    assert rec.retries == 1 and cluster.instances["decode-1"].inflight == 0
    await client.aclose()
