"""The hand-off decision on the pages: the Transfer page's section (the policy, the decision
mix, the mix over the range with its marks, the silent fallbacks per pair, the latest
decisions and why), the Overview's banner and incidents strip on a silent fallback or an idle
prefill pool, the request tables' decision columns, the hand-off policy and each pool's KV
transfer mode in the controls, and an older controller without any of it."""

from __future__ import annotations

import json
from typing import Any

from streamlit.testing.v1 import AppTest

from controller.models import Role
from tests.dashboard.fake import FakeController, make_records
from tests.dashboard.fake_handoff import idle_prefill, with_handoff
from tests.dashboard.page_helpers import (
    Console,
    by_label,
    chart_edges,
    chart_frames,
    frame_with,
    no_exceptions,
    texts,
)

FALLBACK = ("4 requests routed prefill-1 -> decode-2 were computed on decode-2: the KV never "
            "arrived (silent fallback)")
IDLE = ("the prefill pool served none of the 200 requests of the last 300 s that should have "
        "gone through it (200 found no ready prefill instance)")


def decision_charts(at: AppTest) -> list[Any]:
    return [c for c in at.get("vega_lite_chart") if "requests decided" in c.proto.spec]


def test_the_transfer_page_shows_the_hand_off(console: Console, fake: FakeController) -> None:
    fake.records = with_handoff(make_records(300), fallbacks=4)
    at = console(fake, "transfer")
    no_exceptions(at)
    assert "Hand-off" in [s.value for s in at.subheader]
    assert "policy `threshold`: disaggregated when the prompt has at least" in texts(at.caption)
    metrics = {m.label: m for m in at.metric}
    assert metrics["Decided disaggregated"].value == "200"
    assert metrics["Decided disaggregated"].proto.delta == "67% of 300 decided"
    assert metrics["Decided local"].value == "100"
    assert metrics["Served disaggregated"].value == "200"
    assert metrics["No prefill instance"].value == "0"
    assert metrics["Silent KV fallbacks"].value == "4"
    assert FALLBACK in texts(at.warning)
    [chart] = decision_charts(at)
    start, end = chart_edges(chart)
    assert 299 <= end - start <= 301  # over the range's whole axis
    drawn = next(df for df in chart_frames(chart) if "decision" in df)
    assert set(drawn["decision"]) == {"decided disaggregated", "decided local"}
    assert drawn.groupby("decision")["requests"].sum().to_dict() == {
        "decided disaggregated": 200, "decided local": 100}
    assert any("change" in set(df.get("kind", [])) for df in chart_frames(chart))  # marked
    pairs = frame_with(at, "decode")
    assert pairs.to_dict("records") == [{"prefill": "prefill-1", "decode": "decode-2",
                                         "requests": 4}]
    latest = frame_with(at, "decision_reason")
    assert len(latest) == 10 and latest["id"].iloc[0] == "req-299"  # newest first
    assert latest["decision"].iloc[0] == "disaggregated"
    assert latest["decision_reason"].iloc[0] == "threshold: 1,100 prompt tokens >= 512"
    assert list(latest["fallback"][:4]) == ["⚠ fallback", "⚠ fallback", "", "⚠ fallback"]
    assert set(latest[latest["decision"] == "local"]["decision_reason"]) == {
        "threshold: 20 prompt tokens < 512"}


def test_a_silent_fallback_is_seen_at_a_glance(console: Console, fake: FakeController) -> None:
    fake.records = with_handoff(make_records(300), fallbacks=4)
    at = console(fake)
    no_exceptions(at)
    assert not at.success  # not "Healthy"
    banner = texts(at.warning)
    assert "**Watch**" in banner
    assert ("hand-off: 4 requests routed prefill-1 -> decode-2 were computed on decode-2 "
            "(see Incidents)") in banner
    assert f"**Hand-off**: {FALLBACK}" in texts(at.markdown)
    assert ("Hand-off (`threshold`): 67% decided disaggregated, 33% local of 300 · 200 served "
            "disaggregated · 4 silent KV fallbacks") in texts(at.caption)


def test_an_idle_prefill_pool_is_seen_at_a_glance(console: Console,
                                                  fake: FakeController) -> None:
    fake.records = idle_prefill(make_records(300))
    at = console(fake)
    no_exceptions(at)
    assert f"hand-off: {IDLE} (see Incidents)" in texts(at.warning)
    assert f"**Hand-off**: {IDLE}" in texts(at.markdown)
    transfer = console(fake, "transfer")
    metrics = {m.label: m.value for m in transfer.metric}
    assert (metrics["Decided disaggregated"], metrics["Decided local"]) == ("0", "300")
    assert (metrics["Served disaggregated"], metrics["No prefill instance"]) == ("0", "200")
    assert IDLE in texts(transfer.warning)


