"""What the console says about the hand-off decision, from tables: the cards, the alerts (the
controller's sentences, or our own from its flags), the decision mix per bucket (zeros from
an older controller), the latest decisions, and a pool's KV transfer mode as a change."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pandas as pd

from dashboard import changes, frames
from dashboard import handoff as ho
from pdctl_api.schema import (
    PARTS,
    HandoffPublic,
    PlannedAction,
    PoolPlanPublic,
    PoolSize,
    RequestPublic,
    Role,
    StatsPublic,
    TimeseriesPublic,
)
from tests.dashboard.fake import FakeController, make_records
from tests.dashboard.fake_handoff import REQUEST_FIELDS, with_handoff


def report(**fields: object) -> HandoffPublic:
    return HandoffPublic.model_validate({"policy": "slo", **fields})


def test_the_cards_of_a_window() -> None:
    cards = {c.label: c for c in ho.handoff_cards(report(
        decided_disaggregated=30, decided_local=10, served_disaggregated=27, no_prefill=2,
        fallback_requests=3, fallback_pairs=[{"prefill": "p1", "decode": "d1", "requests": 3}]))}
    assert (cards["Decided disaggregated"].value, cards["Decided disaggregated"].delta) == (
        "30", "75% of 40 decided")
    assert cards["Decided local"].delta == "25% of 40 decided"
    assert cards["Served disaggregated"].delta == "90% of decided"
    assert cards["No prefill instance"].value == "2"
    assert (cards["Silent KV fallbacks"].value, cards["Silent KV fallbacks"].delta) == (
        "3", "1 pair")
    empty = {c.label: c for c in ho.handoff_cards(report())}
    assert empty["Decided local"].delta == "n/a of 0 decided"
    assert empty["Served disaggregated"].delta == "none decided"


def test_alerts_are_the_controllers_sentences_or_ours_from_its_flags() -> None:
    said = report(alerts=["the prefill pool served none: why"], prefill_idle=True)
    assert ho.alerts_of(said) == ["the prefill pool served none: why"]
    flags = report(prefill_idle=True, fallback_requests=2)
    assert len(ho.alerts_of(flags)) == 2 and "silent fallback" in ho.alerts_of(flags)[1]
    assert ho.alerts_of(report(decided_local=5)) == []


def stats_with(handoff: dict[str, object] | None) -> StatsPublic:
    """The fake's ``/stats``, its ``handoff`` replaced."""
    get = httpx.Request("GET", "http://fake/api/v1/stats?window_s=300")
    return StatsPublic.model_validate({**FakeController().route(get, None),
                                       "handoff": handoff})


def timeseries(now: float, buckets: list[dict[str, Any]]) -> TimeseriesPublic:
    return TimeseriesPublic.model_validate({"window_s": 20, "step_s": 10, "now": now,
                                            "buckets": buckets})


def test_health_lines_and_incidents() -> None:
    s = stats_with({"policy": "threshold", "fallback_requests": 1,
                    "alerts": ["1 requests routed p -> d were computed on d: the KV never"]})
    assert ho.handoff_health_lines(s) == [
        "hand-off: 1 requests routed p -> d were computed on d (see Incidents)"]
    [incident] = ho.handoff_incidents(s, 123.0)
    assert (incident.at, incident.severity, incident.subject) == (123.0, "warning", "hand-off")
    assert incident.text.startswith("**Hand-off**: 1 requests routed")
    older = stats_with(None)
    assert ho.handoff_health_lines(older) == [] and ho.handoff_incidents(older, 1.0) == []
    assert ho.handoff_headline(older) is None


def test_decision_series_and_an_older_controllers_buckets() -> None:
    now = time.time()
    buckets: list[dict[str, Any]] = [
        {"t": now - 20 + k * 10, "requests": 3, "rate": 0.3, "ok": 3, "errors": 0,
         "disaggregated": 2, "colocated": 1, "decided_disaggregated": 2, "decided_local": 1,
         "ttft_ms": {"p50": 1, "p90": 1, "p99": 1, "mean": 1},
         "parts_mean_ms": dict.fromkeys(PARTS, 0.0),
         "kv_bytes": 0, "kv_bytes_per_s": 0, "transfer_gbps": 0} for k in range(2)]
    ts = timeseries(now, buckets)
    df = ho.decision_series(ts)
    assert list(df.columns) == ["time", "decision", "requests"]
    assert df.groupby("decision")["requests"].sum().to_dict() == {
        ho.DECIDED_DISAGG: 4, ho.DECIDED_LOCAL: 2}
    assert ho.has_decisions(ts)
    for b in buckets:
        del b["decided_disaggregated"], b["decided_local"]
    older = timeseries(now, buckets)
    assert not ho.has_decisions(older) and (ho.decision_series(older)["requests"] == 0).all()


def test_latest_decisions_newest_first_fallbacks_flagged() -> None:
    records = [RequestPublic.model_validate(r.public())
               for r in reversed(with_handoff(make_records(12), fallbacks=1))]
    latest = ho.latest_decisions(frames.requests_frame(records), 5)
    assert list(latest.columns) == list(ho.DECISION_TABLE)
    assert list(latest["id"]) == ["req-11", "req-10", "req-9", "req-8", "req-7"]
    assert list(latest["fallback"]) == ["⚠ fallback", "", "", "", ""]
    older = []
    for r in make_records(5):
        raw = r.public()
        for f in REQUEST_FIELDS:
            raw.pop(f)
        older.append(RequestPublic.model_validate(raw))
    assert ho.latest_decisions(frames.requests_frame(older)).empty
    assert ho.latest_decisions(pd.DataFrame()).empty


def test_a_kv_mode_change_is_requested_and_disruptive() -> None:
    assert changes.pool_request(1, 2, 1, 2, "pull", "pull") is None
    assert changes.pool_request(1, 2, 1, 2, "pull", "push") == changes.PoolRequest(
        size=None, tp=None, kv_mode="push")
    assert changes.pool_request(1, 2, 2, 2, "push") == changes.PoolRequest(size=2, tp=None)
    start = PlannedAction(kind="start", role=Role.DECODE, tp=2, kv_mode="push",
                          reason="KV push replacement (0/1)")
    plan = PoolPlanPublic(role=Role.DECODE, desired=PoolSize(size=1, tp=2, kv_mode="push"),
                          actions=[start])
    c = changes.pool_change(Role.DECODE, 1, 2, plan, "pull")
    assert c.disruptive and c.kv_mode == "push" and (c.size, c.tp) == (None, None)
    assert c.title == "decode pool: 1 x TP2 → 1 x TP2, KV pull → push"
    assert c.effects[0].startswith("KV transfer pull → push: like a TP change")
    assert c.effects[1] == "**start** a decode instance at TP 2 (KV push) — KV push " \
                           "replacement (0/1)"
    same = changes.pool_change(Role.DECODE, 1, 2, PoolPlanPublic(
        role=Role.DECODE, desired=PoolSize(size=2, tp=2), actions=[]), "pull")
    assert same.kv_mode is None and "KV" not in same.title
