"""What a change will do before it is sent: pool changes as the controller's plan, which
changes are disruptive, and what the routing form sends."""

from __future__ import annotations

from dashboard import changes
from pdctl_api.schema import (
    InstancePublic,
    InstanceState,
    PlannedAction,
    PoolPlanPublic,
    PoolSize,
    Role,
    RoutingPublic,
)
from tests.dashboard.fake import FakeController, make_instances


def plan(size: int, tp: int, *actions: PlannedAction) -> PoolPlanPublic:
    return PoolPlanPublic(role=Role.DECODE, desired=PoolSize(size=size, tp=tp),
                          actions=list(actions))


def test_only_what_differs_is_requested() -> None:
    assert changes.pool_request(2, 2, 2, 2) is None
    assert changes.pool_request(1, 2, 3, 2) == changes.PoolRequest(size=3, tp=None)
    assert changes.pool_request(2, 2, 2, 4) == changes.PoolRequest(size=None, tp=4)


def test_scale_up_shows_the_planned_starts_and_is_not_disruptive() -> None:
    start = PlannedAction(kind="start", role=Role.DECODE, tp=2,
                          reason="decode pool below size (1/3)")
    c = changes.pool_change(Role.DECODE, 1, 2, plan(3, 2, start, start))
    assert not c.disruptive and (c.size, c.tp) == (3, None)
    assert c.title == "decode pool: 1 x TP2 → 3 x TP2"
    assert c.effects == ("**start** a decode instance at TP 2 — decode pool below size (1/3)",) * 2


def test_scale_down_and_tp_change_are_disruptive() -> None:
    drain = PlannedAction(kind="drain", instance_id="decode-3", reason="scale decode down to 1")
    down = changes.pool_change(Role.DECODE, 3, 2, plan(1, 2, drain))
    assert down.disruptive and "**drain** decode-3" in down.effects[0]
    assert down.effects[0].endswith("scale decode down to 1")
    start = PlannedAction(kind="start", role=Role.DECODE, tp=4,
                          reason="TP 4 replacement (0/2)")
    tp = changes.pool_change(Role.DECODE, 2, 2, plan(2, 4, start))
    assert tp.disruptive and (tp.size, tp.tp) == (None, 4)
    stop = PlannedAction(kind="stop", instance_id="decode-9", reason="drained")
    assert changes.pool_change(Role.DECODE, 2, 2, plan(3, 2, stop)).disruptive


def test_an_empty_plan_says_so() -> None:
    c = changes.pool_change(Role.DECODE, 1, 2, plan(2, 2))
    assert c.effects == (changes.NOTHING_PLANNED,)


def test_the_fakes_plan_is_the_planners() -> None:
    fake = FakeController(instances=make_instances(1, 2))
    p = PoolPlanPublic.model_validate(fake.plan_pool(Role.DECODE, {"size": 1}))
    assert [(a.kind, a.instance_id) for a in p.actions] == [("drain", "decode-2")]


def test_drain_is_disruptive_and_only_ready_or_starting_can_drain() -> None:
    fake = FakeController(instances=make_instances(0, 3))
    inst = InstancePublic.model_validate(fake.instance_view(fake.instances[2]))
    d = changes.drain_change(inst)
    assert d.disruptive and d.instance_id == "decode-3" and "3 in-flight" in d.effects[0]
    assert d.title == "drain decode-3 (decode, ready, TP 2)"
    assert d.effects[0].endswith("finish, then it stops")
    held = inst.model_copy(update={"load": inst.load.model_copy(update={"kv_handles_out": 2})})
    assert "the 2 KV handle(s) it gave out are read or expire" in \
        changes.drain_change(held).effects[0]
    states = ["ready", "starting", "draining", "failed", "stopped"]
    pool = [inst.model_copy(update={"id": s, "state": InstanceState(s)}) for s in states]
    assert [i.id for i in changes.drainable(pool)] == ["ready", "starting"]


def test_routing_patch_has_only_changed_fields() -> None:
    current = RoutingPublic(prefill_policy="round_robin", decode_policy="least_loaded",
                            disagg_min_prompt_tokens=512, transfer_alert_share=0.2,
                            max_attempts=3, request_timeout_s=600.0)
    same = {**current.model_dump(), "transfer_alert_share": 0.2 + 1e-12}
    assert changes.routing_patch(current, same) == {}
    wanted = {**current.model_dump(), "decode_policy": "round_robin",
              "transfer_alert_share": 0.3}
    assert changes.routing_patch(current, wanted) == {"decode_policy": "round_robin",
                                                      "transfer_alert_share": 0.3}


def test_routing_change_lists_fields_previews_a_threshold_and_marks_tightening() -> None:
    current = RoutingPublic(prefill_policy="round_robin", decode_policy="least_loaded",
                            disagg_min_prompt_tokens=512, transfer_alert_share=0.2,
                            max_attempts=3, request_timeout_s=600.0, max_inflight=1024)
    prompts = [100, 600, 700, 900, 2000]
    up = changes.routing_change(current, {"disagg_min_prompt_tokens": 1000}, prompts)
    assert up.kind == "routing" and not up.disruptive
    assert up.patch == (("disagg_min_prompt_tokens", 1000),)
    assert up.effects[0] == "`disagg_min_prompt_tokens`: 512 → 1000"
    assert up.effects[1] == ("of the last 5 requests, 3 (60%) had prompts of 512-999 tokens: "
                             "they would have gone colocated instead of disaggregated")
    down = changes.routing_change(current, {"disagg_min_prompt_tokens": 100}, prompts)
    assert "1 (20%) had prompts of 100-511 tokens" in down.effects[1]
    assert "disaggregated instead of colocated" in down.effects[1]
    assert "no recent requests" in changes.routing_change(
        current, {"disagg_min_prompt_tokens": 100}, []).effects[1]
    # A limit that tightens refuses or cuts requests: disruptive; loosening or lifting is not.
    assert changes.routing_change(current, {"max_inflight": 64}).disruptive
    assert changes.routing_change(current, {"request_timeout_s": 30.0}).disruptive
    assert changes.routing_change(current, {"prefill_max_inflight": 4}).disruptive  # 0 -> 4
    assert not changes.routing_change(current, {"max_inflight": 0}).disruptive
    assert not changes.routing_change(current, {"max_inflight": 4096}).disruptive
    assert not changes.routing_change(current, {"decode_policy": "round_robin"}).disruptive
