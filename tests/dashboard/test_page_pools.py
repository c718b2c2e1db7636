"""The Pools page: every instance, a quarantined pool, and an instance opened: its requests
(their TTFT p50 the Overview's), its drain after review."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from controller.fleet.history import LoadSamples
from controller.models import InstanceState
from tests.dashboard.fake import FakeController, make_instances, make_records
from tests.dashboard.page_helpers import (
    Console,
    by_label,
    chart_edges,
    chart_frames,
    no_exceptions,
    quarantine_decode,
    texts,
)


def test_pools_page_lists_every_instance(console: Console, fake: FakeController) -> None:
    fake.instances = make_instances(40, 80)
    at = console(fake, "pools")
    table = at.dataframe[0].value
    assert len(table) == 120
    assert set(table["role"]) == {"prefill", "decode"}
    assert "120 of 120 instances" in texts(at.caption)


def test_an_instance_opens_with_its_requests_and_drains_after_review(
        console: Console, fake: FakeController) -> None:
    fake.instances = make_instances(1, 2)  # prefill-1, decode-2, decode-3 (no request)
    at = console(fake, "pools")
    by_label(at.selectbox, "instance").set_value("decode-2").run()
    no_exceptions(at)
    assert "**Its requests** (among all 300 requests in the last 300 s)" in texts(at.markdown)
    assert by_label(at.metric, "Requests").value == "300"  # every fake request's decode hop
    assert "engine log line of decode-2" in texts(at.code)
    by_label(at.button, "Review drain (restart)").click().run()
    assert "drain decode-2" in texts(at.warning) and fake.changes() == []  # reviewed, not sent
    by_label(at.button, "Confirm change").click().run()
    no_exceptions(at)
    assert fake.changes() == [("POST", "/api/v1/instances/decode-2/drain", None)]
    by_label(at.selectbox, "instance").set_value("decode-3").run()
    assert "No request went through decode-3" in texts(at.info)


def test_an_instance_s_requests_say_what_span_they_cover(console: Console,
                                                         fake: FakeController) -> None:
    """The drill-down read the newest 500 requests of the window and called them the
    window's: 600 requests in 300 s read as 600 of 300 s where they covered half of it."""
    now = time.time()
    fake.records = make_records(300, now=now - 150) + make_records(300, now=now)
    at = console(fake, "pools")
    by_label(at.selectbox, "instance").set_value("decode-2").run()
    no_exceptions(at)
    assert "(among the newest 500 of the 600 requests in the last 300 s: those since" in \
        texts(at.markdown)


def test_a_viewer_opens_an_instance_and_is_offered_no_drain(console: Console,
                                                            fake: FakeController) -> None:
    fake.viewer = True
    at = console(fake, "pools")
    by_label(at.selectbox, "instance").set_value("prefill-1").run()
    no_exceptions(at)
    assert by_label(at.metric, "Requests").value == "200"
    assert not [b for b in at.button if b.label.startswith("Review drain")]


def test_pools_page_shows_the_quarantine(console: Console, fake: FakeController) -> None:
    quarantine_decode(fake)
    at = console(fake, "pools")
    no_exceptions(at)
    assert len(at.error) == 1
    box = at.error[0].value
    assert "Decode pool quarantined" in box and "3 crashes" in box
    assert re.search(r"for another 1 min( \d+ s)?\.", box)  # 95 s, less the test's time
    assert "Last error: `process exited with status -4 (SIGILL)`" in box
    assert "quarantined" in texts(at.markdown)


def test_pools_page_has_no_quarantine_box_when_none_is_set(console: Console,
                                                           fake: FakeController) -> None:
    quarantine_decode(fake, remaining_s=-1.0)  # ran out: the controller sends null
    at = console(fake, "pools")
    no_exceptions(at)
    assert not at.error
    assert "quarantined" not in texts(at.markdown)


def test_the_instance_drill_down_and_the_overview_agree_on_ttft_p50(
        console: Console, fake: FakeController) -> None:
    """The same requests, the same TTFT p50: the project's one percentile (nearest rank,
    ``pdctl_api.stats``), not pandas' interpolation, which reads 25.0 ms for these four."""
    fake.records = make_records(4)  # each through decode-2
    for record, ttft in zip(fake.records, (40.0, 10.0, 30.0, 20.0), strict=True):
        record.ttft_ms = ttft
    overview = by_label(console(fake).metric, "TTFT p50").value
    at = console(fake, "pools")
    by_label(at.selectbox, "instance").set_value("decode-2").run()
    no_exceptions(at)
    assert by_label(at.metric, "Requests").value == "4"
    assert by_label(at.metric, "TTFT p50").value == overview == "20.0 ms"


# ---- load against capacity (/api/v1/utilization) -------------------------------------------


def lines_of(at: AppTest) -> dict[str, pd.DataFrame]:
    """The instance lines (``series``) of every load chart on the page, by series name."""
    out: dict[str, pd.DataFrame] = {}
    for chart in at.get("vega_lite_chart"):
        for df in chart_frames(chart):
            if {"series", "value", "time"} <= set(df.columns):
                for name, rows in df.groupby("series"):
                    out[str(name)] = pd.concat([out.get(str(name), rows.iloc[:0]), rows])
    return out


