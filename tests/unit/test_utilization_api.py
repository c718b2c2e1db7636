"""``GET /api/v1/utilization`` through the real app (``api_app``): the answer is its model,
each instance's capacity comes from the planner's profile of its TP (and says so), the polls
are the fleet's, the client reads it, and bad queries are refused like ``/timeseries``'s."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from controller.api import create_app
from controller.api.state import AppState
from controller.config import load_settings
from controller.models import Instance, Role
from pdctl_api.schema import UtilizationPublic
from tests.unit.api_app import NoLauncher, app_state, client_of

__all__ = ["app_state"]  # the fixture


def polled(st: AppState, seconds: int = 30) -> None:
    """The fleet's instances polled once a second for the last ``seconds``."""
    now = time.time()
    for k in range(seconds):
        st.fleet.load_history.record(list(st.fleet.registry), at=now - seconds + k)


def test_the_answer_is_its_model_with_the_profiles_capacity(
        app_state: tuple[TestClient, AppState]) -> None:
    tc, st = app_state
    polled(st)
    r = tc.get("/api/v1/utilization", params={"window_s": 60, "step_s": 10})
    assert r.status_code == 200, r.text
    u = UtilizationPublic.model_validate(r.json())
    assert u.model_dump(mode="json") == r.json()
    assert len(u.t) == 6 and u.t[1] - u.t[0] == 10 and u.clock == "wall"
    by_id = {i.id: i for i in u.instances}
    assert sorted(by_id) == ["decode-2", "prefill-1"]
    prefill, decode = by_id["prefill-1"], by_id["decode-2"]
    assert (prefill.tp, prefill.state) == (4, "ready")
    assert prefill.capacity.profile == "sim-llama-3-70b-h100-sxm-tp4"
    assert prefill.capacity.basis.startswith(
        "profile sim-llama-3-70b-h100-sxm-tp4: ") and "at 700-token prompts" \
        in prefill.capacity.basis  # the window's four disaggregated 700-token prompts
    assert decode.capacity.profile == "sim-llama-3-70b-h100-sxm-tp2"
    assert decode.capacity.output_tokens_per_s is not None
    assert f"within the {st.planner.live.itl_ms:,.0f} ms target" in decode.capacity.basis
    assert decode.series.running[-1] == 2.0 and decode.series.kv_cache_usage[-1] == 0.25
    assert decode.series.running[:2] == [None, None]  # before the first poll
    pool = u.pools[Role.PREFILL]
    assert pool.work == "prompt" and pool.window.running == 2.0
    assert pool.capacity_tokens_per_s[-1] == prefill.capacity.prompt_tokens_per_s
    prompt = sum(x or 0.0 for x in prefill.series.prompt_tokens_per_s) * 10
    assert prompt == pytest.approx(4 * 700)  # four disaggregated prompts of 700 tokens


def test_the_client_reads_it_and_an_ended_window_has_nothing(
        app_state: tuple[TestClient, AppState]) -> None:
    tc, st = app_state
    polled(st)
    with client_of(tc, st) as c:
        u = c.utilization(60, 10)
        assert {i.id for i in u.instances} == {"prefill-1", "decode-2"}
        past = c.utilization(60, 10, end=1000.0)
        assert past.now == 1000.0 and past.instances == []
        assert past.pools[Role.DECODE].series.utilization == [None] * 6


@pytest.mark.parametrize("query", [
    {"window_s": 3600, "step_s": 1},  # 3,600 buckets
    {"window_s": 60, "step_s": 0}, {"window_s": -1}, {"window_s": 86_401},
    {"step_s": 3601}, {"end": -1}, {"end": "soon"}, {"window": 60},
])
def test_bad_queries_are_refused(app_state: tuple[TestClient, AppState],
                                 query: dict[str, object]) -> None:
    tc, _ = app_state
    r = tc.get("/api/v1/utilization", params=query)
    assert r.status_code == 422, r.text
    assert r.json()["field"]


def test_a_profile_missing_is_no_capacity_with_the_reason(tmp_path: Path) -> None:
    """A TP no shipped profile covers (the 70B at TP 3 does not exist): capacity null, and
    why, never a made-up one; a scaled simulation answers in modelled time."""
    settings = load_settings(None, controller={"state_dir": tmp_path}, sim={"time_scale": 4})
    app = create_app(settings, NoLauncher())
    st: AppState = app.state.pdctl
    inst = Instance("decode-7", Role.DECODE, 3, "http://e7", kv_usage=0.5)
    st.fleet.registry.add(inst, "test")
    polled(st, 5)
    tc = TestClient(app, headers={"Authorization": f"Bearer {st.token}"})  # no lifespan
    body = tc.get("/api/v1/utilization", params={"window_s": 60, "step_s": 10}).json()
    tc.close()
    st.store.close()
    [line] = body["instances"]
    assert line["capacity"]["output_tokens_per_s"] is None
    assert "no performance profile sim-llama-3-70b-h100-sxm-tp3" in line["capacity"]["reason"]
    assert line["series"]["utilization"] == [None] * 6
    assert body["pools"]["decode"]["reason"].startswith("no instance of it has a capacity")
    assert (body["clock"], body["time_scale"]) == ("modelled", 4.0)
