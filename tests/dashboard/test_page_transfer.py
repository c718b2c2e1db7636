"""The Transfer page: the reads-of-freed-KV alert, suspect requests and the KV lease
counters per prefill instance; one scope (the window) for its tables and charts, the marks
on its time charts, and both bandwidth figures (the controller's and the engines')."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from streamlit.testing.v1 import AppTest

from dashboard.config import ConsoleConfig
from dashboard.ui import session
from tests.dashboard.conftest import APP
from tests.dashboard.fake import (
    TOKEN,
    URL,
    FakeController,
    integrity_summary,
    make_instances,
    make_records,
)
from tests.dashboard.fake_prom import PROM_URL, FakePrometheus
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


def test_transfer_page_shows_the_kv_alert_too(console: Console, fake: FakeController) -> None:
    fake.kv_integrity = integrity_summary(after_in_window=1, suspect=1)
    at = console(fake, "transfer")
    alert = texts(at.error)
    assert "1 read of freed KV blocks" in alert and "1 request record is marked suspect" in alert


def test_transfer_page_lists_suspect_requests(console: Console, fake: FakeController) -> None:
    fake.records[-5].suspect = True
    at = console(fake, "transfer")
    no_exceptions(at)
    table = frame_with(at, "suspect")
    assert list(table["id"]) == ["req-295"] and list(table["suspect"]) == ["⚠ suspect"]
    assert "1 suspect of the 300 requests drawn" in texts(at.markdown)


def test_transfer_page_shows_lease_counters_per_prefill(console: Console,
                                                        fake: FakeController) -> None:
    fake.instances = make_instances(2, 3)
    fake.instances[1].kv_expired, fake.instances[1].kv_after_expiry = 7.0, 2.0
    at = console(fake, "transfer")
    no_exceptions(at)
    table = frame_with(at, "notifications_after_expiry")
    assert list(table["id"]) == ["prefill-1", "prefill-2"]
    assert list(table["kv_expired_requests"]) == [0.0, 7.0]
    assert list(table["notifications_after_expiry"]) == [0.0, 2.0]
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Suspect requests"] == "0"


def test_kv_handles_per_prefill_instance_come_from_the_records(console: Console,
                                                                fake: FakeController) -> None:
    """The engines count NIXL transfers on the decode side, so a prefill instance's own
    counter is always 0; the table counts the KV handles each prefill produced instead."""
    fake.instances = make_instances(2, 1)
    at = console(fake, "transfer")
    no_exceptions(at)
    table = frame_with(at, "notifications_after_expiry")
    assert list(table["id"]) == ["prefill-1", "prefill-2"]
    # The 300 records in the window (2 in 3 disaggregated, all on prefill-1), read once for
    # the page (its 500 newest).
    assert list(table["kv_handles"]) == [200.0, 0.0]
    assert "KV handles: of the 300 newest requests in the range" in texts(at.caption)


# ---- one scope: the window -------------------------------------------------------------------

def test_the_pair_table_and_the_scatter_cover_the_window_only(console: Console,
                                                              fake: FakeController) -> None:
    """188 requests in the records, 72 of them in the last minute: the pair table and the
    bytes-vs-length scatter count those 72 (they read "the last 500 requests" whatever the
    window) and say so."""
    fake.records = make_records(116, now=time.time() - 120) + make_records(72)
    at = console(fake, "transfer")
    by_label(at.selectbox, "Window").set_value("1 min").run()
    no_exceptions(at)
    pairs = frame_with(at, "pair")
    assert pairs["requests"].sum() == 48  # two in three of the 72 are disaggregated
    points = [df for c in at.get("vega_lite_chart") for df in chart_frames(c)
              if {"kv_mb", "prompt_tokens", "id"} <= set(df.columns)]
    assert [len(df) for df in points] == [48]  # the disaggregated ones drawn
    words = texts(at.caption)
    assert "All 72 requests in the last 60 s" in words
    assert "All 72 requests in the last 60 s; dashed:" in words


def test_a_sample_cut_by_the_limit_says_what_it_holds(console: Console,
                                                      fake: FakeController) -> None:
    fake.records = make_records(600)  # the last 60 s, all in the 5-min window
    at = console(fake, "transfer")
    no_exceptions(at)
    assert frame_with(at, "pair")["requests"].sum() == 334  # of the newest 500
    assert "The newest 500 of the 600 requests in the last 300 s (from " in texts(at.caption)


def failure_in_the_window(fake: FakeController) -> None:
    fake.audit = [{"id": 1, "ts": time.time() - 10, "actor": "controller",
                   "kind": "instance.failed", "target": "decode-2", "before": None,
                   "after": None, "detail": "process exited with status -9 (SIGKILL)"}]


def time_charts(at: AppTest) -> list[Any]:
    return [c for c in at.get("vega_lite_chart")
            if {"type": "point", "opacity": 0} in marks(json.loads(c.proto.spec))]


def marked_failed(chart: Any) -> bool:
    return any("failed" in set(df.get("kind", [])) for df in chart_frames(chart))


def test_every_time_chart_marks_a_failure_on_the_window_axis(console: Console,
                                                             fake: FakeController) -> None:
    failure_in_the_window(fake)
    at = console(fake, "transfer")
    no_exceptions(at)
    timed = time_charts(at)
    assert len(timed) == 3  # KV moved, bandwidth, KV transfer percentiles
    assert all(marked_failed(c) for c in timed)
    now = time.time()
    for chart in timed:
        start, end = chart_edges(chart)
        assert end == pytest.approx(now, abs=30) and end - start == pytest.approx(300)
    assert "decode-2 failed: process exited with status -9 (SIGKILL)" in texts(at.caption)


@pytest.fixture
def with_prometheus(tmp_path: Path) -> Iterator[Any]:
    """``with_prometheus(fake)``: the Transfer page on ``fake`` with a fake Prometheus."""
    opened: list[Any] = []
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    (state_dir / "token").write_text(TOKEN + "\n")

    def start(fake: FakeController) -> AppTest:
        controller, prom_client = fake.client(), FakePrometheus().client()
        opened.extend((controller, prom_client))
        at = AppTest.from_file(str(APP), default_timeout=30)
        at.session_state[session.CLIENT_KEY] = controller
        at.session_state[session.PROM_KEY] = prom_client
        at.session_state[session.CONFIG_KEY] = ConsoleConfig(URL, state_dir,
                                                             prometheus_url=PROM_URL)
        at.run()
        at.switch_page("views/transfer.py").run()
        return at

    yield start
    for c in opened:
        c.close()


def test_prometheus_time_charts_share_the_window_and_its_marks(
        with_prometheus: Any, fake: FakeController) -> None:
    failure_in_the_window(fake)
    at = with_prometheus(fake)
    no_exceptions(at)
    assert "Prometheus" in texts(at.caption)
    timed = time_charts(at)
    assert len(timed) == 3 and all(marked_failed(c) for c in timed)
    spans = {round(end - start) for start, end in map(chart_edges, timed)}
    assert spans == {300}


class NixlController(FakeController):
    """``/stats`` with the decode pool's NIXL totals, on a simulation at ``time_scale``."""

    nixl_gbps: float = 38.0
    time_scale: float = 1.0

    def route(self, request: httpx.Request, body: Any) -> Any:
        out = super().route(request, body)
        path = request.url.path.removeprefix("/api/v1")
        if request.method == "GET" and path == "/stats":
            nixl = {"transfers": 10.0, "bytes": self.nixl_gbps * 1e9, "seconds": 1.0,
                    "gbps": self.nixl_gbps}
            out["pools"] = {"decode": {
                "ready_instances": 1, "inflight": 0, "running": 0.0, "waiting": 0.0,
                "busy_share": 0.0, "kv_cache_usage_mean": 0.0, "nixl": nixl}}
        if request.method == "GET" and path == "/cluster":
            out["time_scale"] = self.time_scale
        return out


def test_both_bandwidths_are_cards_with_what_each_counts(console: Console) -> None:
    fake = NixlController()
    at = console(fake, "transfer")
    no_exceptions(at)
    cards = {m.label: m for m in at.metric}
    controller, engines = cards["Bandwidth (controller)"], cards["Bandwidth (engines, NIXL)"]
    assert engines.value == "38.0 GB/s" and controller.value.endswith(" GB/s")
    assert "whole pull" in controller.proto.help and "handshake" in controller.proto.help
    assert "cumulative" in engines.proto.help and "not the window" in engines.proto.help
    assert "the transfer only" in engines.proto.help
    fake.time_scale = 0.2  # a simulation 5x faster than the hardware: modelled time
    at = console(fake, "transfer")
    cards = {m.label: m for m in at.metric}
    assert cards["Bandwidth (engines, NIXL, modelled)"].value == "7.6 GB/s"
    assert "Bandwidth (controller, modelled)" in cards
