"""The console's time series from Prometheus: PromQL, frames, the client's errors, and the
pages with a (fake) Prometheus configured, or failing, or absent."""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

from controller.cli import console as launch
from dashboard import charts, prom
from dashboard.config import ConsoleConfig, load_config
from dashboard.ui import session
from tests.dashboard.conftest import APP
from tests.dashboard.fake import TOKEN, URL, FakeController
from tests.dashboard.fake_prom import (
    ACTIVE_AT,
    ALERTS_PATH,
    PARTS,
    PROM_URL,
    FakePrometheus,
    query_name,
)
from tests.dashboard.page_helpers import chart_frames


def test_every_query_has_a_rate_window_or_none_needed() -> None:
    for name, template in prom.QUERIES.items():
        assert ("rate(" in template) == ("{rate}" in template), name
        assert "{rate}" not in prom.expr(name, "40s")
    assert prom.expr("kv_bytes_rate", "$__rate_interval") == (
        "sum(rate(pdctl_kv_transfer_bytes_total[$__rate_interval]))")
    assert "vllm:nixl_bytes_transferred_sum" in prom.QUERIES["nixl_gbps"]
    assert "vllm:nixl_xfer_time_seconds_sum" in prom.QUERIES["nixl_gbps"]
    assert "histogram_quantile(0.99, sum by (component, le)" in prom.QUERIES["part_p99"]


@pytest.mark.parametrize(("step", "window"), [(1.0, "40s"), (5.0, "40s"), (20.0, "40s"),
                                              (30.0, "60s"), (60.0, "120s")])
def test_rate_window_spans_enough_scrapes_and_two_steps(step: float, window: str) -> None:
    assert prom.rate_window(step) == window


def result(values: dict[str, list[float]], label: str = "component") -> prom.PromResult:
    return [{"metric": {label: k} if k else {}, "values": [[1000.0 + i, str(v)]
                                                           for i, v in enumerate(vs)]}
            for k, vs in values.items()]


def test_frames_drop_gaps_and_convert_units() -> None:
    df = prom.long_frame(result({"queue": [0.001, math.nan, 0.003]}), "component", 1e3)
    assert list(df["value"]) == [1.0, 3.0] and list(df["key"]) == ["queue", "queue"]
    assert str(df["time"].dt.tz) == "UTC"
    parts = prom.parts_frame(result({"transfer": [0.002], "decode_sched": [0.004],
                                     "bogus": [1.0]}))
    assert dict(zip(parts["part"], parts["ms"], strict=True)) == {
        "KV transfer": 2.0, "decode scheduling": 4.0}
    pct = prom.percentiles_frame({f"ttft_{p}": result({"": [v]}) for p, v in
                                  (("p50", 0.01), ("p90", 0.02), ("p99", 0.05))})
    assert list(pct["percentile"]) == ["p50", "p90", "p99"] and list(pct["ms"]) == [10, 20, 50]


def test_rate_frame_puts_every_failure_under_errors() -> None:
    res = [{"metric": {"path": p, "status": s}, "values": [[1000, str(v)]]}
           for p, s, v in (("disaggregated", "ok", 4), ("colocated", "ok", 2),
                           ("disaggregated", "error", 0.5), ("colocated", "cancelled", 0.25))]
    df = prom.rate_frame(res)
    assert dict(zip(df["path"], df["per_s"], strict=True)) == {
        "colocated": 2.0, "disaggregated": 4.0, "errors": 0.75}
    assert prom.rate_frame([]).empty


def test_kv_and_bandwidth_frames() -> None:
    kv = prom.kv_frame(result({"": [2e9]}), step_s=5.0)
    assert (kv["kv_gb_per_s"][0], kv["kv_bytes"][0]) == (2.0, 1e10)
    bw = prom.bandwidth_frame(result({"": [40.0]}), result({"": [math.nan, 30.0]}))
    assert list(bw["source"]) == ["engines (NIXL)", "controller (accounted)"]
    assert list(bw["gbps"]) == [40.0, 30.0]


