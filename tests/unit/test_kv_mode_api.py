"""A pool's KV mode through the control API and ``pdctl kv-mode``: desired state, dry run,
refusals (422, nothing changed), the audit log and each instance's mode."""

from __future__ import annotations

import argparse

import pytest
from starlette.testclient import TestClient

from controller.api.state import AppState
from controller.cli import clients
from controller.cli import commands as cli
from controller.models import Role
from pdctl_api.client import PdctlClient
from tests.unit.api_app import app_state, through

__all__ = ["app_state"]  # the fixture

App = tuple[TestClient, AppState]


def test_patch_kv_mode_sets_the_desired_mode_and_records_it(app_state: App) -> None:
    tc, st = app_state
    r = tc.patch("/api/v1/pools/decode", json={"kv_mode": "push"})
    assert r.status_code == 200, r.text
    assert r.json()["desired"] == {"size": 1, "tp": 2, "kv_mode": "push"}
    assert r.json()["converged"] is False  # its pull instance is to be replaced
    cluster = tc.get("/api/v1/cluster").json()
    assert cluster["pools"]["decode"]["desired"]["kv_mode"] == "push"
    assert cluster["pools"]["prefill"]["desired"]["kv_mode"] == "pull"
    assert {i["kv_mode"] for i in cluster["instances"]} == {"pull"}
    [ev] = tc.get("/api/v1/events?limit=1&kind=pool.update").json()
    assert (ev["before"]["kv_mode"], ev["after"]["kv_mode"]) == ("pull", "push")


def test_dry_run_of_a_mode_change_starts_a_replacement_first(app_state: App) -> None:
    tc, st = app_state
    r = tc.patch("/api/v1/pools/decode?dry_run=true", json={"kv_mode": "push"})
    assert r.status_code == 200, r.text
    plan = r.json()
    assert plan["desired"] == {"size": 1, "tp": 2, "kv_mode": "push"}
    assert [(a["kind"], a["kv_mode"], a["reason"]) for a in plan["actions"]] == [
        ("start", "push", "KV push replacement (0/1)")]
    assert st.fleet.targets[Role.DECODE].kv_mode == "pull"  # nothing changed


@pytest.mark.parametrize("body", [{"kv_mode": "both"}, {"kv_mode": None}, {"kv_mode": 1}])
def test_invalid_kv_mode_is_refused(app_state: App, body: dict[str, object]) -> None:
    tc, st = app_state
    before = (dict(st.fleet.targets), len(st.store.events(1000)))
    r = tc.patch("/api/v1/pools/decode", json=body)
    assert r.status_code == 422, r.text
    assert (dict(st.fleet.targets), len(st.store.events(1000))) == before


def test_push_refused_by_the_backend_changes_nothing(app_state: App) -> None:
    tc, st = app_state
    st.fleet.desired.push_problem = lambda: "the installed vLLM has no NixlPushConnector"
    before = (dict(st.fleet.targets), len(st.store.events(1000)))
    r = tc.patch("/api/v1/pools/prefill", json={"kv_mode": "push", "size": 2})
    assert r.status_code == 422
    assert "the installed vLLM has no NixlPushConnector" in r.text
    assert (dict(st.fleet.targets), len(st.store.events(1000))) == before


def test_pdctl_kv_mode(app_state: App, monkeypatch: pytest.MonkeyPatch,
                       capsys: pytest.CaptureFixture[str]) -> None:
    tc, st = app_state

    def connect(args: argparse.Namespace) -> PdctlClient:
        return PdctlClient(args.controller, args.token, actor=clients.CLI_ACTOR,
                           transport=through(tc))

    monkeypatch.setattr(clients, "connect", connect)
    assert cli.main(["kv-mode", "decode", "push", "--dry-run", "--token", st.token]) == 0
    out = capsys.readouterr().out
    assert "would set desired 1 x TP2 KV push" in out
    assert "start decode at TP2 KV push: KV push replacement (0/1)" in out
    assert cli.main(["kv-mode", "decode", "push", "--token", st.token]) == 0
    assert capsys.readouterr().out.strip() == "decode: desired 1 x TP2 KV push"
    assert st.fleet.targets[Role.DECODE].kv_mode == "push"
    [ev] = st.store.events(1, kind="pool.update")
    assert ev["actor"] == clients.CLI_ACTOR
    with pytest.raises(SystemExit):
        cli.main(["kv-mode", "decode", "sideways", "--token", st.token])
