"""Which changes are disruptive, and what the routing form sends."""

from __future__ import annotations

from dashboard import changes


def test_no_change_is_none() -> None:
    assert changes.pool_change("decode", 2, 2, 2, 2) is None


def test_scale_up_is_not_disruptive() -> None:
    c = changes.pool_change("decode", 1, 2, 3, 2)
    assert c is not None and not c.disruptive
    assert (c.size, c.tp) == (3, None)
    assert c.effects == ("starts 2 decode instance(s) at TP 2",)


def test_scale_down_and_tp_change_are_disruptive() -> None:
    down = changes.pool_change("prefill", 3, 4, 1, 4)
    assert down is not None and down.disruptive and "drains 2 prefill" in down.effects[0]
    tp = changes.pool_change("decode", 2, 2, 2, 4)
    assert tp is not None and tp.disruptive and (tp.size, tp.tp) == (None, 4)
    assert "replaces every decode instance" in tp.effects[0]


def test_drain_is_disruptive_and_only_ready_or_starting_can_drain() -> None:
    inst = {"id": "decode-3", "role": "decode", "state": "ready", "tp": 2,
            "load": {"inflight": 4}}
    d = changes.drain_change(inst)
    assert d.disruptive and d.instance_id == "decode-3" and "4 in-flight" in d.effects[0]
    states = ["ready", "starting", "draining", "failed", "stopped"]
    pool = [{"id": s, "state": s} for s in states]
    assert [i["id"] for i in changes.drainable(pool)] == ["ready", "starting"]


def test_routing_patch_has_only_changed_fields() -> None:
    current = {"prefill_policy": "round_robin", "decode_policy": "least_loaded",
               "disagg_min_prompt_tokens": 512, "transfer_alert_share": 0.2,
               "max_attempts": 3, "request_timeout_s": 600.0}
    same = {**current, "transfer_alert_share": 0.2 + 1e-12}
    assert changes.routing_patch(current, same) == {}
    wanted = {**current, "decode_policy": "round_robin", "transfer_alert_share": 0.3}
    assert changes.routing_patch(current, wanted) == {"decode_policy": "round_robin",
                                                      "transfer_alert_share": 0.3}