def test_client_queries_ranges_and_explains_failures() -> None:
    fake = FakePrometheus()
    c = fake.client()
    w = prom.PromRange(end=2000.0, window_s=300.0, step_s=5.0)
    got = prom.fetch(c, "part_p99", w)
    assert {s["metric"]["component"] for s in got} == set(PARTS)
    assert fake.ranges == [(1700.0, 2000.0, "5s")]
    assert query_name(fake.queries[0]) == "part_p99" and "[40s]" in fake.queries[0]
    with pytest.raises(prom.PromError, match="400.*unknown query"):
        c.range("up{", 0, 1, 1)
    fake.reachable = False
    with pytest.raises(prom.PromError) as err:
        c.instant(prom.expr("kv_bytes_rate", "40s"))
    assert err.value.url == PROM_URL and "ConnectionError" in err.value.detail
    assert len(fake.queries) == 2  # the refused call was not retried


def test_unreachable_prometheus_fails_fast() -> None:
    c = prom.PromClient("http://127.0.0.1:9", timeout_s=1.0)  # nothing listens on port 9
    with pytest.raises(prom.PromError, match="ConnectionError"):
        c.instant("up")
    c.close()


# ---- configuration and launching -------------------------------------------------------------

def test_prometheus_url_from_arguments_then_environment() -> None:
    assert load_config([], {}).prometheus_url is None
    env = {"PDCTL_PROMETHEUS_URL": "http://env:9090/"}
    assert load_config([], env).prometheus_url == "http://env:9090"
    assert load_config(["--prometheus", "http://arg:9090"], env).prometheus_url == (
        "http://arg:9090")


def test_launch_passes_the_prometheus_url(tmp_path: Path) -> None:
    argv = launch.streamlit_argv("http://c:9", tmp_path, 8765, prometheus_url="http://p:1")
    assert argv[argv.index("--") + 1:] == ["--controller", "http://c:9", "--state-dir",
                                           str(tmp_path), "--prometheus", "http://p:1"]
    env = launch.console_env("http://c:9", tmp_path, "http://p:1")
    assert env["PDCTL_PROMETHEUS_URL"] == "http://p:1"
    assert "PDCTL_PROMETHEUS_URL" not in launch.console_env("http://c:9", tmp_path)
    cfg = load_config(argv[argv.index("--") + 1:], {})
    assert cfg.prometheus_url == "http://p:1"


def test_dashboard_subcommand_prometheus_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    p = argparse.ArgumentParser()
    launch.add_dashboard_parser(p.add_subparsers(dest="verb"))
    assert p.parse_args(["dashboard", "--prometheus", "http://p:9090"]).prometheus == (
        "http://p:9090")
    monkeypatch.setenv("PDCTL_PROMETHEUS_URL", "http://env:9090")
    p = argparse.ArgumentParser()
    launch.add_dashboard_parser(p.add_subparsers(dest="verb"))
    assert p.parse_args(["dashboard"]).prometheus == "http://env:9090"


# ---- pages -------------------------------------------------------------------------------------

@pytest.fixture
def app(tmp_path: Path) -> Iterator[Any]:
    """``app(page, fake_prom)``: the console with a fake controller and (unless ``None``) a
    fake Prometheus, run once on ``page``."""
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    (state_dir / "token").write_text(TOKEN + "\n")
    opened: list[Any] = []

    def start(page: str, fake_prom: FakePrometheus | None) -> AppTest:
        controller = FakeController().client()
        opened.append(controller)
        at = AppTest.from_file(str(APP), default_timeout=30)
        at.session_state[session.CLIENT_KEY] = controller
        if fake_prom is not None:
            client = fake_prom.client()
            opened.append(client)
            at.session_state[session.PROM_KEY] = client
        at.session_state[session.CONFIG_KEY] = ConsoleConfig(
            URL, state_dir, prometheus_url=PROM_URL if fake_prom else None)
        at.run()
        if page != "overview":
            at.switch_page(f"views/{page}.py").run()
        assert not at.exception, [e.value for e in at.exception]
        return at

    yield start
    for c in opened:
        c.close()


def specs(at: AppTest) -> str:
    return "\n".join(str(c.proto.spec) for c in at.get("vega_lite_chart"))


def captions(at: AppTest) -> str:
    return "\n".join(str(c.value) for c in at.caption)


def test_overview_shows_the_alerts_prometheus_has_firing(app: Any) -> None:
    fake = FakePrometheus(firing=[{"alertname": "PdctlTtftP95AboveTarget",
                                   "severity": "warn"}])
    at = app("overview", fake)
    strip = "\n".join(str(m.value) for m in at.markdown)
    since = datetime.fromtimestamp(datetime.fromisoformat(ACTIVE_AT).timestamp())
    # In the incidents strip, with its value and since when (Prometheus's /api/v1/alerts).
    assert (f"**Prometheus alert PdctlTtftP95AboveTarget** firing since "
            f"{since:%H:%M:%S} (value 0.15), severity warn") in strip
    assert ALERTS_PATH in fake.queries


