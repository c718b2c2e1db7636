"""The Overview page: TTFT part by part, health, the alerts (transfer share, reads of freed
KV blocks, leases, quarantine), one time axis, a custom range, a request found by id and the
suspect flag."""

from __future__ import annotations

import json
import time
from datetime import date, datetime, timedelta
from datetime import time as dtime

import pytest

from controller.config import TargetsSettings
from dashboard.config import RECENT_LIMIT
from dashboard.ui import timerange
from tests.dashboard.fake import FakeController, integrity_summary, make_records
from tests.dashboard.page_helpers import (
    Console,
    by_label,
    chart_edges,
    chart_frames,
    choose_range,
    frame_with,
    marks,
    no_exceptions,
    quarantine_decode,
    texts,
)


def test_overview_shows_ttft_parts(console: Console, fake: FakeController) -> None:
    at = console(fake)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["prefill"] == "10.0 ms"
    assert metrics["decode scheduling"] != "0.0 ms"
    assert metrics["KV transfer"] != "0.0 ms"
    assert metrics["Disaggregated"] == "67%"
    assert not at.error  # 5 ms of ~26 ms: no transfer alert
    assert len(at.get("vega_lite_chart")) == 6  # + latency and tokens over time


def test_an_empty_window_says_no_data_instead_of_zeros(console: Console,
                                                      fake: FakeController) -> None:
    fake.records = []
    at = console(fake)
    no_exceptions(at)
    metrics = {m.label: m.value for m in at.metric}
    for label in ("TTFT p50", "queue", "prefill", "KV transfer", "decode scheduling",
                  "overhead", "Inter-token gap p99", "Mean ITL p50"):
        assert metrics[label] == "no data", label
    assert "No requests in the last 300 s: no TTFT to draw." in texts(at.info)
    specs = [c.proto.spec for c in at.get("vega_lite_chart")]
    assert len(specs) == 1  # the request rate (0 /s is a rate); no empty TTFT axes, no ring


def test_overview_alerts_when_transfer_dominates(console: Console,
                                                  fake: FakeController) -> None:
    fake.records = make_records(300, transfer_ms=40.0)
    at = console(fake)
    alert = texts(at.error)
    assert "KV transfer is 66% of TTFT" in alert and "alert share of 20%" in alert


def test_overview_health_turns_red_when_a_target_breaks(console: Console,
                                                        fake: FakeController) -> None:
    at = console(fake)
    assert "Healthy" in texts(at.success) and "TTFT p95" in texts(at.success)
    fake.targets_set = TargetsSettings(ttft_p95_ms=5.0)  # the fake's TTFTs are ~26 ms
    at = console(fake)
    red = texts(at.error)
    assert "Target broken" in red and "> 5 ms" in red, red
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Error rate"] == "0.0%" and metrics["Output tokens"].endswith("/s")
    assert metrics["Inter-token gap p99"] == "no data"  # the fake records carry no gaps


def test_the_time_charts_of_a_page_share_the_window(console: Console,
                                                    fake: FakeController) -> None:
    at = console(fake)  # the 5-min window; the fake's requests cover its last 30 s
    framed = [c for c in at.get("vega_lite_chart")
              if {"type": "point", "opacity": 0} in marks(json.loads(c.proto.spec))]
    # TTFT parts, TTFT percentiles, latency and tokens, traffic: one x-axis
    assert len(framed) == 4


def test_a_custom_range_shows_that_range_and_no_other(console: Console,
                                                      fake: FakeController) -> None:
    then = time.time() - 3600  # 300 requests an hour ago (transfer 50 ms), 100 now (5 ms)
    fake.records = make_records(300, transfer_ms=50.0, now=then) + make_records(100)
    at = console(fake)
    start = choose_range(at, then)
    no_exceptions(at)
    assert "a fixed range" in texts(at.caption)
    rate = by_label(at.metric, "Request rate")
    assert "300 requests in the window" in rate.proto.help
    assert "p50 50.0 ms" in texts(at.caption)  # the disaggregated requests' own transfer
    assert not any("transfer_ms" in d.value for d in at.dataframe)  # drawn once opened
    at.session_state["overview-recent-table"] = True
    at.run()
    table = next(d.value for d in at.dataframe if "transfer_ms" in d.value)
    # recent requests: the range's, not the newest
    assert len(table) == RECENT_LIMIT and (table["transfer_ms"].isin([0.0, 50.0])).all()
    framed = [c for c in at.get("vega_lite_chart")
              if {"type": "point", "opacity": 0} in marks(json.loads(c.proto.spec))]
    assert framed  # the charts span the range, not the last minutes
    end = datetime.combine(start.date(), (start + timedelta(minutes=2)).time()).timestamp()
    for chart in framed:
        assert chart_edges(chart) == pytest.approx((end - 120, end))
    by_label(at.selectbox, "Window").set_value("5 min").run()
    assert "100 requests in the window" in by_label(at.metric, "Request rate").proto.help


