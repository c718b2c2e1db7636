"""The hand-off through a real controller and simulated engine processes:

- push mode (both hops at once, the decode engine registers its blocks with the prefill,
  which writes into them) serves disaggregated requests, streaming and not, and leaves
  nothing held on either engine;
- a pool changing KV mode under load drains and restarts its instances like a TP change,
  with 0 failed requests;
- the silent-fallback alarm: a decode engine that cannot reach the prefill's side channel
  (``/sim/fault``) under ``kv_load_failure_policy: recompute`` answers 200 while computing
  every prompt itself; the controller flags those requests, counts them per instance pair
  and raises them in ``/stats``; a healthy run (in both modes) raises nothing;
- ``disagg_policy: slo`` records each request's decision and reason;
- the client's W3C trace context reaches both engines of a disaggregated request, in pull
  and push mode; a malformed one reaches neither.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.harness import LONG_PROMPT, ControllerProc, Load, start_controller

pytestmark = pytest.mark.slow

PUSH = {"pools": {"prefill": {"size": 1, "tp": 4, "kv_mode": "push"},
                  "decode": {"size": 1, "tp": 2, "kv_mode": "push"}}}


@pytest.fixture
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("handoff")


def ready(ctl: ControllerProc, role: str) -> list[dict[str, Any]]:
    return [i for i in ctl.get("/instances", role=role) if i["state"] == "ready"]


def sim_info(url: str) -> dict[str, Any]:
    info: dict[str, Any] = httpx.get(f"{url}/sim/info", timeout=10).json()
    return info


def complete(ctl: ControllerProc, k: int, stream: bool = False) -> httpx.Response:
    body = {"model": "llama-3-70b", "prompt": f"{k} {LONG_PROMPT}", "max_tokens": 6,
            "stream": stream}
    return httpx.post(f"{ctl.url}/v1/completions", json=body, timeout=60)


def records(ctl: ControllerProc, n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = ctl.get("/requests", limit=n)
    return out


def wait_for(check: Any, timeout_s: float = 20.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}")


TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def traced(ctl: ControllerProc, traceparent: str, stream: bool = False) -> str:
    """Send one disaggregated request with a trace context; its request id."""
    r = httpx.post(f"{ctl.url}/v1/completions", timeout=60,
                   headers={"traceparent": traceparent, "tracestate": "vendor=1"},
                   json={"model": "llama-3-70b", "prompt": f"traced {LONG_PROMPT}",
                         "max_tokens": 3, "stream": stream})
    assert r.status_code == 200, r.text
    return r.headers["x-request-id"]


def engine_traces(inst: dict[str, Any]) -> dict[str, str]:
    got = httpx.get(f"{inst['url']}/sim/traces", timeout=10).json()["traces"]
    return {t["request_id"]: t["traceparent"] for t in got}


def handoff(ctl: ControllerProc) -> dict[str, Any]:
    h: dict[str, Any] = ctl.get("/stats", window_s=300)["handoff"]
    return h


def test_push_mode_serves_disaggregated_and_holds_nothing(tmp: Path) -> None:
    ctl = start_controller(tmp, PUSH)
    try:
        [p], [d] = ready(ctl, "prefill"), ready(ctl, "decode")
        assert p["kv_mode"] == d["kv_mode"] == "push"
        assert sim_info(str(p["url"]))["kv_transfer_mode"] == "push"
        for k in range(6):
            r = complete(ctl, k, stream=bool(k % 2))
            assert r.status_code == 200, r.text
            if k % 2:
                assert "data: [DONE]" in r.text and "kv_transfer_params" not in r.text
            else:
                assert r.json()["choices"][0]["text"]
                assert "kv_transfer_params" not in r.json()
        recs = records(ctl, 6)
        assert [r["path"] for r in recs] == ["disaggregated"] * 6, recs
        assert all(r["decision"] == "disaggregated" and r["prefill_instance"] == p["id"]
                   and r["kv_handle"] for r in recs), recs
        assert all(r["ttft_ms"] > 0 and not r["kv_fallback"] for r in recs)
        wait_for(lambda: sim_info(str(p["url"]))["kv_handles"] == 0
                 and sim_info(str(d["url"]))["kv_push_waiting"] == 0,
                 what="the prefill's blocks freed after the writes")
        h = handoff(ctl)
        assert h["fallback_requests"] == 0 and not h["alerts"], h
        rid = traced(ctl, TRACEPARENT, stream=True)  # both hops at once carry it too
        assert engine_traces(p)[rid] == engine_traces(d)[rid] == TRACEPARENT
    finally:
        ctl.stop()


def test_a_stalled_push_write_is_served_colocated_streaming_or_not(tmp: Path) -> None:
    """The prefill takes the registration and never writes (the real lab's failed push
    handshake): the decode hop, which always streams, has no token kv.late_hop_share of the
    lease after the prefill answered, so it is aborted and the request served colocated --
    a non-streaming client too, before the decode engine's registration timeout (the lease)
    and long before the request timeout."""
    ctl = start_controller(tmp, {**PUSH, "kv": {"lease_s": 6}})  # late: 3 s
    try:
        [p] = ready(ctl, "prefill")
        assert httpx.post(f"{p['url']}/sim/fault", json={"push_stalled": True},
                          timeout=10).json()["push_stalled"] is True
        for k, stream in enumerate((False, True)):
            started = time.monotonic()
            r = complete(ctl, k, stream=stream)
            took = time.monotonic() - started
            assert r.status_code == 200, r.text
            assert 3.0 <= took < 6.0, took
            if stream:
                assert "data: [DONE]" in r.text and "kv_transfer_params" not in r.text
            else:
                assert r.json()["choices"][0]["text"] and "kv_transfer_params" not in r.json()
            [rec] = records(ctl, 1)
            assert rec["path"] == "colocated" and rec["kv_handle"], rec
        metrics = httpx.get(f"{ctl.url}/metrics", timeout=10).text
        assert "pdctl_kv_stuck_reads_total 2.0" in metrics
        httpx.post(f"{p['url']}/sim/fault", json={"push_stalled": False}, timeout=10)
        r = complete(ctl, 9)
        assert r.status_code == 200 and records(ctl, 1)[0]["path"] == "disaggregated"
        assert r.json()["usage"]["completion_tokens"] == 6  # assembled from the stream
    finally:
        ctl.stop()


def test_trace_context_reaches_both_hops_and_a_malformed_one_neither(tmp: Path) -> None:
    ctl = start_controller(tmp, {"pools": {"prefill": {"size": 1, "tp": 4},
                                           "decode": {"size": 1, "tp": 2}}})
    try:
        [p], [d] = ready(ctl, "prefill"), ready(ctl, "decode")
        rid = traced(ctl, TRACEPARENT)
        [rec] = records(ctl, 1)
        assert rec["id"] == rid and rec["path"] == "disaggregated", rec
        assert engine_traces(p)[rid] == engine_traces(d)[rid] == TRACEPARENT
        bad = traced(ctl, "00-" + "0" * 32 + "-00f067aa0ba902b7-01")  # all-zero trace id
        assert bad not in engine_traces(p) and bad not in engine_traces(d)
        untraced = complete(ctl, 1).headers["x-request-id"]
        assert untraced not in engine_traces(d)
    finally:
        ctl.stop()


def test_pool_mode_change_under_load_drains_and_restarts(tmp: Path) -> None:
    ctl = start_controller(tmp, {"pools": {"prefill": {"size": 1, "tp": 4},
                                           "decode": {"size": 1, "tp": 2}}})
    try:
        old = {i["id"] for i in ready(ctl, "prefill") + ready(ctl, "decode")}
        with Load(ctl.url, workers=4, long_only=True) as load:
            time.sleep(1.0)
            for role in ("prefill", "decode"):
                r = ctl.api("PATCH", f"/pools/{role}", {"kv_mode": "push"})
                assert r.status_code == 200, r.text

            def converted() -> bool:
                insts = ready(ctl, "prefill") + ready(ctl, "decode")
                return (len(insts) == 2 and all(i["kv_mode"] == "push" for i in insts)
                        and not old & {i["id"] for i in insts})
            wait_for(converted, 60, "both pools restarted in push mode")
            time.sleep(1.5)  # requests on the new pair
        assert load.result.failures == [], load.result.failures[:5]
        assert load.result.ok > 10
        recs = records(ctl, 10)
        assert any(r["path"] == "disaggregated" for r in recs), recs
        [a, b] = ctl.get("/events", kind="pool.update")[:2]
        assert {a["target"], b["target"]} == {"prefill", "decode"}
    finally:
        ctl.stop()


@pytest.mark.parametrize("mode", ["pull", "push"])
def test_silent_fallback_is_flagged_counted_and_raised(tmp: Path, mode: str) -> None:
    ctl = start_controller(tmp, {
        "sim": {"kv_load_failure_policy": "recompute"},
        "pools": {"prefill": {"size": 1, "tp": 4, "kv_mode": mode},
                  "decode": {"size": 1, "tp": 2, "kv_mode": mode}}})
    try:
        [p], [d] = ready(ctl, "prefill"), ready(ctl, "decode")
        for k in range(4):  # healthy: the KV arrives, nothing is raised
            assert complete(ctl, k).status_code == 200
        time.sleep(1.5)  # a few load polls
        assert handoff(ctl)["fallback_requests"] == 0
        assert not any(r["kv_fallback"] for r in records(ctl, 4))

        assert httpx.post(f"{d['url']}/sim/fault", json={"kv_unreachable": True},
                          timeout=10).status_code == 200
        for k in range(4, 8):
            r = complete(ctl, k)
            assert r.status_code == 200, r.text  # silent: the client sees success
        wait_for(lambda: handoff(ctl)["fallback_requests"] >= 3, 20, "the fallback alarm")
        h = handoff(ctl)
        assert h["fallback_pairs"][0]["prefill"] == p["id"]
        assert h["fallback_pairs"][0]["decode"] == d["id"]
        assert any("the KV never arrived" in a for a in h["alerts"]), h
        flagged = {r["id"] for r in records(ctl, 8) if r["kv_fallback"]}
        assert len(flagged) >= 3 and all(
            r["path"] == "disaggregated" for r in records(ctl, 8) if r["id"] in flagged)
        metrics = httpx.get(f"{ctl.url}/metrics", timeout=10).text
        line = next(x for x in metrics.splitlines()
                    if x.startswith("pdctl_kv_fallback_requests_total{"))
        assert f'decode="{d["id"]}"' in line and float(line.rsplit(" ", 1)[1]) >= 3
        assert ctl.get("/events", kind="kv.fallback")
    finally:
        ctl.stop()


def test_slo_policy_records_each_decision(tmp: Path) -> None:
    ctl = start_controller(tmp, {"routing": {"disagg_policy": "slo"},
                                 "pools": {"prefill": {"size": 1, "tp": 4},
                                           "decode": {"size": 1, "tp": 2}}})
    try:
        for k in range(6):
            assert complete(ctl, k).status_code == 200
        r = httpx.post(f"{ctl.url}/v1/completions", timeout=30, json={
            "model": "llama-3-70b", "prompt": "hi", "max_tokens": 2})
        assert r.status_code == 200
        recs = records(ctl, 7)
        assert all(x["decision"] in ("disaggregated", "local") and x["decision_reason"]
                   for x in recs), recs
        assert all((x["decision"] == "disaggregated") == (x["path"] == "disaggregated")
                   for x in recs), recs
        assert recs[0]["decision"] == "local"  # "hi": nothing worth moving
        assert "ms" in recs[0]["decision_reason"] or "holds" in recs[0]["decision_reason"]
        metrics = httpx.get(f"{ctl.url}/metrics", timeout=10).text
        assert 'pdctl_handoff_decisions_total{decision="local",policy="slo"}' in metrics
        h = handoff(ctl)
        assert h["policy"] == "slo"
        assert h["decided_disaggregated"] + h["decided_local"] == 7
    finally:
        ctl.stop()
