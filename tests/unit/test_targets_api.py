"""The service targets through the real control API (``/api/v1/targets``): defaults from the
config, a change recorded with its actor and kept across a restart, refusals that change
nothing; and ``/stats``'s figures the console's health status reads (p95, error rate, output
tokens per second, per path)."""

from __future__ import annotations

import time
from pathlib import Path

from starlette.testclient import TestClient

from controller.api import create_app
from controller.api.state import AppState
from controller.config import load_settings
from tests.unit.api_app import NoLauncher, app_state

__all__ = ["app_state"]  # the fixture

Fixture = tuple[TestClient, AppState]


def test_targets_change_is_recorded_and_kept(app_state: Fixture, tmp_path: Path) -> None:
    tc, st = app_state
    assert tc.get("/api/v1/targets").json() == {"ttft_p95_ms": 2000.0, "ttft_p99_ms": 5000.0,
                                                "gap_p99_ms": 150.0, "error_rate": 0.01}
    r = tc.patch("/api/v1/targets", json={"ttft_p95_ms": 800},
                 headers={"X-Pdctl-Actor": "alice"})
    assert r.status_code == 200 and r.json()["ttft_p95_ms"] == 800.0
    [event] = st.store.events(10, 0, "targets.update")
    assert event["actor"] == "alice" and event["before"] == {"ttft_p95_ms": 2000.0}
    assert event["after"] == {"ttft_p95_ms": 800.0}
    # A new app on the same state directory keeps the operator's target.
    settings = load_settings(None, controller={"state_dir": st.settings.controller.state_dir})
    again = create_app(settings, NoLauncher()).state.pdctl
    assert again.targets.settings.ttft_p95_ms == 800.0
    again.store.close()


def test_bad_targets_are_refused_and_change_nothing(app_state: Fixture) -> None:
    tc, st = app_state
    for body in (b"{}", b'{"ttft_p95_ms": 0}', b'{"error_rate": 2}',
                 b'{"gap_p99_ms": "fast"}', b'{"nope": 1}', b'{"ttft_p99_ms": 1e999}'):
        r = tc.patch("/api/v1/targets", content=body,
                     headers={"Content-Type": "application/json"})
        assert r.status_code == 422, (body, r.status_code, r.text)
    assert tc.get("/api/v1/targets").json()["ttft_p95_ms"] == 2000.0
    assert st.store.events(10, 0, "targets.update") == []


def test_stats_carry_what_the_health_status_reads(app_state: Fixture) -> None:
    tc, _ = app_state
    s = tc.get("/api/v1/stats?window_s=600").json()
    assert {"p50", "p90", "p95", "p99"} <= set(s["ttft_ms"])
    assert s["error_rate"] == 0.0 and s["output_tokens_per_s"] > 0
    assert set(s["by_path"]) == {"disaggregated", "colocated"}
    assert s["by_path"]["disaggregated"]["requests"] == 4


def test_the_viewer_token_reads_and_is_refused_every_change(app_state: Fixture) -> None:
    tc, st = app_state
    viewer = {"Authorization": f"Bearer {st.viewer_token}"}
    assert st.viewer_token and st.viewer_token != st.token
    assert (Path(st.settings.controller.state_dir) / "viewer-token").read_text().strip() \
        == st.viewer_token
    assert tc.get("/api/v1/access").json() == {"role": "admin", "may_change": True}
    assert tc.get("/api/v1/access", headers=viewer).json() == {"role": "viewer",
                                                                "may_change": False}
    for path in ("/cluster", "/stats", "/targets", "/routing", "/events", "/planner"):
        assert tc.get(f"/api/v1{path}", headers=viewer).status_code == 200, path
    writes = [("PATCH", "/api/v1/targets", {"ttft_p95_ms": 1}),
              ("PATCH", "/api/v1/routing", {"max_attempts": 2}),
              ("PATCH", "/api/v1/pools/decode", {"size": 2}),
              ("PATCH", "/api/v1/pools/decode?dry_run=true", {"size": 2}),
              ("POST", "/api/v1/instances/decode-2/drain", None),
              ("PATCH", "/api/v1/planner", {"mode": "advisory"})]
    before = tc.get("/api/v1/cluster").json()
    for method, path, body in writes:
        r = tc.request(method, path, json=body, headers=viewer)
        assert r.status_code == 403, (path, r.status_code, r.text)
        assert "viewer token" in r.json()["detail"]
    assert tc.get("/api/v1/cluster").json()["pools"] == before["pools"]
    assert st.store.events(50, 0, None)[0]["kind"] not in ("pool.update", "routing.update",
                                                           "targets.update")
    bad = {"Authorization": "Bearer nope"}
    assert tc.get("/api/v1/cluster", headers=bad).status_code == 401


