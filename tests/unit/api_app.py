"""An in-process controller for API tests: the real app and routes, a launcher that starts
nothing, two ready instances (prefill-1 TP4, decode-2 TP2) and five request records put in
directly, no background loops (no lifespan); and an httpx transport into it, so that
``pdctl_api``'s client (and the CLI) talk to the real routes."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.testclient import TestClient

from controller.api import create_app
from controller.api.state import AppState
from controller.config import load_settings
from controller.launchers.base import Launched, Launcher, LaunchSpec
from controller.models import Instance, RequestPath, RequestRecord, Role
from pdctl_api.client import PdctlClient


class NoLauncher(Launcher):
    """Starts nothing: the instances are put in the registry by the test."""

    name = "none"

    async def start(self, spec: LaunchSpec) -> Launched:
        raise AssertionError("the reconcile loop is not running in these tests")

    async def stop(self, launched: Launched, grace_s: float = 5.0) -> None:
        return None


def record(k: int, path: RequestPath = RequestPath.DISAGGREGATED) -> RequestRecord:
    return RequestRecord(
        id=f"req-{k}", started_at=time.time() - 1, endpoint="/v1/completions", path=path,
        status="ok", stream=False, prompt_tokens=700, output_tokens=8,
        prefill_instance="prefill-1", decode_instance="decode-2", queue_ms=1.0,
        prefill_ms=10.0, transfer_ms=5.0, decode_sched_ms=4.0, overhead_ms=2.0, ttft_ms=22.0,
        itl_ms=3.0, e2e_ms=50.0, kv_bytes=1 << 20, kv_handle=f"cmpl-{k}")


@pytest.fixture
def app_state(tmp_path: Path) -> Iterator[tuple[TestClient, AppState]]:
    settings = load_settings(None, controller={"state_dir": tmp_path})  # 1 x TP4, 1 x TP2
    app = create_app(settings, NoLauncher())
    st: AppState = app.state.pdctl
    for n, (role, tp) in enumerate(((Role.PREFILL, 4), (Role.DECODE, 2)), start=1):
        inst = Instance(id=f"{role.value}-{n}", role=role, tp=tp, url=f"http://e{n}",
                        created_at=st.fleet.clock(), running=2.0, kv_usage=0.25,
                        accelerators=tuple(range(tp)))
        st.fleet.registry.add(inst, "test")
        st.fleet.registry.mark_ready(inst)
    for k in range(5):
        st.requests.add(record(k, RequestPath.COLOCATED if k == 4 else
                               RequestPath.DISAGGREGATED))
    client = TestClient(app, headers={"Authorization": f"Bearer {st.token}"})  # no lifespan
    try:
        yield client, st
    finally:
        client.close()
        st.store.close()


def through(tc: TestClient) -> httpx.MockTransport:
    """An httpx transport that hands each request to the in-process app."""
    def handler(request: httpx.Request) -> httpx.Response:
        r = tc.request(request.method, request.url.raw_path.decode(), content=request.content,
                       headers=dict(request.headers))
        return httpx.Response(r.status_code, content=r.content,
                              headers={"content-type": r.headers.get("content-type", "")})
    return httpx.MockTransport(handler)


def client_of(tc: TestClient, st: AppState) -> PdctlClient:
    return PdctlClient("http://controller", st.token, actor="test", transport=through(tc))


