"""What the console says about the prefix cache, from ``/api/v1/cache`` answers: the cards,
each instance's block index in words, the chart's series, and the Overview's banner lines and
incidents; and what a routing change to or from ``cache_aware`` says before it is sent."""

from __future__ import annotations

import time
from typing import Any

import altair as alt
import pytest

from dashboard import changes, charts
from dashboard import prefix_cache as pc
from pdctl_api.schema import CachePublic, KvIndexPublic, RoutingPublic

NOW = time.time()
STALE = ("the prefill pool routes cache_aware but 1 of 2 instances have no up-to-date KV "
         "index, routed by load: prefill-1: sequence gap not replayed")
DRIFT = ("the router predicted 12% of prompt tokens more cache hits than the engines "
         "reported: the block index disagrees with the engines")


def index(**kw: Any) -> dict[str, Any]:
    return {"watched": True, "healthy": True, "stale_reason": None, "blocks": 80,
            "events_per_s": 1.5, **kw}


def instance(iid: str, role: str, kv: dict[str, Any], hit: float | None = 0.5,
             predicted: float | None = 0.6) -> dict[str, Any]:
    return {"instance": iid, "role": role, "kv_index": kv, "requests": 10,
            "prompt_tokens": 1000, "predicted_tokens": None if predicted is None else 600,
            "reported_tokens": None if hit is None else 500, "hit_rate": hit,
            "predicted_hit_rate": predicted,
            "drift": None if hit is None or predicted is None else predicted - hit}


def answer(**kw: Any) -> CachePublic:
    body = {"requests": 20, "prompt_tokens": 2000, "predicted_tokens": 1200,
            "reported_tokens": 1000, "hit_rate": 0.5, "predicted_hit_rate": 0.6, "drift": 0.1,
            "window_s": 300.0, "end": NOW, "step_s": 5.0, "prefill_policy": "cache_aware",
            "decode_policy": "least_loaded", "tokens_saved": 1000,
            "decode_kv_bytes_saved": 2_000_000_000, "decode_kv_bytes_moved": 6_000_000_000,
            "warnings": [], "buckets": [
                {"t": NOW - 10, "hit_rate": 0.4, "predicted_hit_rate": 0.5, "drift": 0.1},
                {"t": NOW - 5, "hit_rate": None, "predicted_hit_rate": 0.7, "drift": None}],
            "instances": [
                instance("decode-2", "decode", index()),
                instance("prefill-1", "prefill", index(healthy=False,
                                                       stale_reason="sequence gap")),
                instance("prefill-3", "prefill", index(watched=False, healthy=False),
                         None, None)],
            **kw}
    return CachePublic.model_validate(body)


NOTHING: dict[str, Any] = {
    "requests": 0, "prompt_tokens": 0, "predicted_tokens": None, "reported_tokens": None,
    "hit_rate": None, "predicted_hit_rate": None, "drift": None, "tokens_saved": 0,
    "decode_kv_bytes_saved": 0, "decode_kv_bytes_moved": 0, "buckets": [], "instances": []}


def test_the_cards_show_reported_beside_predicted_savings_and_drift() -> None:
    cards = {c.label: c for c in pc.cache_cards(answer())}
    hit = cards["Prefix cache hit rate"]
    assert (hit.value, hit.delta) == ("50.0%", "predicted 60.0%")
    assert "2,000 prompt tokens of 20 requests" in (hit.help or "")
    assert (cards["Prompt tokens saved"].value, cards["Prompt tokens saved"].delta) == \
        ("1,000", "reported")
    kv = cards["Decode KV saved"]
    assert (kv.value, kv.delta) == ("2.00 GB", "moved 6.00 GB")
    assert "(25% of the prompts' KV)" in (kv.help or "")
    drift = cards["Prediction drift"]
    assert (drift.value, drift.delta) == ("+10.0%", "router expects more")


def test_without_reports_the_cards_say_so_and_savings_are_predicted() -> None:
    c = answer(reported_tokens=None, hit_rate=None, drift=None)
    cards = {c.label: c for c in pc.cache_cards(c)}
    assert cards["Prefix cache hit rate"].value == "not reported"
    assert cards["Prompt tokens saved"].delta == "predicted"
    assert (cards["Prediction drift"].value, cards["Prediction drift"].delta) == \
        ("n/a", "needs both numbers")


