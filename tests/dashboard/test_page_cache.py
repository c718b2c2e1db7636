"""The prefix cache on the pages (``/api/v1/cache``): the Pools page's section (cards, the hit
rate over the range with its marks, each instance's KV index), the Overview's banner and
incidents strip when a cache_aware pool is routed by load, the Transfer page's decode KV
saved, one line instead of empty charts without figures, and ``cache_aware`` with its load
limit in the routing controls."""

from __future__ import annotations

import json
from typing import Any

from streamlit.testing.v1 import AppTest

from controller.kvevents.hub import IndexState
from tests.dashboard.fake import FakeController, index_health, make_records, with_cache
from tests.dashboard.page_helpers import (
    Console,
    by_label,
    chart_edges,
    chart_frames,
    frame_with,
    marks,
    no_exceptions,
    texts,
)

STALE = "sequence gap not replayed"


def hit_rate_charts(at: AppTest) -> list[Any]:
    return [c for c in at.get("vega_lite_chart") if "prefix cache hit rate" in c.proto.spec]


def stale_prefill(fake: FakeController) -> None:
    """The prefill pool routes cache_aware, its one instance's index is stale."""
    fake.routing["prefill_policy"] = "cache_aware"
    fake.kv_index = [IndexState("prefill-1", True, index_health("prefill-1", STALE)),
                     IndexState("decode-2", False, None)]


def test_the_pools_page_shows_the_prefix_cache(console: Console,
                                               fake: FakeController) -> None:
    fake.records = with_cache(make_records(300))
    at = console(fake, "pools")
    no_exceptions(at)
    assert "Prefix cache" in [s.value for s in at.subheader]
    metrics = {m.label: m for m in at.metric}
    assert metrics["Prefix cache hit rate"].value == "40.0%"
    assert metrics["Prefix cache hit rate"].proto.delta == "predicted 45.0%"
    assert metrics["Prompt tokens saved"].value == "72,800"
    assert metrics["Decode KV saved"].proto.delta.startswith("moved ")
    assert metrics["Prediction drift"].value == "+5.0%"
    [chart] = hit_rate_charts(at)
    spec = json.loads(chart.proto.spec)
    assert {"type": "point", "opacity": 0} in marks(spec)  # over the range's whole axis
    start, end = chart_edges(chart)
    assert 299 <= end - start <= 301
    drawn = [df for df in chart_frames(chart) if "series" in df]
    assert {"reported (engines)", "predicted (router)"} <= set(drawn[0]["series"])
    assert any("change" in set(df.get("kind", [])) for df in chart_frames(chart))  # marked
    table = frame_with(at, "predicted_hit_rate")
    assert list(table["instance"]) == ["prefill-1", "decode-2"]
    assert set(table["index"]) == {"healthy"}
    assert "routing: prefill `round_robin`, decode `least_loaded`" in texts(at.caption)


def test_without_predictions_or_reports_one_line_and_no_chart(console: Console,
                                                              fake: FakeController) -> None:
    at = console(fake, "pools")  # the fake's records carry no cache numbers
    no_exceptions(at)
    assert "No prefix-cache figures in the last 300 s" in texts(at.info)
    assert not hit_rate_charts(at)
    assert len(at.get("vega_lite_chart")) == 3  # the grid and the two pools' load
    assert "Prefix cache hit rate" not in [m.label for m in at.metric]
    assert set(frame_with(at, "predicted_hit_rate")["index"]) == {"healthy"}  # still listed


def test_a_cache_aware_pool_routed_by_load_is_seen_at_a_glance(console: Console,
                                                                fake: FakeController) -> None:
    fake.records = with_cache(make_records(300))
    stale_prefill(fake)
    at = console(fake)
    no_exceptions(at)
    assert not at.success  # not "Healthy"
    banner = texts(at.warning)
    assert "**Watch**" in banner
    assert ("prefix cache: the prefill pool routes cache_aware but 1 of 1 instances have no "
            "up-to-date KV index, routed by load (see Incidents)") in banner
    strip = texts(at.markdown)
    assert "**Prefix cache**: the prefill pool routes cache_aware" in strip
    assert f"prefill-1: {STALE}" in strip
    assert "Prefix cache: hit rate 40.0% reported, 45.0% predicted" in texts(at.caption)
    pools = console(fake, "pools")
    assert f"prefill-1: {STALE}" in texts(pools.warning)
    table = frame_with(pools, "predicted_hit_rate")
    assert list(table["index"]) == [f"stale: {STALE} (routed by load)",
                                    "no events: publishes none (routed by load)"]


def test_the_transfer_page_says_what_decode_did_not_pull(console: Console,
                                                         fake: FakeController) -> None:
    at = console(fake, "transfer")
    assert "Decode prefix hits" not in texts(at.caption)  # no figures: nothing said
    fake.records = with_cache(make_records(300))
    at = console(fake, "transfer")
    no_exceptions(at)
    line = texts(at.caption)
    assert "Decode prefix hits: " in line and "of KV not pulled" in line
    assert "(23% of the prompts' KV)" in line


def test_an_older_controller_without_the_route(console: Console,
                                               fake: FakeController) -> None:
    fake.legacy = True
    at = console(fake, "pools")
    no_exceptions(at)
    assert not at.error
    assert "does not answer `/api/v1/cache`" in texts(at.caption)


def test_cache_aware_and_its_load_limit_are_reviewed_then_sent(console: Console,
                                                               fake: FakeController) -> None:
    at = console(fake, "controls")
    policy = by_label(at.selectbox, "prefill policy")
    assert "cache_aware" in policy.options and "cache_aware" in by_label(
        at.selectbox, "decode policy").options
    limit = by_label(at.number_input,
                     "cache_aware load limit (requests above the least loaded)")
    assert limit.value == 4  # the controller's default when it sends none
    policy.set_value("cache_aware")
    limit.set_value(8)
    by_label(at.button, "Review routing change").click()
    at.run()
    no_exceptions(at)
    assert fake.changes() == [], "nothing is sent before the operator confirms"
    assert "more than 8 requests above the least loaded" in texts(at.markdown)
    at.button(key="confirm-routing").click().run()
    assert fake.changes() == [("PATCH", "/api/v1/routing",
                               {"prefill_policy": "cache_aware", "cache_load_limit": 8})]
    assert fake.routing["prefill_policy"] == "cache_aware"
    assert "routing updated" in texts(at.toast)
