"""Push mode (``--kv-connector NixlPushConnector``) of ``python -m controller.engines.sim`` as
real processes on real sockets: both hops at once, a registration before and after the
prefill finished, registrations never fulfilled (fail and recompute), the prefill's blocks
freed after the write, and the fault knob's silent fallback.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.test_engine_sim import BODY, Engine, engines, metric

PUSH = ["--kv-connector", "NixlPushConnector"]
P_HOP = {"do_remote_decode": True, "do_remote_prefill": False}
BY_SOURCE = "vllm:prompt_tokens_by_source_total"
FAILED = "vllm:nixl_num_failed_transfers_total"


@dataclass
class PushFleet:
    prefill: Engine
    decode: Engine  # kv_load_failure_policy fail
    decode_recompute: Engine


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PushFleet]:
    tmp = tmp_path_factory.mktemp("engine-sim-push")
    short = ["--push-registration-timeout", "1.0"]
    with engines(tmp, ("P", "prefill", PUSH), ("D", "decode", PUSH + short),
                 ("DR", "decode", PUSH + short + ["--kv-load-failure-policy", "recompute"])
                 ) as (p, d, dr):
        yield PushFleet(p, d, dr)


def d_hop(prefill: Engine, **extra: Any) -> dict[str, Any]:
    """What the router sends a push-mode decode engine: the prefill's engine id and side
    channel, no handle."""
    port = int(prefill.url.rsplit(":", 1)[1])
    return {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": "P",
            "remote_host": "127.0.0.1", "remote_port": port, "tp_size": 1, **extra}


def post(url: str, params: dict[str, Any], rid: str, prompt: str | None = None
         ) -> httpx.Response:
    body = {**BODY, "kv_transfer_params": params}
    if prompt is not None:  # a prompt no engine has cached
        body["prompt"] = prompt
    return httpx.post(f"{url}/v1/completions", json=body, headers={"X-Request-Id": rid},
                      timeout=30.0)


def info(e: Engine) -> dict[str, Any]:
    body: dict[str, Any] = httpx.get(f"{e.url}/sim/info").json()
    return body


def wait_for(cond: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def colocated_text(url: str) -> str:
    text: str = httpx.post(f"{url}/v1/completions", json=BODY).json()["choices"][0]["text"]
    return text


def test_both_hops_at_once_answer_with_the_decode_text_and_free_the_prefill(
        fleet: PushFleet) -> None:
    p, d = fleet.prefill, fleet.decode
    external = metric(d.url, BY_SOURCE, source="external_kv_transfer")
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        pf = pool.submit(post, p.url, P_HOP, "both-1")
        df = pool.submit(post, d.url, d_hop(p), "both-1")
        p_resp, d_resp = pf.result(), df.result()
    assert p_resp.status_code == 200 and d_resp.status_code == 200, d_resp.text
    assert p_resp.json()["kv_transfer_params"]["transfer_mode"] == "push"
    assert d_resp.json()["choices"][0]["text"] == colocated_text(d.url)
    assert d_resp.json()["usage"]["completion_tokens"] == BODY["max_tokens"]
    assert metric(d.url, BY_SOURCE, source="external_kv_transfer") > external
    wait_for(lambda: info(p)["kv_handles"] == 0)
    assert info(p)["kv_push_registrations"] == 0 and info(d)["kv_push_waiting"] == 0


def test_a_registration_after_the_prefill_finished(fleet: PushFleet) -> None:
    p, d = fleet.prefill, fleet.decode
    assert post(p.url, P_HOP, "after-1").status_code == 200
    assert info(p)["kv_handles"] == 1  # held under the lease until the decode registers
    resp = post(d.url, d_hop(p), "after-1")
    assert resp.status_code == 200, resp.text
    wait_for(lambda: info(p)["kv_handles"] == 0)


def test_a_registration_before_the_prefill_started(fleet: PushFleet) -> None:
    p, d = fleet.prefill, fleet.decode
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        df = pool.submit(post, d.url, d_hop(p), "before-1")
        wait_for(lambda: info(p)["kv_push_registrations"] == 1)
        assert info(d)["kv_push_waiting"] == 1
        assert post(p.url, P_HOP, "before-1").status_code == 200
        resp = df.result()
    assert resp.status_code == 200, resp.text
    wait_for(lambda: info(p)["kv_handles"] == 0)
    assert info(p)["kv_push_registrations"] == 0


def test_a_registration_never_fulfilled_fails_or_recomputes_by_the_policy(
        fleet: PushFleet) -> None:
    p, d, dr = fleet.prefill, fleet.decode, fleet.decode_recompute
    failed = metric(d.url, FAILED)
    resp = post(d.url, d_hop(p), "orphan-1")  # no prefill hop: P never writes
    assert resp.status_code == 500
    assert "did not push the KV" in resp.json()["error"]["message"]
    assert metric(d.url, FAILED) == failed + 1
    failed, local = metric(dr.url, FAILED), metric(dr.url, BY_SOURCE, source="local_compute")
    resp = post(dr.url, d_hop(p), "orphan-2")
    assert resp.status_code == 200, resp.text
    assert metric(dr.url, FAILED) == failed + 1
    assert metric(dr.url, BY_SOURCE, source="local_compute") - local \
        == resp.json()["usage"]["prompt_tokens"]
    wait_for(lambda: info(p)["kv_push_registrations"] == 0)  # released by the decode engines


def test_a_wrong_engine_id_fails_at_once(fleet: PushFleet) -> None:
    started = time.monotonic()
    resp = post(fleet.decode.url, d_hop(fleet.prefill, remote_engine_id="nobody"), "wrong-1")
    assert resp.status_code == 500 and "handshake" in resp.json()["error"]["message"]
    assert time.monotonic() - started < 1.0  # not the registration timeout


def test_the_fault_knob_recomputes_silently_and_counts_local_compute(
        fleet: PushFleet) -> None:
    p, dr = fleet.prefill, fleet.decode_recompute
    assert httpx.post(f"{dr.url}/sim/fault", json={"kv_unreachable": True}).json() == {
        "kv_unreachable": True, "push_stalled": False}
    try:
        failed = metric(dr.url, FAILED)
        local = metric(dr.url, BY_SOURCE, source="local_compute")
        external = metric(dr.url, BY_SOURCE, source="external_kv_transfer")
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            prompt = "a silent fallback to local compute " * 40
            pf = pool.submit(post, p.url, P_HOP, "fault-1", prompt)
            df = pool.submit(post, dr.url, d_hop(p), "fault-1", prompt)
            assert pf.result().status_code == 200
            resp = df.result()
        assert resp.status_code == 200, resp.text
        assert metric(dr.url, FAILED) == failed + 1
        assert metric(dr.url, BY_SOURCE, source="local_compute") - local \
            == resp.json()["usage"]["prompt_tokens"]
        assert metric(dr.url, BY_SOURCE, source="external_kv_transfer") == external
    finally:
        httpx.post(f"{dr.url}/sim/fault", json={"kv_unreachable": False})
    assert httpx.get(f"{dr.url}/sim/fault").json() == {"kv_unreachable": False,
                                                       "push_stalled": False}


def test_a_pull_fleet_with_the_fault_flag_recomputes_too(tmp_path: Path) -> None:
    with engines(tmp_path, ("PP", "prefill", []),
                 ("PD", "decode", ["--kv-load-failure-policy", "recompute",
                                   "--fault-kv-unreachable"])) as (p, d):
        params = post(p.url, P_HOP, "pull-1").json()["kv_transfer_params"]
        assert "transfer_mode" not in params
        resp = post(d.url, params, "pull-1")
        assert resp.status_code == 200, resp.text
        assert metric(d.url, FAILED) == 1
        assert metric(d.url, BY_SOURCE, source="local_compute") \
            == resp.json()["usage"]["prompt_tokens"]