def test_overview_time_series_come_from_prometheus(app: Any) -> None:
    fake = FakePrometheus()
    at = app("overview", fake)
    names = {query_name(q) for q in fake.queries if q != ALERTS_PATH}
    assert {"part_mean", "part_p99", "request_rate"} <= names
    assert None not in names and ALERTS_PATH in fake.queries
    assert len(at.get("vega_lite_chart")) == 7  # the API's six, plus p99 of each part
    assert f"Prometheus `{PROM_URL}`, rate window 40s" in captions(at)
    assert "p99 (ms)" in specs(at)
    assert not at.warning and not at.error
    assert f"time series from Prometheus `{PROM_URL}`" in "\n".join(
        str(c.value) for c in at.sidebar.caption)


def test_the_ttft_p99_line_and_the_card_are_one_statistic(app: Any) -> None:
    """With a Prometheus, the percentile lines come from the controller's records, as the
    cards: the fake's histogram says 45 ms at p99 where every request took 26 ms or less."""
    at = app("overview", FakePrometheus())
    card = next(m.value for m in at.metric if m.label == "TTFT p99")
    pct = next(df for c in at.get("vega_lite_chart") for df in chart_frames(c)
               if "percentile" in df.columns)
    p99 = pct[pct["percentile"] == "p99"]["ms"]
    assert not p99.empty and p99.max() == float(card.removesuffix(" ms"))
    assert 45.0 not in set(p99)


def test_transfer_bandwidth_from_engine_nixl_counters(app: Any) -> None:
    fake = FakePrometheus()
    at = app("transfer", fake)
    assert {"kv_bytes_rate", "nixl_gbps", "accounted_gbps"} <= {
        query_name(q) for q in fake.queries}
    assert "vllm:nixl_bytes_transferred" in captions(at)
    assert "source" in specs(at)
    assert len(at.get("vega_lite_chart")) == 4  # + KV transfer percentiles (the API)


def test_the_pools_page_asks_prometheus_nothing(app: Any) -> None:
    """Pool load comes from the controller's own history (``/api/v1/utilization``), with or
    without a Prometheus: one source, a line per instance."""
    fake = FakePrometheus()
    at = app("pools", fake)
    assert [s.value for s in at.subheader if s.value == "Load over time"]
    [box] = [s for s in at.selectbox if s.label == "instance"]
    box.set_value("decode-2").run()
    assert not at.exception
    assert not [q for q in fake.queries if "vllm:" in q and "nixl" not in q]
    assert any("Its load over time" in m.value for m in at.markdown)


def test_without_prometheus_the_pages_use_the_api(app: Any) -> None:
    for page, n in (("overview", 6), ("transfer", 4), ("pools", 3)):
        at = app(page, None)
        assert len(at.get("vega_lite_chart")) == n, page
        assert "Prometheus" not in captions(at)
        assert not at.warning


def test_failing_prometheus_falls_back_to_the_api_with_a_warning(app: Any) -> None:
    fake = FakePrometheus(reachable=False)
    at = app("overview", fake)
    warning = "\n".join(str(w.value) for w in at.warning)
    assert f"Prometheus at {PROM_URL} did not answer" in warning
    assert "Connection refused" in warning and "controller's own figures" in warning
    assert len(at.get("vega_lite_chart")) == 6
    assert not at.error


def test_frames_from_the_fake_draw_with_the_chart_builders() -> None:
    fake = FakePrometheus()
    c = fake.client()
    w = prom.PromRange(2000.0, 60.0, 1.0)
    res = {n: prom.fetch(c, n, w) for n in prom.QUERIES}
    assert isinstance(charts.part_lines(prom.parts_frame(res["part_p99"]), "p99").to_dict(),
                      dict)
    bw = prom.bandwidth_frame(res["nixl_gbps"], res["accounted_gbps"])
    assert set(bw["source"]) == {"engines (NIXL)"}  # the NaN series has no points
    charts.bandwidth_by_source(bw, 50.0, "nvlink").to_dict()
