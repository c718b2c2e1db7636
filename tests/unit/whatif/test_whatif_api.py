"""What-if before apply, through the real routes of an in-process controller: a pool change
predicted on the recorded traffic (nothing changed, nothing audited), then made, converged and
measured against its prediction; and the refusals (no profile, too few requests, a proposal
the pool change itself would refuse), each changing nothing."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest
from starlette.testclient import TestClient

from controller.api.state import AppState
from controller.models import Instance, Role
from tests.unit.api_app import app_state, record

__all__ = ["app_state"]  # the fixture

App = tuple[TestClient, AppState]


def burst(st: AppState, start: float, n: int = 60, span_s: float = 20.0,
          ttft_ms: float = 900.0) -> None:
    """``n`` long prompts over ``span_s`` wall seconds from ``start``: more prefill work than
    one 70B TP4 prefill instance keeps up with."""
    for k in range(n):
        rec = dataclasses.replace(record(1000 + k + int(start)), started_at=start + span_s * k / n,
                                  prompt_tokens=8000, output_tokens=20, ttft_ms=ttft_ms,
                                  queue_ms=ttft_ms / 3, gap_p99_ms=30.0)
        st.requests.add(rec)


@pytest.fixture
def busy(app_state: App) -> App:
    _, st = app_state
    burst(st, time.time() - 30)
    return app_state


def test_a_predicted_pool_change_changes_nothing_and_shows_its_effect(busy: App) -> None:
    tc, st = busy
    assert tc.get("/api/v1/whatif").json()["forecast"] is None
    r = tc.post("/api/v1/whatif/pools", json={"prefill": {"size": 3}, "minutes": 5})
    assert r.status_code == 200, r.text
    f = r.json()
    assert f["current"]["prefill"] == {"count": 1, "tp": 4}
    assert f["proposed"]["prefill"] == {"count": 3, "tp": 4}
    assert f["proposed"]["decode"] == {"count": 1, "tp": 2}
    assert f["requests"] == 65  # the burst and the fixture's five
    before, after = f["before"], f["after"]
    # one prefill instance queues the burst; three absorb it
    assert after["p90_ms"]["queue"] < before["p90_ms"]["queue"]
    assert after["p90_ms"]["ttft"] < before["p90_ms"]["ttft"]
    assert after["within_ttft"] >= before["within_ttft"]
    hours = f["accelerator_hours"]
    assert hours["proposed"] == pytest.approx(hours["current"] * (3 * 4 + 2) / (4 + 2),
                                              rel=1e-3)
    assert set(after["p50_ms"]) == {"ttft", "queue", "prefill", "transfer", "decode_sched",
                                    "gap_p99"}
    assert st.fleet.targets[Role.PREFILL].size == 1
    assert tc.get("/api/v1/events", params={"kind": "pool.update"}).json() == []
    w = tc.get("/api/v1/whatif").json()
    assert w["status"] == "proposed" and w["forecast"]["id"] == f["id"]


def test_a_change_made_is_measured_against_its_prediction_once_converged(busy: App) -> None:
    tc, st = busy
    f = tc.post("/api/v1/whatif/pools", json={"prefill": {"size": 2}}).json()
    assert tc.patch("/api/v1/pools/prefill", json={"size": 2}).status_code == 200
    w = tc.get("/api/v1/whatif").json()
    assert w["status"] == "converging" and w["applied_at"] >= f["made_at"]
    inst = Instance(id="prefill-9", role=Role.PREFILL, tp=4, url="http://e9",
                    created_at=st.fleet.clock(), accelerators=(4, 5, 6, 7))
    st.fleet.registry.add(inst, "test")
    st.fleet.registry.mark_ready(inst)
    w = tc.get("/api/v1/whatif").json()
    assert w["status"] == "measuring" and w["converged_at"] >= w["applied_at"]
    assert w["measured"] is None
    burst(st, w["converged_at"] + 0.01, n=30, span_s=0.5, ttft_ms=400.0)
    w = tc.get("/api/v1/whatif").json()
    assert w["status"] == "measured", w
    assert w["measured"]["requests"] == 30
    # measured in modelled ms: the records' wall ms over the time scale (1 here)
    assert w["measured"]["p50_ms"]["ttft"] == 400.0
    ttft = {c["quantile"]: c for c in w["comparison"] if c["figure"] == "ttft"}
    p50 = ttft["p50"]
    assert p50["predicted_ms"] == f["after"]["p50_ms"]["ttft"]
    assert p50["error"] == pytest.approx((p50["predicted_ms"] - 400.0) / 400.0, abs=1e-4)


def test_a_later_change_elsewhere_supersedes_the_prediction(busy: App) -> None:
    tc, _ = busy
    tc.post("/api/v1/whatif/pools", json={"prefill": {"size": 2}})
    assert tc.patch("/api/v1/pools/prefill", json={"size": 3}).status_code == 200
    assert tc.get("/api/v1/whatif").json()["status"] == "superseded"


@pytest.mark.parametrize(("body", "status", "says"), [
    ({"prefill": {"tp": 3}}, 422, "tp"),
    ({"decode": {"size": 0}}, 422, "greater than or equal to 1"),
    ({"decode": {}}, 422, "give size and/or tp"),
    ({"decode": {"size": 2}, "extra": 1}, 422, "extra"),
    ({"decode": {"size": "2"}}, 422, "valid integer"),
    ({"decode": {"size": 2}, "minutes": 0}, 422, "minutes"),
    ({"decode": {"size": 2}, "minutes": 0.0001}, 409, "fewer than 10 to play"),
])
def test_a_bad_proposal_is_refused_and_nothing_is_kept(busy: App, body: dict[str, object],
                                                       status: int, says: str) -> None:
    tc, st = busy
    r = tc.post("/api/v1/whatif/pools", json=body)
    assert r.status_code == status, r.text
    assert says in r.text
    assert st.forecast is None and st.fleet.targets[Role.DECODE].size == 1


def test_a_model_with_no_profile_is_refused(busy: App, monkeypatch: pytest.MonkeyPatch
                                            ) -> None:
    tc, st = busy
    monkeypatch.setattr(st.settings.model, "name", "my-finetune")
    r = tc.post("/api/v1/whatif/pools", json={"decode": {"size": 2}})
    assert r.status_code == 409 and "no profile for my-finetune" in r.json()["detail"]
    assert st.forecast is None


def test_one_prediction_at_a_time(busy: App) -> None:
    """A what-if while another runs is 429 at once (each plays two fleets on a core beside
    the router); nothing is kept, and it is taken again once the other ends."""
    tc, st = busy
    asyncio.run(st.predicting.acquire())  # another caller's prediction, running
    try:
        r = tc.post("/api/v1/whatif/pools", json={"prefill": {"size": 2}})
        assert r.status_code == 429 and "another what-if" in r.json()["detail"]
        assert st.forecast is None
    finally:
        st.predicting.release()
    assert tc.post("/api/v1/whatif/pools", json={"prefill": {"size": 2}}).status_code == 200
