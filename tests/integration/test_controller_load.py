"""Changes under load, with real controller and engine processes: scaling, a rolling TP
change and a killed prefill engine all leave 0 failed client requests."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.integration.harness import LONG_PROMPT, ControllerProc, Load, start_controller

pytestmark = pytest.mark.slow


@pytest.fixture
def ctl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControllerProc]:
    c = start_controller(tmp_path_factory.mktemp("load"))
    yield c
    c.stop()


def decode_instances(ctl: ControllerProc, state: str = "ready") -> list[dict[str, object]]:
    return [i for i in ctl.get("/instances?role=decode") if i["state"] == state]


def assert_no_failures(load: Load, minimum: int) -> None:
    res = load.stop()
    assert res.failures == [], res.failures[:5]
    assert res.ok >= minimum, f"only {res.ok} requests completed"


def test_scale_decode_1_3_1_under_load(ctl: ControllerProc) -> None:
    with Load(ctl.url) as load:
        time.sleep(1.0)
        ctl.api("PATCH", "/pools/decode", {"size": 3}).raise_for_status()
        ctl.wait_converged()
        assert len(decode_instances(ctl)) == 3
        time.sleep(1.5)  # let the new instances take traffic
        used = {r["decode_instance"] for r in ctl.get("/requests?limit=200")}
        assert len(used) == 3, used
        ctl.api("PATCH", "/pools/decode", {"size": 1}).raise_for_status()
        ctl.wait_converged()
        time.sleep(1.0)
        assert_no_failures(load, 20)
    assert len(decode_instances(ctl)) == 1
    kinds = [e["kind"] for e in ctl.get("/events?limit=200")]
    assert kinds.count("instance.draining") >= 2 and kinds.count("pool.update") == 2


def test_rolling_decode_tp_change_under_load(ctl: ControllerProc) -> None:
    ctl.api("PATCH", "/pools/decode", {"size": 2}).raise_for_status()
    ctl.wait_converged()
    old = {i["id"] for i in decode_instances(ctl)}
    with Load(ctl.url) as load:
        time.sleep(1.0)
        ctl.api("PATCH", "/pools/decode", {"tp": 4}).raise_for_status()
        # Serving capacity never drops below the desired size during the roll.
        deadline = time.monotonic() + 60
        while not ctl.converged():
            assert len(decode_instances(ctl)) >= 2
            assert time.monotonic() < deadline, "TP change did not converge"
            time.sleep(0.1)
        time.sleep(1.0)
        assert_no_failures(load, 20)
    now = decode_instances(ctl)
    assert {i["tp"] for i in now} == {4} and not old & {i["id"] for i in now}
    prefill_tp = ctl.get("/cluster")["pools"]["prefill"]["desired"]["tp"]
    assert prefill_tp == 4


def test_killed_prefill_engine_is_replaced_with_no_failed_requests(ctl: ControllerProc) -> None:
    [victim] = [i for i in ctl.get("/instances?role=prefill") if i["state"] == "ready"]
    with Load(ctl.url, workers=8) as load:
        time.sleep(1.5)
        os.kill(int(victim["pid"]), signal.SIGKILL)  # type: ignore[call-overload]
        ctl.wait(lambda: any(i["state"] == "ready" and i["id"] != victim["id"]
                             for i in ctl.get("/instances?role=prefill")), 60,
                 "a replacement prefill instance")
        time.sleep(1.5)
        assert_no_failures(load, 20)
    failed = ctl.get(f"/instances/{victim['id']}")
    assert failed["state"] == "failed" and "exited" in failed["last_error"]
    recent = ctl.get("/requests?limit=50")
    assert any(r["path"] == "disaggregated" and r["prefill_instance"] != victim["id"]
               for r in recent), "traffic is disaggregated again through the replacement"


def test_client_disconnect_cancels_upstream_work(ctl: ControllerProc) -> None:
    [decode] = decode_instances(ctl)

    def running() -> float:
        text = httpx.get(f"{decode['url']}/metrics", timeout=5).text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("vllm:num_requests_running"))

    body = {"model": "llama-3-70b", "prompt": LONG_PROMPT, "max_tokens": 2000, "stream": True}
    with httpx.Client(timeout=30) as client, client.stream(
            "POST", f"{ctl.url}/v1/completions", json=body,
            headers={"X-Request-Id": "walk-away"}) as r:
        assert r.status_code == 200
        chunks = r.iter_raw()
        next(chunks)
        assert running() == 1
    ctl.wait(lambda: running() == 0, 10, "the engine to drop the abandoned request")
    ctl.wait(lambda: any(x["id"] == "walk-away" for x in ctl.get("/requests?limit=20")), 10,
             "the record")
    rec = next(x for x in ctl.get("/requests?limit=20") if x["id"] == "walk-away")
    assert rec["status"] == "cancelled"
    inst = ctl.get(f"/instances/{decode['id']}")
    assert inst["load"]["inflight"] == 0