def test_without_an_alert_the_overview_stays_healthy(console: Console,
                                                     fake: FakeController) -> None:
    fake.records = with_handoff(make_records(300))
    at = console(fake)
    no_exceptions(at)
    assert "Hand-off" not in texts(at.markdown) and "hand-off:" not in texts(at.warning)


def test_the_request_tables_carry_the_decision(console: Console,
                                               fake: FakeController) -> None:
    fake.records = with_handoff(make_records(30), fallbacks=1)
    at = console(fake)
    by_label(at.text_input, "Find a request by id").set_value("req-29")
    by_label(at.button, "Find").click()
    at.run()
    no_exceptions(at)
    table = frame_with(at, "kv_fallback")
    row = table.iloc[0].to_dict()
    assert (row["id"], row["decision"], row["kv_fallback"]) == (
        "req-29", "disaggregated", "⚠ fallback")
    assert row["decision_reason"] == "threshold: 700 prompt tokens >= 512"
    assert ("decided disaggregated (threshold: 700 prompt tokens >= 512) · **silent KV "
            "fallback**") in texts(at.markdown)


def test_the_hand_off_policy_is_reviewed_then_sent(console: Console,
                                                   fake: FakeController) -> None:
    at = console(fake, "controls")
    policy = by_label(at.selectbox, "hand-off policy")
    assert policy.options == ["threshold", "slo"] and policy.value == "threshold"
    policy.set_value("slo")
    by_label(at.button, "Review routing change").click()
    at.run()
    no_exceptions(at)
    assert fake.changes() == [], "nothing is sent before the operator confirms"
    assert "Confirm — routing: " in texts(at.info)
    assert "hand-off `slo`: each request goes disaggregated only when" in texts(at.markdown)
    at.button(key="confirm-routing").click().run()
    assert fake.changes() == [("PATCH", "/api/v1/routing", {"disagg_policy": "slo"})]
    assert fake.routing["disagg_policy"] == "slo"
    assert "routing updated: disagg_policy=slo" in texts(at.toast)


def test_a_kv_mode_change_is_reviewed_like_a_tp_change(console: Console,
                                                       fake: FakeController) -> None:
    at = console(fake, "controls")
    assert "**decode** · desired 1 x TP2 · KV pull · converged" in texts(at.markdown)
    mode = by_label(at.selectbox, "decode KV transfer")
    assert mode.options == ["pull", "push"] and mode.value == "pull"
    mode.set_value("push")
    by_label(at.button, "Review decode change").click()
    at.run()
    no_exceptions(at)
    assert fake.dry_runs()[-1] == ("PATCH", "/api/v1/pools/decode?dry_run=true",
                                   {"kv_mode": "push"})
    assert fake.changes() == []
    warning = texts(at.warning)
    assert "Confirm a disruptive change — decode pool: 1 x TP2 → 1 x TP2, KV pull → push" \
        in warning
    shown = texts(at.markdown)
    assert "KV transfer pull → push: like a TP change, every decode instance is drained" in shown
    assert "**start** a decode instance at TP 2 (KV push)" in shown
    at.button(key="confirm-decode").click().run()
    assert fake.changes() == [("PATCH", "/api/v1/pools/decode", {"kv_mode": "push"})]
    assert fake.targets[Role.DECODE].kv_mode == "push"
    assert by_label(at.selectbox, "decode KV transfer").value == "push"


def test_the_pools_page_shows_each_kv_mode(console: Console, fake: FakeController) -> None:
    at = console(fake, "pools")
    no_exceptions(at)
    assert "**Decode pool** · TP 2 · KV pull · converged" in texts(at.markdown)
    assert set(frame_with(at, "kv_mode")["kv_mode"]) == {"pull"}


def test_an_older_controller_without_hand_off(console: Console, fake: FakeController) -> None:
    fake.records = with_handoff(make_records(300), fallbacks=4)
    fake.legacy = True
    for page in (None, "transfer", "controls", "pools"):
        at = console(fake, page)
        no_exceptions(at)
        assert not at.error
        assert "hand-off" not in texts(at.warning).lower()
    transfer = console(fake, "transfer")
    assert "does not report its hand-off decisions" in texts(transfer.caption)
    assert not decision_charts(transfer)
    controls = console(fake, "controls")
    labels = [s.label for s in controls.selectbox]
    assert "hand-off policy" not in labels and "decode KV transfer" not in labels
    overview = console(fake)
    by_label(overview.text_input, "Find a request by id").set_value("req-299")
    by_label(overview.button, "Find").click()
    overview.run()
    row = frame_with(overview, "kv_fallback").iloc[0].to_dict()
    assert (row["decision"], row["decision_reason"], row["kv_fallback"]) == ("", "", "")


def test_the_decision_chart_is_json(console: Console, fake: FakeController) -> None:
    fake.records = with_handoff(make_records(60))
    [chart] = decision_charts(console(fake, "transfer"))
    assert json.loads(chart.proto.spec)["layer"]  # the chart, its marks and its edges