def test_custom_range_across_midnight_and_its_cap() -> None:
    day = date(2026, 12, 1)
    rng = timerange.custom_range(day, dtime(23, 50), dtime(0, 10))
    assert rng.window_s == 1200 and rng.end == datetime(2026, 12, 2, 0, 10).timestamp()
    assert timerange.custom_range(day, dtime(10, 0), dtime(10, 0)).window_s == timerange.MAX_RANGE_S
    ahead = timerange.TimeRange(900.0, time.time() + 600)  # started 5 min ago, 10 min to go
    assert ahead.stop() <= time.time() and ahead.start() == ahead.end - 900  # not past now
    window, end = ahead.asked()  # asked from its start up to now, not the last 15 min
    assert end is not None and end <= time.time() and 299 <= window <= 301


def test_a_request_is_found_by_id(console: Console, fake: FakeController) -> None:
    at = console(fake)
    by_label(at.text_input, "Find a request by id").set_value("req-7")
    by_label(at.button, "Find").click()
    at.run()
    no_exceptions(at)
    assert "**req-7** · disaggregated · ok" in texts(at.markdown)  # k % 3 != 0
    by_label(at.text_input, "Find a request by id").set_value("nope")
    by_label(at.button, "Find").click()
    at.run()
    assert "nope" in texts(at.warning)


def test_overview_alerts_on_reads_of_freed_kv(console: Console, fake: FakeController) -> None:
    fake.kv_integrity = integrity_summary(after_in_window=3, suspect=2)
    at = console(fake)
    no_exceptions(at)
    alert = texts(at.error)
    assert "3 reads of freed KV blocks in the last 300 s" in alert
    assert "2 request records are marked suspect" in alert
    assert "may be wrong" in alert
    assert "docs/routing-and-accounting.md" in alert and "vLLM's KV contract" in alert


@pytest.mark.parametrize("page", ["overview", "transfer"])
def test_no_kv_alert_unless_the_controller_raises_it(console: Console, fake: FakeController,
                                                     page: str) -> None:
    # Reads after expiry long ago (cumulative) and in the window, but no alert: quiet.
    fake.kv_integrity = {**integrity_summary(after_in_window=2, suspect=1), "alert": False}
    at = console(fake, page)
    no_exceptions(at)
    assert not at.error
    assert "freed KV blocks" not in texts(at.warning)


def test_overview_warns_when_leases_ran_out(console: Console, fake: FakeController) -> None:
    fake.kv_integrity = integrity_summary(expired_in_window=4)
    at = console(fake)
    no_exceptions(at)
    assert not at.error  # nothing was read late: not red
    warning = texts(at.warning)
    assert "4 finished prefills in the last 300 s held KV blocks for nothing" in warning
    assert "lease ran out" in warning


def test_no_lease_warning_without_expiries_in_window(console: Console,
                                                     fake: FakeController) -> None:
    fake.kv_integrity = integrity_summary()  # 10 expired in total, none in the window
    at = console(fake)
    assert "lease ran out" not in texts(at.warning)


def test_overview_shows_a_quarantined_pool(console: Console, fake: FakeController) -> None:
    quarantine_decode(fake)
    at = console(fake)
    no_exceptions(at)
    errors = texts(at.error)
    assert "Decode pool quarantined" in errors and "Prefill pool" not in errors
    assert "process exited with status -4 (SIGILL)" in errors


def test_overview_says_changes_are_refused_while_the_state_is_unwritable(
        console: Console, fake: FakeController) -> None:
    served = fake.cluster
    why = "the state directory cannot be written (/s/state.db): database or disk is full"
    object.__setattr__(fake, "cluster", lambda: {**served(), "state_problem": why})
    at = console(fake)
    no_exceptions(at)
    assert f"**Changes are refused**: {why}" in texts(at.error)