def replaced(fake: FakeController) -> None:
    """decode-2 served the first half of the last 5 minutes and stopped; decode-3, its
    replacement, the second half."""
    fake.instances = make_instances(1, 2)  # prefill-1, decode-2, decode-3
    fake.instances[1].state = InstanceState.STOPPED
    now = time.time()
    fake.load_samples = LoadSamples.of(
        [(now - 300 + t, "decode-2", 4.0, 1.0, 0.6) for t in range(0, 150, 2)]
        + [(now - 150 + t, "decode-3", 2.0, 0.0, 0.3) for t in range(0, 150, 2)]
        + [(now - 300 + t, "prefill-1", 1.0, 0.0, 0.1) for t in range(0, 300, 2)])


def test_a_replaced_decode_instance_is_a_line_of_its_own(console: Console,
                                                         fake: FakeController) -> None:
    """Summed per role (the old Prometheus chart) a replacement is invisible: here each
    instance has its line, the old one stops where the new one starts; the chart spans the
    page's window."""
    replaced(fake)
    at = console(fake, "pools")
    no_exceptions(at)
    by_label(at.get("segmented_control"), "Show").set_value("Running").run()
    lines = lines_of(at)
    assert {"decode-2", "decode-3", "prefill-1", "pool"} <= set(lines)
    old, new = lines["decode-2"], lines["decode-3"]
    assert set(old["value"]) == {4.0} and set(new["value"]) == {2.0}
    # It stops where its replacement starts (the bucket of the swap holds both).
    assert old["time"].max() <= new["time"].min() and old["time"].max() < new["time"].max()
    timed = [c for c in at.get("vega_lite_chart") if '"series"' in c.proto.spec]
    start, end = chart_edges(timed[0])
    assert end - start == pytest.approx(300.0) and abs(end - time.time()) < 30


def test_the_pool_card_shows_utilization_over_the_window_from_the_api(
        console: Console, fake: FakeController) -> None:
    """Not "busy" (the share of instances with a request in flight at the instant of the
    read, 0 % or 100 % at the same load): tokens over the profiled capacity."""
    fake.instances = make_instances(1, 1)
    at = console(fake, "pools")
    no_exceptions(at)
    [call] = [c for c in fake.calls if c[1] == "/api/v1/utilization"]  # one read, every chart
    u = fake.utilization(300.0, 5.0, time.time())
    decode = u["pools"]["decode"]["window"]["utilization"]
    assert decode is not None and 0 < decode < 1
    cards = [m for m in at.metric if m.label == "Utilization"]
    assert [m.value for m in cards] == [f"{u['pools'][r]['window']['utilization']:.0%}"
                                        for r in ("prefill", "decode")]
    bars = " ".join(str(p.proto) for p in at.get("progress"))
    assert "busy" not in bars and "of capacity in the last 300 s" in bars
    assert "profile sim-llama-3-70b-h100-sxm-tp2" in cards[1].help
    assert by_label(at.metric, "Prompt tokens / s").value != "—"
    assert by_label(at.metric, "Output tokens / s").value != "—"


def test_a_pool_without_a_profile_says_why_instead_of_a_number(
        console: Console, fake: FakeController) -> None:
    fake.instances = make_instances(1, 1, decode_tp=3)  # no profile at TP 3
    at = console(fake, "pools")
    no_exceptions(at)
    assert [m.value for m in at.metric if m.label == "Utilization"][1] == "—"
    assert ("No utilization: no instance of it has a capacity: no performance profile "
            "sim-llama-3-70b-h100-sxm-tp3") in texts(at.caption)


def percent_formats(spec: Any) -> list[str]:
    """Every ``format`` of a Vega-Lite spec's axes, legends and tooltips."""
    if isinstance(spec, dict):
        here = [v for k, v in spec.items() if k == "format" and isinstance(v, str)]
        return here + [f for v in spec.values() for f in percent_formats(v)]
    if isinstance(spec, list):
        return [f for v in spec for f in percent_formats(v)]
    return []


def test_kv_cache_and_utilization_read_as_percents_everywhere(
        console: Console, fake: FakeController) -> None:
    """The grid's legend read 0-1 while the table said 45 %: now percents in the legend, the
    charts' axes and tooltips, the cards and the drill-down."""
    replaced(fake)
    at = console(fake, "pools")
    grid = next(c for c in at.get("vega_lite_chart") if '"rect"' in c.proto.spec)
    legend = json.loads(grid.proto.spec)["spec"]["encoding"]["color"]["legend"]
    assert legend["format"] == ".0%"
    assert by_label(at.metric, "KV cache").value.endswith("%")
    for choice in ("Utilization %", "KV cache %"):
        by_label(at.get("segmented_control"), "Show").set_value(choice).run()
        specs = [json.loads(c.proto.spec) for c in at.get("vega_lite_chart")
                 if '"series"' in c.proto.spec]
        assert specs and all({".0%", ".1%"} <= set(percent_formats(s)) for s in specs)
    kv = lines_of(at)["decode-2"]["value"]
    assert set(kv) == {0.6}  # a ratio drawn with a percent axis: 60 %
    by_label(at.selectbox, "instance").set_value("decode-3").run()
    no_exceptions(at)
    assert "**Its load over time**" in texts(at.markdown)
    mine = lines_of(at)
    assert {"utilization", "KV cache", "running", "waiting", "prompt", "output"} <= set(mine)
    assert by_label(at.metric, "KV cache").value.endswith("%")