@pytest.mark.parametrize(("kv", "words"), [
    (index(), "healthy"),
    (index(healthy=False, stale_reason="sequence gap"),
     "stale: sequence gap (routed by load)"),
    (index(healthy=False, stale_reason="no events yet"), "no events yet (routed by load)"),
    (index(watched=False, healthy=False), "no events: publishes none (routed by load)"),
])
def test_each_index_state_in_words(kv: dict[str, Any], words: str) -> None:
    assert pc.index_state(KvIndexPublic.model_validate(kv)) == words


def test_the_table_puts_the_instances_routed_by_load_first() -> None:
    table = pc.cache_instances(answer())
    assert list(table.columns) == list(pc.CACHE_TABLE)
    assert list(table["instance"]) == ["prefill-1", "prefill-3", "decode-2"]
    assert list(table["index"])[0].startswith("stale: sequence gap")
    assert table["hit_rate"].isna().tolist() == [False, True, False]  # none reported: blank
    assert table.loc[2, "drift"] == pytest.approx(0.1)


def test_the_chart_series_leave_out_buckets_without_a_figure() -> None:
    series = pc.hit_rate_series(answer())
    assert list(zip(series["series"], series["value"], strict=True)) == [
        (pc.REPORTED, 0.4), (pc.PREDICTED, 0.5), (pc.PREDICTED, 0.7)]
    assert str(series["time"].dt.tz) == "UTC"
    spec = charts.hit_rates(series).to_dict()  # validated here, not on the page
    assert spec["encoding"]["y"]["axis"]["format"] == "%"
    assert isinstance(charts.hit_rates(series), alt.Chart)


def test_no_prediction_and_no_report_is_no_data() -> None:
    assert pc.has_cache_data(answer())
    empty = answer(**NOTHING)
    assert not pc.has_cache_data(empty)
    assert pc.cache_headline(empty) is None and pc.cache_headline(None) is None
    assert "no pool routes `cache_aware`" in pc.NO_CACHE_DATA


def test_the_warnings_turn_the_banner_amber_and_stand_in_the_strip() -> None:
    c = answer(warnings=[STALE, DRIFT])
    assert pc.cache_health_lines(c) == [
        "prefix cache: the prefill pool routes cache_aware but 1 of 2 instances have no "
        "up-to-date KV index, routed by load (see Incidents)",
        "prefix cache: the router predicted 12% of prompt tokens more cache hits than the "
        "engines reported (see Incidents)"]
    found = pc.cache_incidents(c)
    assert [(i.severity, i.subject, i.at) for i in found] == [("warning", "prefix cache", NOW)] * 2
    assert found[0].text == f"**Prefix cache**: {STALE}"
    assert pc.cache_incidents(answer()) == [] and pc.cache_health_lines(None) == []


def test_the_headline_reads_the_window_in_one_line() -> None:
    assert pc.cache_headline(answer()) == (
        "Prefix cache: hit rate 50.0% reported, 60.0% predicted · 1,000 prompt tokens saved "
        "· decode KV saved 2.00 GB · drift +10.0% (Pools has each instance)")


ROUTING = RoutingPublic(disagg_min_prompt_tokens=512, transfer_alert_share=0.2,
                        prefill_policy="round_robin", decode_policy="least_loaded",
                        max_attempts=3, request_timeout_s=600.0)


def test_a_pool_turned_cache_aware_is_told_what_that_does() -> None:
    patch = changes.routing_patch(ROUTING, {"prefill_policy": "cache_aware",
                                            "cache_load_limit": 8})
    assert patch == {"prefill_policy": "cache_aware", "cache_load_limit": 8}
    change = changes.routing_change(ROUTING, patch)
    assert not change.disruptive
    assert any("the prefill pool sends each prompt to the instance that holds its longest "
               "cached prefix" in e and "more than 8 requests above the least loaded" in e
               for e in change.effects), change.effects
    assert "routed by load" in " ".join(change.effects)


def test_leaving_cache_aware_and_an_unused_load_limit_are_said() -> None:
    aware = ROUTING.model_copy(update={"decode_policy": "cache_aware"})
    notes = changes.cache_notes(aware, {"decode_policy": "round_robin"})
    assert notes == ["the decode pool stops routing by prefix cache: prompts go round_robin, "
                     "wherever their prefix is cached"]
    assert changes.cache_notes(ROUTING, {"cache_load_limit": 2}) == [
        "`cache_load_limit` applies to a pool routed `cache_aware` only, and none is"]
    assert changes.cache_notes(aware, {"cache_load_limit": 2}) == []