def test_a_request_is_found_by_id(app_state: Fixture) -> None:
    tc, st = app_state
    rid = st.requests.recent(1)[0].id
    r = tc.get(f"/api/v1/requests/{rid}")
    assert r.status_code == 200 and r.json()["id"] == rid
    missing = tc.get("/api/v1/requests/never-seen")
    assert missing.status_code == 404 and "never-seen" in missing.json()["detail"]


def test_stats_of_a_window_in_the_past(app_state: Fixture) -> None:
    tc, st = app_state
    first = min(r.started_at for r in st.requests.recent(100))
    now = tc.get("/api/v1/stats?window_s=600").json()
    past = tc.get(f"/api/v1/stats?window_s=600&end={first + 1e-6}").json()
    assert now["requests"] == 5 and past["requests"] == 1  # only what started before end
    assert tc.get("/api/v1/timeseries?window_s=60&step_s=10&end=1").json()["now"] == 1
    assert tc.get("/api/v1/stats?window_s=60&end=-1").status_code == 422


def test_requests_and_timeseries_of_a_range(app_state: Fixture) -> None:
    """What the console's custom range reads: requests that started in ``[since, until)``,
    and a timeseries whose end lies ahead lays no bucket after now."""
    tc, st = app_state
    starts = sorted(r.started_at for r in st.requests.recent(100))
    mid = (starts[1] + starts[2]) / 2
    older = tc.get("/api/v1/requests", params={"until": mid}).json()
    newer = tc.get("/api/v1/requests", params={"since": mid, "limit": 2}).json()
    assert sorted(r["started_at"] for r in older) == starts[:2]
    assert [r["started_at"] for r in newer] == sorted(starts[2:], reverse=True)[:2]
    bad = tc.get("/api/v1/requests", params={"since": mid, "until": mid})
    assert bad.status_code == 422 and bad.json()["field"] == "since"
    ahead = tc.get("/api/v1/timeseries",
                   params={"window_s": 60, "step_s": 10, "end": starts[-1] + 3600}).json()
    assert ahead["now"] <= time.time() and ahead["buckets"][-1]["t"] < time.time()


def test_events_and_advice_of_a_range(app_state: Fixture) -> None:
    """What the console's Events and Advisor pages read for the chosen window or range."""
    tc, st = app_state
    for k in range(3):
        st.store.record("alice", "routing.update", "routing", None, {"k": k}, None)
    times = sorted(e["ts"] for e in st.store.events(100, 0, "routing.update"))
    mid = (times[0] + times[1]) / 2
    r = tc.get("/api/v1/events", params={"kind": "routing.update", "since": mid})
    assert [e["after"]["k"] for e in r.json()] == [2, 1]
    r = tc.get("/api/v1/events", params={"kind": "routing.update", "until": mid})
    assert [e["after"]["k"] for e in r.json()] == [0]
    bad = tc.get("/api/v1/events", params={"since": mid, "until": mid})
    assert bad.status_code == 422 and bad.json()["field"] == "since"
    first = min(r.started_at for r in st.requests.recent(100))
    now = tc.get("/api/v1/advisor", params={"window_s": 600}).json()
    past = tc.get("/api/v1/advisor", params={"window_s": 600, "end": first + 1e-6}).json()
    assert now["traffic"]["requests"] == 5 and past["traffic"]["requests"] == 1
    assert tc.get("/api/v1/advisor", params={"end": -1}).status_code == 422