def test_recent_requests_show_the_suspect_flag(console: Console, fake: FakeController) -> None:
    fake.records[-1].suspect = True  # the newest request
    at = console(fake)
    no_exceptions(at)
    table = frame_with(at, "suspect")
    assert table["id"].iloc[0] == "req-299"
    assert table["suspect"].iloc[0] == "⚠ suspect"
    assert (table["suspect"].iloc[1:] == "").all()
    assert table["kv_handle"].iloc[0] == "cmpl-req-299-0"
    assert any("1 suspect" in e.label for e in at.expander)


def test_last_change_is_the_newest_change_in_the_window(console: Console,
                                                         fake: FakeController) -> None:
    """The audit log arrives newest first; "Last change" is the newest change, not the
    oldest in the window."""
    now = time.time()

    def pool_update(eid: int, ago: float, size: int) -> dict[str, object]:
        return {"id": eid, "ts": now - ago, "actor": "pdctl-cli", "kind": "pool.update",
                "target": "decode", "before": {"size": size - 1, "tp": 2},
                "after": {"size": size, "tp": 2}, "detail": None}

    fake.audit = [pool_update(3, 20, 3), pool_update(2, 200, 2)]
    at = console(fake)
    no_exceptions(at)
    caption = next(c.value for c in at.caption if "requests started within" in c.value)
    assert caption.startswith("pool.update decode by pdctl-cli: size 2 → 3 at "), caption


def test_an_engine_killed_in_the_window_is_named_and_marked(console: Console,
                                                            fake: FakeController) -> None:
    """Its replacement is ready: the health is still not green, the incidents strip names the
    engine and why it died, and every time chart marks the failure."""
    now = time.time()

    def event(eid: int, ago: float, kind: str, target: str, detail: str) -> dict[str, object]:
        return {"id": eid, "ts": now - ago, "actor": "controller", "kind": kind,
                "target": target, "before": None, "after": None, "detail": detail}

    fake.audit = [event(3, 10, "instance.ready", "decode-3", "healthy after 1.0 s"),
                  event(2, 14, "instance.starting", "decode-3", "decode pool below size"),
                  event(1, 15, "instance.failed", "decode-1",
                        "process exited with status -9 (SIGKILL)")]
    at = console(fake)
    no_exceptions(at)
    assert not at.success  # not "Healthy"
    banner = texts(at.warning)
    assert "**Watch**" in banner and "decode-1 failed at" in banner
    strip = texts(at.markdown)
    assert "**decode-1 failed** at" in strip and "status -9 (SIGKILL)" in strip
    assert "replaced by decode-3, ready at" in strip
    timed = [c for c in at.get("vega_lite_chart")
             if {"type": "point", "opacity": 0} in marks(json.loads(c.proto.spec))]
    marked = [c for c in timed if any("failed" in set(df.get("kind", []))
                                      for df in chart_frames(c))]
    assert len(marked) == len(timed) == 4  # every time chart of the page


def test_the_recent_requests_chart_says_what_it_sampled(console: Console,
                                                        fake: FakeController) -> None:
    at = console(fake)  # 300 requests in the window, the chart reads the newest 200
    assert f"The newest {RECENT_LIMIT} of the 300 requests in the last 300 s (from" in \
        texts(at.caption)


@pytest.mark.parametrize(("view", "series"), [
    ("TTFT by path", {"disaggregated p50", "disaggregated p99", "colocated p50",
                      "colocated p99"}),
    ("Gap and end-to-end", {"end-to-end p50", "end-to-end p99"}),  # the fake streams none
    ("Tokens per second", {"prompt", "generated"}),
])
def test_latency_and_tokens_over_time(console: Console, fake: FakeController, view: str,
                                      series: set[str]) -> None:
    """TTFT is bimodal (short prompts colocated): by path, beside the gap and end-to-end
    latency and the tokens per second, over the window, from the controller's records."""
    at = console(fake)
    by_label(at.segmented_control, "Show").set_value(view).run()
    no_exceptions(at)
    drawn = [df for c in at.get("vega_lite_chart") for df in chart_frames(c)
             if "series" in df.columns]
    assert len(drawn) == 1 and set(drawn[0]["series"]) == series
