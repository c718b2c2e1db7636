"""Liveness and readiness, open without a token: ``/healthz`` and ``/health`` answer 200
while the controller runs; ``/readyz`` answers 200 only when the fleet can serve (a ready
decode instance, and a ready prefill instance while the prefill pool is meant to have one),
503 with the reason otherwise."""

from __future__ import annotations

from starlette.testclient import TestClient

from controller.api.state import AppState
from controller.api.views import readiness_view
from controller.models import Role
from tests.unit.api_app import app_state

__all__ = ["app_state"]  # the fixture

App = tuple[TestClient, AppState]


def test_ready_fleet(app_state: App) -> None:
    tc, _ = app_state
    for path in ("/healthz", "/health", "/readyz"):
        r = tc.get(path, headers={"Authorization": ""})
        assert r.status_code == 200, (path, r.text)
        assert r.json()["ready"] == {"prefill": 1, "decode": 1}
    assert tc.get("/readyz").json()["status"] == "ready"


def test_no_prefill_instance_is_not_ready_while_the_pool_wants_one(app_state: App) -> None:
    tc, st = app_state
    [p] = st.table.ready(Role.PREFILL)
    st.fleet.registry.drain(p, "test")
    r = tc.get("/readyz", headers={"Authorization": ""})
    assert r.status_code == 503 and r.json()["status"] == "not ready"
    assert "no ready prefill instance" in r.json()["reason"]
    assert tc.get("/healthz").status_code == 200  # alive all the same
    tc.patch("/api/v1/pools/prefill", json={"size": 0}).raise_for_status()
    assert tc.get("/readyz").status_code == 200  # colocated only: decode is enough


def test_readiness_view_table() -> None:
    class Table:
        def __init__(self, prefill: int, decode: int) -> None:
            self.n = {Role.PREFILL: prefill, Role.DECODE: decode}

        def ready(self, role: Role) -> list[object]:
            return [object()] * self.n[role]

    for prefill, decode, wanted, reason in [
            (1, 1, True, None), (0, 1, False, None), (1, 0, True, "no ready decode"),
            (0, 0, False, "no ready decode"), (0, 2, True, "no ready prefill")]:
        view = readiness_view(Table(prefill, decode), wanted)  # type: ignore[arg-type]
        assert (view.reason is None) is (reason is None), (prefill, decode, wanted)
        assert reason is None or reason in (view.reason or "")
