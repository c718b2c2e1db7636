"""The planner through the real control API (``/api/v1/planner``) and ``/metrics``: live
mode and targets, refusals that change nothing, and a pass in advisory and apply mode."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from controller.api import create_app
from controller.api.state import AppState
from controller.config import load_settings
from controller.models import Instance, RequestPath, RequestRecord, Role
from tests.unit.api_app import NoLauncher, app_state

__all__ = ["app_state"]  # the fixture

Fixture = tuple[TestClient, AppState]


def busy(st: AppState, n: int, rate_window_s: float) -> None:
    """``n`` finished requests of 3,000 prompt and 150 output tokens within the last
    ``rate_window_s`` / 2 seconds, oldest first (the log is in completion order)."""
    now = time.time()
    for k in range(n):
        st.requests.add(RequestRecord(
            id=f"load-{k}", started_at=now - rate_window_s / 2 * (n - k) / n,
            endpoint="/v1/completions", path=RequestPath.DISAGGREGATED, status="ok",
            stream=True, prompt_tokens=3000, output_tokens=150, prefill_instance="prefill-1",
            decode_instance="decode-2", queue_ms=5.0, prefill_ms=300.0, transfer_ms=20.0,
            decode_sched_ms=5.0, ttft_ms=330.0, itl_ms=20.0))
    st.planner.begin_interval(now - rate_window_s)  # as if the interval began then


def test_get_shows_settings_profiles_and_bounds(app_state: Fixture) -> None:
    tc, _ = app_state
    body = tc.get("/api/v1/planner").json()
    assert body["mode"] == "off" and body["problem"] is None
    assert body["profiles"] == {"prefill": "sim-llama-3-70b-h100-sxm-tp4",
                                "decode": "sim-llama-3-70b-h100-sxm-tp2"}
    assert body["bounds"]["accelerator_budget"] == 32  # 4 nodes x 8 H100
    assert body["history"] == []


def test_patch_changes_live_settings_records_and_keeps_them(app_state: Fixture) -> None:
    tc, st = app_state
    r = tc.patch("/api/v1/planner", json={"mode": "advisory", "ttft_ms": 1500.0},
                 headers={"X-Pdctl-Actor": "alice"})
    assert r.status_code == 200, r.text
    assert (r.json()["mode"], r.json()["ttft_ms"]) == ("advisory", 1500.0)
    ev = tc.get("/api/v1/events", params={"kind": "planner.update"}).json()[0]
    assert ev["actor"] == "alice" and ev["before"]["mode"] == "off"
    assert ev["after"]["mode"] == "advisory"
    assert st.store.get("planner")["ttft_ms"] == 1500.0


def test_bad_changes_are_refused_and_change_nothing(app_state: Fixture) -> None:
    tc, st = app_state
    before = tc.get("/api/v1/planner").json()
    for body in ({"ttft_ms": -1}, {"mode": "auto"}, {"interval_s": 0.5}, {"itl_ms": "50"},
                 {"target": 1}, {}, {"mode": None}):
        r = tc.patch("/api/v1/planner", json=body)
        assert r.status_code == 422, (body, r.text)
        assert "detail" in r.json()
    assert tc.get("/api/v1/planner").json() == before
    assert tc.get("/api/v1/events", params={"kind": "planner.update"}).json() == []


def test_without_a_profile_the_planner_refuses_to_run(tmp_path: Path) -> None:
    settings = load_settings(None, controller={"state_dir": tmp_path},
                             hardware={"accelerator": "a100-80gb"})
    app = create_app(settings, NoLauncher())
    st: AppState = app.state.pdctl
    tc = TestClient(app, headers={"Authorization": f"Bearer {st.token}"})
    try:
        body = tc.get("/api/v1/planner").json()
        assert body["profiles"] == {"prefill": None, "decode": None}
        assert body["problem"].startswith("no performance profile for "
                                          "sim-llama-3-70b-a100-80gb-tp2 and "
                                          "sim-llama-3-70b-a100-80gb-tp4")
        assert "`pdctl profile`" in body["problem"]
        r = tc.patch("/api/v1/planner", json={"mode": "apply"})
        assert r.status_code == 422 and r.json()["field"] == "mode"
        assert "the planner cannot run: no performance profile" in r.json()["detail"]
        assert tc.get("/api/v1/planner").json()["mode"] == "off"
    finally:
        tc.close()
        st.store.close()


def test_an_advisory_pass_recommends_and_exports_without_changing_pools(
        app_state: Fixture) -> None:
    tc, st = app_state
    assert "pdctl_planner_recommended_instances{" not in tc.get("/metrics").text
    tc.patch("/api/v1/planner", json={"mode": "advisory", "interval_s": 10.0})
    busy(st, 200, 10.0)  # 20 requests/s of 3,000 prompt tokens: 60,000 tokens/s
    plan = asyncio.run(st.planner.tick())
    assert plan.recommended["prefill"] > 1 and plan.recommended["decode"] > 1, plan.reasons
    assert plan.hold is None and not plan.applied
    assert st.fleet.targets[Role.PREFILL].size == 1  # advisory: nothing changed
    metrics = tc.get("/metrics").text
    assert (f'pdctl_planner_recommended_instances{{role="prefill"}} '
            f'{float(plan.recommended["prefill"])}') in metrics
    hist = tc.get("/api/v1/planner").json()["history"]
    assert hist[-1]["recommended"]["prefill"] == plan.recommended["prefill"]
    assert hist[-1]["observed"]["requests"] == 205  # and the fixture's five
    assert any("prompt tokens/s predicted" in r for r in hist[-1]["reasons"])
    tc.patch("/api/v1/planner", json={"mode": "off"})
    assert "pdctl_planner_recommended_instances{" not in tc.get("/metrics").text


def test_an_apply_pass_changes_the_pools_as_the_planner_with_its_reasons(
        app_state: Fixture) -> None:
    tc, st = app_state
    tc.patch("/api/v1/planner", json={"mode": "apply", "interval_s": 10.0})
    busy(st, 200, 10.0)
    plan = asyncio.run(st.planner.tick())
    assert plan.applied, plan
    assert st.fleet.targets[Role.PREFILL].size == plan.recommended["prefill"] > 1
    assert st.fleet.targets[Role.DECODE].size == plan.recommended["decode"]
    events = tc.get("/api/v1/events", params={"kind": "pool.update"}).json()
    assert {e["actor"] for e in events} == {"planner"}
    assert all("prompt tokens/s predicted" in (e["detail"] or "") for e in events)
    # While an instance of that change is starting, the next pass holds.
    st.fleet.registry.add(Instance("prefill-9", Role.PREFILL, 4, "http://e9",
                                   created_at=st.fleet.clock(), accelerators=(4, 5, 6, 7)),
                          "test: the reconciler's start")
    st.planner.begin_interval(time.time() - 10.0)
    again = asyncio.run(st.planner.tick())
    assert again.hold == "a previous change is still converging" and not again.applied


def test_a_refused_change_is_recorded_in_the_plan_not_applied(app_state: Fixture) -> None:
    tc, st = app_state
    tc.patch("/api/v1/planner", json={"mode": "apply", "interval_s": 10.0})
    busy(st, 200, 10.0)
    plan = st.planner.step()
    huge = dataclasses.replace(plan, recommended={"prefill": 40, "decode": 1})
    out = st.planner.act(huge)
    assert not out.applied and out.error is not None and out.error.startswith("refused:")
    assert st.fleet.targets[Role.PREFILL].size == 1


def test_a_decode_dry_run_says_what_the_kv_cache_holds_of_recent_contexts(
        app_state: Fixture) -> None:
    tc, st = app_state
    busy(st, 50, 10.0)  # 3,150-token contexts
    tp2 = tc.patch("/api/v1/pools/decode", params={"dry_run": "true"}, json={"size": 2}).json()
    assert len(tp2["notes"]) == 1 and tp2["notes"][0].startswith(
        "decode at TP2 holds 34,")
    assert "memory, not compute, caps the decode batch" in tp2["notes"][0]
    tp4 = tc.patch("/api/v1/pools/decode", params={"dry_run": "true"}, json={"tp": 4}).json()
    assert "decode at TP4 holds" in tp4["notes"][0] and "caps" not in tp4["notes"][0]
    prefill = tc.patch("/api/v1/pools/prefill", params={"dry_run": "true"},
                       json={"size": 2}).json()
    assert prefill["notes"] == []
    advice = tc.get("/api/v1/advisor").json()
    assert advice["kv_capacity"]["tp"] == 2 and advice["kv_capacity"]["tight"]
    assert any("KV cache" in r for r in advice["verdict"]["reasons"])


def test_the_look_ahead_previews_the_proposal_on_the_recorded_traffic(
        app_state: Fixture, monkeypatch: pytest.MonkeyPatch) -> None:
    tc, st = app_state
    tc.patch("/api/v1/planner", json={"mode": "advisory", "interval_s": 10.0})
    busy(st, 60, 10.0)
    alone = st.planner.step()
    monkeypatch.setattr(st.settings.planner, "lookahead", True)
    st.planner.begin_interval(time.time() - 10.0)  # the same interval again
    plan = asyncio.run(st.planner.tick())
    ahead = [r for r in plan.reasons if r.startswith("look-ahead:")]
    assert ahead and "unfinished requests, then the last 300 s of traffic (65 requests" \
        in ahead[0], plan.reasons
    # the sizes it settled on are the last ones it previewed within the goal
    p, d = plan.recommended["prefill"], plan.recommended["decode"]
    assert f"{p} prefill + {d} decode" in " ".join(ahead)
    assert f"on {alone.recommended['prefill']} prefill + {alone.recommended['decode']} " \
        "decode" in ahead[0]  # it starts from the planner's own proposal
    assert not plan.applied and st.fleet.targets[Role.PREFILL].size == 1  # advisory


def test_the_look_ahead_and_tp_advice_say_why_they_did_not_run(
        app_state: Fixture, monkeypatch: pytest.MonkeyPatch) -> None:
    tc, st = app_state
    tc.patch("/api/v1/planner", json={"mode": "advisory", "interval_s": 10.0})
    monkeypatch.setattr(st.settings.planner, "lookahead", True)
    monkeypatch.setattr(st.settings.planner, "tp_advice", True)
    monkeypatch.setattr(st.settings.planner, "lookahead_window_s", 0.001)
    busy(st, 200, 10.0)
    plan = asyncio.run(st.planner.tick())
    assert any(r.startswith("look-ahead:") and r.endswith("too few: not run")
               for r in plan.reasons), plan.reasons
    assert any(r.startswith("TP: ") and r.endswith("too few: no advice")
               for r in plan.reasons), plan.reasons
    assert plan.tp_advice is None
    monkeypatch.setattr(st.settings.hardware, "kv_link", "carrier-pigeon")
    busy(st, 200, 10.0)
    plan = asyncio.run(st.planner.tick())
    assert "look-ahead: no profile for carrier-pigeon: not run" in plan.reasons
    assert "TP: no profile for carrier-pigeon: no advice" in plan.reasons
