"""The control API's contract (``pdctl_api``): every route answers its model, byte for byte
what the controller's objects produce; ``pdctl_api``'s client reads every route; the dry run
of a pool change changes nothing; /openapi.json shows the models; and the import rules that
keep the contract a leaf (``controller`` never imports ``dashboard``, ``pdctl_api`` imports
neither)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
from pydantic import TypeAdapter
from starlette.testclient import TestClient

from controller.api.state import AppState
from controller.models import Instance, InstanceState, Role
from pdctl_api import schema
from pdctl_api.client import ApiError, PdctlClient
from tests.unit.api_app import app_state, client_of, through

__all__ = ["app_state"]  # the fixture

ROOT = Path(__file__).resolve().parents[2]


def unchanged(st: AppState) -> tuple[Any, ...]:
    return (st.store.get("desired"), st.store.events(1)[0]["id"], dict(st.fleet.targets))


# ---- the answers -------------------------------------------------------------------------

ROUTES = {
    "/cluster": schema.ClusterPublic, "/pools/decode": schema.PoolPublic,
    "/instances": list[schema.InstancePublic], "/instances/decode-2": schema.InstancePublic,
    "/instances/decode-2/log": schema.InstanceLogPublic, "/routing": schema.RoutingPublic,
    "/requests": list[schema.RequestPublic], "/stats": schema.StatsPublic,
    "/timeseries?window_s=60&step_s=10": schema.TimeseriesPublic,
    "/advisor": schema.AdvisorPublic, "/events": list[schema.EventPublic],
    "/utilization?window_s=60&step_s=10": schema.UtilizationPublic,
}


@pytest.mark.parametrize("path", list(ROUTES))
def test_every_answer_is_its_model(app_state: tuple[TestClient, AppState], path: str) -> None:
    tc, _ = app_state
    r = tc.get(f"/api/v1{path}")
    assert r.status_code == 200, r.text
    adapter: TypeAdapter[Any] = TypeAdapter(ROUTES[path])
    assert adapter.dump_python(adapter.validate_json(r.content), mode="json") == r.json()


def test_answers_are_what_the_controller_objects_produce(
        app_state: tuple[TestClient, AppState]) -> None:
    tc, st = app_state
    st.table.handle_out("prefill-1", "req-x", 30.0)  # a KV handle out, unread
    instances = [i.public(st.table.inflight(i.id), st.table.handles_out(i.id))
                 for i in st.fleet.registry]
    assert tc.get("/api/v1/instances").json() == instances
    assert instances[0]["load"]["kv_handles_out"] == 1
    assert tc.get("/api/v1/requests").json() == [r.public() for r in st.requests.recent(100)]
    assert tc.get("/api/v1/pools/decode").json() == st.fleet.pool_view(Role.DECODE)
    assert tc.get("/api/v1/routing").json() == st.table.settings.model_dump()
    assert tc.get("/api/v1/events?limit=5").json() == st.store.events(5)
    cluster = tc.get("/api/v1/cluster").json()
    assert cluster["instances"] == instances
    assert cluster["pools"] == {r.value: st.fleet.pool_view(r) for r in Role}
    stats = tc.get("/api/v1/stats?window_s=60").json()
    assert stats["kv_integrity"] == st.lease_watch.summary(60)
    assert stats["requests"] == 5 and stats["by_status"] == {"ok": 5}


def test_openapi_shows_the_models(app_state: tuple[TestClient, AppState]) -> None:
    tc, _ = app_state
    doc = tc.get("/openapi.json").json()
    names = set(doc["components"]["schemas"])
    assert {"ClusterPublic", "PoolPublic", "PoolPlanPublic", "InstancePublic",
            "RoutingPublic", "RequestPublic", "StatsPublic", "EventPublic", "AdvisorPublic",
            "TimeseriesPublic", "PoolUpdate", "RoutingUpdate", "ErrorPublic"} <= names

    def answer(path: str, method: str = "get") -> str:
        return str(doc["paths"][f"/api/v1{path}"][method]["responses"]["200"])

    assert "ClusterPublic" in answer("/cluster")
    assert "PoolPublic" in answer("/pools/{role}", "patch")
    assert "PoolPlanPublic" in answer("/pools/{role}", "patch")
    assert "RequestPublic" in answer("/requests")
    assert "ErrorPublic" in str(doc["paths"]["/api/v1/routing"]["patch"]["responses"]["422"])
    dry_run = doc["paths"]["/api/v1/pools/{role}"]["patch"]["parameters"]
    assert "dry_run" in [p["name"] for p in dry_run]


# ---- the dry run -------------------------------------------------------------------------

def test_dry_run_plans_a_scale_up_and_changes_nothing(
        app_state: tuple[TestClient, AppState]) -> None:
    tc, st = app_state
    before = unchanged(st)
    r = tc.patch("/api/v1/pools/decode?dry_run=true", json={"size": 3})
    assert r.status_code == 200, r.text
    assert r.json() == {"role": "decode", "desired": {"size": 3, "tp": 2, "kv_mode": "pull"},
                        "actions": [
        {"kind": "start", "instance_id": None, "role": "decode", "tp": 2, "kv_mode": "pull",
         "reason": "decode pool below size (1/3)"}] * 2, "notes": [
        "decode at TP2 holds 34,679 tokens of KV cache per instance: 48 contexts of the "
        "observed p99 context (708 tokens), 48 of the p50 (708)"]}
    assert unchanged(st) == before


def test_an_integer_written_with_a_zero_fraction_is_that_integer(
        app_state: tuple[TestClient, AppState]) -> None:
    """JSON Schema's ``integer`` (what /openapi.json declares) includes 3.0: accepted as 3;
    3.5, "3" and true stay refused."""
    tc, st = app_state
    whole = tc.patch("/api/v1/pools/decode?dry_run=true", json={"size": 3.0, "tp": 2.0})
    exact = tc.patch("/api/v1/pools/decode?dry_run=true", json={"size": 3, "tp": 2})
    assert whole.status_code == 200 and whole.json() == exact.json()
    assert tc.patch("/api/v1/routing", json={"max_attempts": 3.0}).json()["max_attempts"] == 3
    for bad in (3.5, "3", True):
        r = tc.patch("/api/v1/pools/decode?dry_run=true", json={"size": bad})
        assert r.status_code == 422 and "size" in r.json()["detail"], r.text


def test_dry_run_of_a_scale_down_names_the_instance_to_drain(
        app_state: tuple[TestClient, AppState]) -> None:
    tc, st = app_state
    inst = Instance(id="decode-3", role=Role.DECODE, tp=2, url="http://e3",
                    created_at=st.fleet.clock() + 1)
    st.fleet.registry.add(inst, "test")
    st.fleet.registry.mark_ready(inst)
    st.fleet.set_pool(Role.DECODE, 2, None, "test")
    before = unchanged(st)
    r = tc.patch("/api/v1/pools/decode?dry_run=true", json={"size": 1})
    assert r.json()["actions"] == [
        {"kind": "drain", "instance_id": "decode-3", "role": None, "tp": None,
         "kv_mode": None, "reason": "scale decode down to 1"}]
    assert r.json()["desired"] == {"size": 1, "tp": 2, "kv_mode": "pull"}
    assert unchanged(st) == before
    assert inst.state is InstanceState.READY


def test_dry_run_of_a_tp_change_starts_a_replacement_first(
        app_state: tuple[TestClient, AppState]) -> None:
    tc, _ = app_state
    plan = schema.PoolPlanPublic.model_validate(
        tc.patch("/api/v1/pools/prefill?dry_run=true", json={"tp": 2}).json())
    assert plan.desired == schema.PoolSize(size=1, tp=2)
    assert [(a.kind, a.role, a.tp) for a in plan.actions] == [("start", Role.PREFILL, 2)]
    assert plan.actions[0].reason == "TP 2 replacement (0/1)"


@pytest.mark.parametrize("body,needle", [({"tp": 3}, "does not divide"),
                                         ({"size": 100}, "accelerators"),
                                         ({}, "nothing to change"),
                                         ({"replicas": 2}, "replicas")])
def test_dry_run_refuses_like_the_real_change(app_state: tuple[TestClient, AppState],
                                              body: dict[str, int], needle: str) -> None:
    tc, st = app_state
    before = unchanged(st)
    dry = tc.patch("/api/v1/pools/decode?dry_run=true", json=body)
    real = tc.patch("/api/v1/pools/decode", json=body)
    assert dry.status_code == real.status_code == 422
    assert dry.json() == real.json() and needle in dry.json()["detail"]
    assert unchanged(st) == before


# ---- the client ----------------------------------------------------------------------------

def test_the_client_reads_every_route(app_state: tuple[TestClient, AppState]) -> None:
    tc, st = app_state
    with client_of(tc, st) as c:
        cluster = c.cluster()
        assert [i.id for i in cluster.instances] == ["prefill-1", "decode-2"]
        assert cluster.pools[Role.DECODE].converged
        assert c.pool(Role.PREFILL).desired == schema.PoolSize(size=1, tp=4)
        assert [i.id for i in c.instances(role="decode")] == ["decode-2"]
        assert c.instances(state=InstanceState.DRAINING) == []
        assert c.instance("decode-2").load.running == 2.0
        assert c.instance_log("decode-2").log == ""
        assert c.routing().decode_policy == "least_loaded"
        assert [r.id for r in c.requests(2)] == ["req-4", "req-3"]
        assert c.stats(60).requests == 5
        assert len(c.timeseries(60, 10).buckets) == 6
        assert c.advisor().traffic.requests == 5
        assert c.events(1)[0].kind == "instance.ready"
        assert c.health().ready == {Role.PREFILL: 1, Role.DECODE: 1}


def test_the_client_changes_and_errors(app_state: tuple[TestClient, AppState]) -> None:
    tc, st = app_state
    with client_of(tc, st) as c:
        assert c.plan_pool("decode", size=2).actions[0].kind == "start"
        assert c.set_pool("decode", size=2).desired.size == 2
        assert st.store.events(1)[0]["actor"] == "test"
        assert c.set_routing({"max_attempts": 2}).max_attempts == 2
        assert c.set_routing(schema.RoutingUpdate(max_attempts=4)).max_attempts == 4
        with pytest.raises(ApiError) as info:
            c.set_routing({"decode_policy": "random"})
        assert info.value.status == 422 and "decode_policy" in info.value.detail
        with pytest.raises(ApiError) as info:
            c.drain("nope")
        assert info.value.status == 404 and info.value.refused
        assert c.drain("decode-2").state is InstanceState.DRAINING
    with PdctlClient("http://controller", "wrong", transport=through(tc)) as bad:
        with pytest.raises(ApiError) as info:
            bad.routing()
        assert info.value.unauthorized


# ---- the import rules --------------------------------------------------------------------

def imports_of(package: str) -> dict[str, set[str]]:
    """Every module of ``package`` (a folder under the repository) -> the top-level packages
    it imports (statically: import statements anywhere in the file)."""
    out = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
        out[str(path.relative_to(ROOT))] = names
    return out


def test_nothing_under_controller_imports_the_console() -> None:
    modules = imports_of("controller")
    assert len(modules) > 50
    assert {m for m, names in modules.items() if "dashboard" in names} == set()


def test_pdctl_api_imports_neither_the_controller_nor_the_console() -> None:
    modules = imports_of("pdctl_api")
    assert set(modules) >= {"pdctl_api/schema/__init__.py", "pdctl_api/client.py"}
    assert {m: names & {"controller", "dashboard"} for m, names in modules.items()
            if names & {"controller", "dashboard"}} == {}
