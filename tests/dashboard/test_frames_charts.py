"""Frames (the API's models -> DataFrame) and chart builders (DataFrame -> Altair chart)."""

from __future__ import annotations

import time

import altair as alt
import pandas as pd
import pytest

from controller.models import Instance
from controller.requests_log import RequestLog, stats, timeseries
from dashboard import charts, frames, timeline, whatif
from pdctl_api import profiles
from pdctl_api.schema import (
    ClusterPublic,
    EventPublic,
    InstancePublic,
    RequestPublic,
    StatsPublic,
    TimeseriesPublic,
)
from tests.dashboard.fake import FakeController, make_instances, make_records


def requests_json(n: int = 30) -> list[RequestPublic]:
    return [RequestPublic.model_validate(r.public()) for r in reversed(make_records(n))]


def ts_json(n: int = 300) -> TimeseriesPublic:
    now = time.time()
    return TimeseriesPublic.model_validate({"window_s": 60, "step_s": 5.0, "now": now,
                                            "buckets": timeseries(make_records(n, now=now),
                                                                  60, 5, now)})


def empty_ts() -> TimeseriesPublic:
    return TimeseriesPublic(window_s=1, step_s=1, now=0, buckets=[])


def stats_of(n: int = 300) -> StatsPublic:
    return StatsPublic.model_validate({**stats(make_records(n), 60, 0.2), "pools": {},
                                       "total_requests": n})


def public(instances: list[Instance]) -> list[InstancePublic]:
    return [InstancePublic.model_validate(i.public()) for i in instances]


def test_requests_frame_is_oldest_first_with_shares() -> None:
    df = frames.requests_frame(requests_json())
    assert list(df["seq"]) == list(range(1, 31))
    assert df["started"].is_monotonic_increasing
    disagg = df[df["path"] == "disaggregated"]
    assert (disagg["transfer_share"] - 5.0 / 26.0).abs().max() < 1e-9
    assert (df[df["path"] == "colocated"]["transfer_share"] == 0).all()


def test_requests_frame_carries_suspect_and_kv_handle() -> None:
    records = requests_json()
    records[0].suspect = True  # the newest
    df = frames.requests_frame(records)
    assert df["suspect"].dtype == bool
    assert list(df["suspect"]) == [False] * 29 + [True]
    assert df["kv_handle"].iloc[-1] == records[0].kv_handle != ""
    assert set(frames.parts_long(df)[lambda d: d["suspect"]]["id"]) == {records[0].id}
    table = frames.recent_table(df)
    assert list(table.columns)[0] == "suspect"
    assert table["id"].iloc[0] == records[0].id  # newest first
    assert list(table["suspect"]) == [frames.SUSPECT_FLAG] + [""] * 29


def test_requests_frame_of_an_older_controller() -> None:
    records = []
    for r in make_records(30):
        raw = r.public()
        del raw["suspect"], raw["kv_handle"]
        records.append(RequestPublic.model_validate(raw))
    df = frames.requests_frame(records)
    assert not df["suspect"].any() and (df["kv_handle"] == "").all()
    assert (frames.recent_table(df)["suspect"] == "").all()


def test_lease_frame_per_prefill_instance() -> None:
    instances = make_instances(3, 2)
    instances[2].kv_expired, instances[2].kv_after_expiry = 5.0, 1.0
    df = frames.lease_frame(reversed(public(instances)))
    assert list(df["id"]) == ["prefill-1", "prefill-2", "prefill-3"]
    assert list(df["kv_expired_requests"]) == [0.0, 0.0, 5.0]
    assert list(df["notifications_after_expiry"]) == [0.0, 0.0, 1.0]
    old = [i.public() for i in instances]
    for i in old:
        del i["nixl"]["kv_expired_requests"], i["nixl"]["notifications_after_expiry"]
    legacy = [InstancePublic.model_validate(i) for i in old]
    assert frames.lease_frame(legacy)[list(frames.LEASE_COUNTERS)].isna().all().all()


def test_parts_long_sums_back_to_ttft() -> None:
    long = frames.parts_long(frames.requests_frame(requests_json()))
    per_request = long.groupby("id")["ms"].sum()
    ttft = long.groupby("id")["ttft_ms"].first()
    assert (per_request - ttft).abs().max() < 1e-6
    assert set(long["part"]) == set(frames.PART_LABELS.values())


def test_timeseries_frames() -> None:
    ts = frames.timeseries_frame(ts_json())
    assert len(ts) == 12
    assert ts["rate"].sum() * 5 == pytest.approx(300)
    rate = frames.ts_rate_long(ts)
    assert set(rate["path"]) == {"disaggregated", "colocated", "errors"}
    assert rate["per_s"].sum() * 5 == pytest.approx(300)
    parts = frames.ts_parts_long(ts)
    assert set(parts["part"]) == set(frames.PART_LABELS.values())
    assert set(frames.ts_percentiles_long(ts)["percentile"]) == {"p50", "p90", "p99"}


def test_path_share_and_components_table() -> None:
    s = stats_of()
    share = frames.path_share(s)
    assert dict(zip(share["path"], share["requests"], strict=True)) == {
        "disaggregated": 200, "colocated": 100, "errors": 0}
    table = frames.components_table(s)
    assert list(table["part"])[0] == "TTFT" and len(table) == 6


def test_instances_frame_sorts_naturally_and_places_on_a_grid() -> None:
    df = frames.instances_frame(reversed(public(make_instances(3, 25))))
    assert list(df["id"][:4]) == ["prefill-1", "prefill-2", "prefill-3", "decode-4"]
    decode = df[df["role"] == "decode"]
    assert list(decode["col"][:3]) == [0, 1, 2]
    assert decode["row"].max() == 1  # 25 decode cells: two rows of 20


def test_pool_summary_from_the_cluster() -> None:
    fake = FakeController(instances=make_instances(2, 4))
    cluster = ClusterPublic.model_validate(fake.cluster())
    summary = frames.pool_summary(cluster).set_index("role")
    assert summary.loc["decode", "ready"] == 4
    assert not summary.loc["prefill", "converged"]  # 2 ready, 1 desired
    assert 0 <= summary.loc["decode", "kv_cache_usage_mean"] <= 1


def test_events_frame_compacts_json() -> None:
    events = [EventPublic.model_validate(e) for e in FakeController().events()]
    df = frames.events_frame(events)
    assert df["after"].iloc[0] == '{"size":2,"tp":2}'
    assert df["before"].iloc[1] == "" and df["detail"].iloc[0] == ""


def test_changes_read_in_words() -> None:
    words = frames.change_in_words
    assert words({"disagg_min_prompt_tokens": 512, "decode_policy": "least_loaded"},
                 {"disagg_min_prompt_tokens": 5000, "decode_policy": "least_loaded"}
                 ) == "disagg_min_prompt_tokens 512 → 5000"
    assert words({"size": 1, "tp": 2}, {"size": 2, "tp": 4}) == "size 1 → 2, tp 2 → 4"
    assert words(None, {"backend": "sim"}) == "backend sim"
    assert words("ready", "draining") == "ready → draining"
    assert words({"ttft_p95_ms": 800.0}, {"ttft_p95_ms": 1000.0}) == "ttft_p95_ms 800 → 1000"
    assert words({"size": 2}, {"size": 2}) == "no change"
    events = [EventPublic.model_validate(e) for e in FakeController().events()]
    assert list(frames.events_frame(events)["change"]) == ["size 1 → 2", "backend sim"]


def test_empty_inputs_make_empty_frames() -> None:
    assert frames.requests_frame([]).empty
    assert frames.parts_long(frames.requests_frame([])).empty
    assert frames.timeseries_frame(empty_ts()).empty
    assert frames.instances_frame([]).empty
    assert frames.events_frame([]).empty
    assert frames.recent_table(frames.requests_frame([])).empty
    assert frames.lease_frame([]).empty


def chart_specs() -> list[alt.TopLevelMixin]:
    req = frames.requests_frame(requests_json(60))
    ts = frames.timeseries_frame(ts_json())
    s = stats_of()
    inst = frames.instances_frame(public(make_instances(40, 80)))
    return [
        charts.ttft_recent(frames.parts_long(req)),
        charts.ttft_parts_over_time(frames.ts_parts_long(ts)),
        charts.ttft_percentiles(frames.ts_percentiles_long(ts)),
        charts.request_rate(frames.ts_rate_long(ts)),
        charts.path_share_ring(frames.path_share(s)),
        charts.kv_throughput(ts),
        charts.achieved_bandwidth(ts, 50.0, "ib-ndr"),
        charts.kv_bytes_vs_prompt(req, whatif.kv_line(327_680, 1200)),
        charts.instance_grid(inst),
        charts.instance_grid(inst, "state"),
        charts.instance_grid(inst, "waiting"),
        charts.transfer_by_link(whatif.transfer_sweep("llama-3-70b", profiles.LINKS), "ib-ndr",
                                4096),
    ]


def test_every_chart_builds_a_valid_spec() -> None:
    for chart in chart_specs():
        spec = chart.to_dict()  # validates against the Vega-Lite schema
        assert spec["$schema"].startswith("https://vega.github.io/schema/vega-lite/")


def test_ttft_recent_stacks_parts_in_request_order() -> None:
    spec = charts.ttft_recent(frames.parts_long(frames.requests_frame(requests_json()))
                              ).to_dict()
    enc = spec["encoding"]
    assert enc["y"]["stack"] == "zero"
    assert enc["color"]["scale"]["domain"] == charts.PART_ORDER
    assert enc["order"]["field"] == "part_rank"


def test_suspect_requests_are_flagged_in_the_charts() -> None:
    req = frames.requests_frame(requests_json())
    bars = charts.ttft_recent(frames.parts_long(req)).to_dict()["encoding"]
    assert bars["strokeWidth"]["condition"]["test"] == "datum.suspect"
    assert "suspect" in [t["field"] for t in bars["tooltip"]]
    points = charts.kv_bytes_vs_prompt(req, whatif.kv_line(1, 1)).to_dict()["layer"][1]
    assert points["encoding"]["shape"]["condition"] == {"test": "datum.suspect",
                                                        "value": "cross"}


def test_the_parts_legend_wears_no_suspect_outline() -> None:
    """Only a suspect request's bar is outlined in red: a constant red stroke would outline
    every legend swatch too (the legend draws the mark's constant encodings)."""
    req = frames.requests_frame(requests_json())
    bars = charts.ttft_recent(frames.parts_long(req)).to_dict()["encoding"]
    assert bars["stroke"]["condition"]["test"] == "datum.suspect"
    assert bars["stroke"]["value"] == "transparent"
    assert bars["color"]["legend"]["symbolStrokeWidth"] == 0


def test_achieved_bandwidth_draws_the_ceiling() -> None:
    ts = frames.timeseries_frame(ts_json())
    spec = charts.achieved_bandwidth(ts, 50.0, "ib-ndr").to_dict()
    datasets = spec["datasets"].values()
    assert any(row.get("gbps") == 50.0 for rows in datasets for row in rows)


def test_charts_accept_empty_frames() -> None:
    empty_frame = frames.timeseries_frame(empty_ts())
    empty_req = frames.requests_frame([])
    for chart in (charts.ttft_recent(frames.parts_long(empty_req)),
                  charts.ttft_parts_over_time(frames.ts_parts_long(empty_frame)),
                  charts.achieved_bandwidth(empty_frame, 50.0, "ib-ndr"),
                  charts.kv_bytes_vs_prompt(empty_req, whatif.kv_line(1, 1)),
                  charts.path_share_ring(pd.DataFrame({"path": [], "requests": []}))):
        chart.to_dict()


def test_what_if_matches_the_domain_numbers() -> None:
    est = whatif.estimate("llama-3-70b", 4096, "ib-ndr", "h100-sxm", 4)
    assert est.kv_bytes == 2 * 80 * 8 * 128 * 4096 * 2  # ~1.34 GB
    assert est.wire_ms == pytest.approx(26.84, abs=0.01)  # "~27 ms over IB NDR"
    assert est.transfer_ms == pytest.approx(est.wire_ms + 10.0)
    assert est.transfer_share is not None and 0 < est.transfer_share < 1
    tcp = whatif.estimate("llama-3-70b", 4096, "tcp-100gbe")
    assert tcp.wire_ms == pytest.approx(134.2, abs=0.1) and tcp.transfer_share is None
    sweep = whatif.transfer_sweep("llama-3-8b", ["nvlink", "ib-ndr"], [1024, 2048])
    by = sweep.pivot(index="prompt_tokens", columns="link", values="transfer_ms")
    assert (by["nvlink"] < by["ib-ndr"]).all() and by["ib-ndr"].is_monotonic_increasing


def test_instances_frame_names_each_instances_node() -> None:
    instances = make_instances(1, 2)
    instances[1].node = "10.0.0.7"  # a Ray node; the others are the controller's processes
    df = frames.instances_frame(public(instances)).set_index("id")
    assert df.loc["decode-2", "node"] == "10.0.0.7"
    assert df.loc["prefill-1", "node"] == df.loc["decode-3", "node"] == frames.LOCAL_NODE


def test_paths_apart_pairs_and_transfer_percentiles_over_time() -> None:
    records = make_records(300, transfer_ms=5.0)
    s = StatsPublic.model_validate({**stats(records, 60.0, 0.2), "pools": {},
                                    "total_requests": 300})
    table = frames.path_table(s).set_index("path")
    assert table.loc["disaggregated", "requests"] == 200
    assert table.loc["colocated", "requests"] == 100
    # Disaggregated alone: 5 ms; a mean over both paths would say 3.3 ms.
    assert table.loc["disaggregated", "transfer_p50"] == 5.0
    assert s.components_ms.transfer.mean == pytest.approx(5.0 * 2 / 3)
    assert pd.isna(table.loc["colocated", "transfer_p50"])
    only = [r for r in records if r.path.value == "disaggregated"]  # no colocated request
    s1 = StatsPublic.model_validate({**stats(only, 60.0, 0.2), "pools": {},
                                     "total_requests": len(only)})
    empty = frames.path_table(s1).set_index("path").loc["colocated"]
    assert empty["requests"] == 0 and pd.isna(empty["ttft_p50"]) and pd.isna(empty["ttft_p99"])
    reqs = frames.requests_frame([RequestPublic.model_validate(r.public()) for r in records])
    pairs = frames.pair_table(reqs, scale=0.5)
    assert list(pairs["pair"]) == ["prefill-1 → decode-2"]
    row = pairs.iloc[0]
    assert row["requests"] == 200 and row["transfer_ms"] == 5.0
    assert row["gbps"] == pytest.approx(row["kv_gb"] / (200 * 5.0 / 1e3) * 0.5)
    ts = TimeseriesPublic.model_validate({"window_s": 30.0, "step_s": 10.0, "now": 0.0,
                                          "buckets": timeseries(records, 30.0, 10.0,
                                                                time.time())})
    long = frames.transfer_percentiles_long(ts)
    assert set(long["percentile"]) == {"p50", "p99"} and set(long["ms"]) == {5.0}
    charts.transfer_percentiles(long).to_dict()


def test_change_marks_and_before_after_a_change() -> None:
    now = time.time()
    events = [EventPublic(id=k, ts=now - 100 + k * 10, actor="alice", kind=kind, target=t,
                          after=after)
              for k, (kind, t, after) in enumerate([
                  ("controller.start", "controller", None),
                  ("pool.update", "decode", {"size": 2, "tp": 2}),
                  ("instance.ready", "decode-2", "ready"),
                  ("routing.update", "routing", {"decode_policy": "round_robin"})])]
    marks = timeline.change_marks(events, since=now - 95)
    assert list(marks["kind"]) == ["change", "change"]  # changes only, within the window
    assert marks.iloc[0]["label"] == "pool.update decode by alice: size 2, tp 2"
    spec = charts.annotate(charts.request_rate(pd.DataFrame(
        {"time": marks["time"], "path": "disaggregated", "per_s": 1.0})), marks).to_dict()
    assert [layer["mark"]["type"] for layer in spec["layer"]][1:] == ["rule", "text"]
    log = RequestLog(1000)
    for r in make_records(300, now=now):  # 30 s of requests, 10 per second
        log.add(r)
    log.since = now - 30

    def side(window: float, end: float) -> StatsPublic:
        cols, covered = log.between(window, end)
        return StatsPublic.model_validate({**stats(cols, window, 0.2, covered), "pools": {},
                                           "total_requests": 300})
    at = now - 15
    table = frames.before_after(side(10.0, at), side(10.0, at + 10))
    assert table is not None and list(table.columns) == ["before", "after"]
    assert table.loc["requests", "before"] == 100 and table.loc["requests", "after"] == 100
    assert table.loc["requests per s", "before"] == pytest.approx(10.0)
    assert "KV transfer mean (ms)" in table.index and "rate_per_s" not in table.index
    # A side that starts before the log did is not diluted by the time before it.
    early = frames.before_after(side(10.0, now - 25), side(10.0, now - 15))
    assert early is not None and early.loc["requests per s", "before"] == pytest.approx(10.0, 0.2)
    assert frames.before_after(side(10.0, now - 40), side(10.0, now - 30)) is None


def test_span_stretches_a_time_chart_over_the_window() -> None:
    chart = charts.request_rate(pd.DataFrame({"time": [pd.Timestamp.now(tz="UTC")],
                                              "path": ["colocated"], "per_s": [1.0]}))
    spec = charts.span(chart, 1000.0, 1300.0).to_dict()
    frame = spec["layer"][1]
    assert frame["mark"] == {"type": "point", "opacity": 0}
    edges = spec["datasets"][frame["data"]["name"]]
    assert [pd.Timestamp(e["time"]).timestamp() for e in edges] == [1000.0, 1300.0]


def test_altair_builds_its_class_table_once_and_the_same() -> None:
    """``altair_speed``: the table ``from_dict`` builds is kept, and equal to Altair's own."""
    from altair.utils import schemapi

    from dashboard import altair_speed

    assert altair_speed.install() and altair_speed.ORIGINAL is not None
    classes = tuple(schemapi.SchemaBase._default_wrapper_classes())
    kept = schemapi._FromDict(classes)
    fresh = object.__new__(schemapi._FromDict)
    altair_speed.ORIGINAL(fresh, classes)
    assert dict(kept.class_dict) == dict(fresh.class_dict)
    assert schemapi._FromDict(classes).class_dict is kept.class_dict
    cell = pd.DataFrame({"id": ["a"], "role": ["prefill"], "state": ["ready"], "tp": [1],
                         "running": [0], "waiting": [0], "inflight": [0],
                         "kv_cache_usage": [0.5], "col": [0], "row": [0]})
    spec = charts.instance_grid(cell).to_dict()  # validated; its encodings went through it
    assert spec["spec"]["mark"] == {"type": "rect"}
    assert spec["spec"]["encoding"]["x"]["scale"] == {"paddingInner": 0.12}  # no white stroke


# ---- load against capacity (dashboard.utilization) -----------------------------------------


def utilization_of(fake: FakeController, now: float = 10_000.0):  # a UtilizationPublic
    from controller.fleet.history import LoadSamples
    from pdctl_api.schema import UtilizationPublic

    fake.instances = make_instances(1, 2)
    fake.load_samples = LoadSamples.of(  # decode-2 then, from 9,850, decode-3
        [(now - 300 + t, "decode-2", 4.0, 1.0, 0.6) for t in range(0, 150, 2)]
        + [(now - 150 + t, "decode-3", 2.0, 0.0, 0.3) for t in range(0, 150, 2)])
    fake.records = []
    return UtilizationPublic.model_validate(fake.utilization(300.0, 5.0, now))


def test_a_pool_has_a_line_per_instance_at_its_own_times() -> None:
    from dashboard import utilization as load

    df = load.pool_lines(utilization_of(FakeController()), "decode", "kv_cache_usage")
    t = df.assign(t=df["time"].map(pd.Timestamp.timestamp))
    assert t[t["series"] == "decode-2"]["t"].max() == 9845.0  # its last bucket, not shifted
    assert t[t["series"] == "decode-3"]["t"].min() == 9850.0
    assert set(t[t["series"] == "decode-2"]["value"]) == {0.6}  # a ratio, read as 60 %
    pool = t[t["series"] == load.POOL_LINE]
    assert len(pool) == 60 and set(pool["value"]) == {0.6, 0.3}


def test_percent_axes_tooltips_and_legend_for_kv_cache_and_utilization() -> None:
    from dashboard import utilization as load

    u = utilization_of(FakeController())
    for metric in ("utilization", "kv_cache_usage", "running"):
        spec = load.load_chart(load.pool_lines(u, "decode", metric), metric).to_dict()
        axis = spec["encoding"]["y"]["axis"]
        tip = spec["encoding"]["tooltip"][-1]["format"]
        assert (axis.get("format"), tip) == ((".0%", ".1%") if metric != "running"
                                             else (None, ",.1f"))
    cell = frames.live_instances(frames.instances_frame(public(make_instances(1, 1))))
    legend = charts.instance_grid(cell).to_dict()["spec"]["encoding"]["color"]["legend"]
    assert legend["format"] == ".0%"
    assert "format" not in charts.instance_grid(cell, "running").to_dict()["spec"][
        "encoding"]["color"]["legend"]


def test_a_pool_card_says_why_there_is_no_utilization() -> None:
    from dashboard import utilization as load

    fake = FakeController()
    u = utilization_of(fake)
    f = load.pool_figures(u, "decode")
    assert (f.utilization, f.tokens_per_s, f.tokens, f.why) == (0.0, 0.0, "output", None)
    assert f.basis.startswith("profile sim-llama-3-70b-h100-sxm-tp2: ")
    fake.instances = make_instances(1, 1, decode_tp=3)
    fake.load_samples = None
    none = load.pool_figures(u.model_validate(fake.utilization(300.0, 5.0, time.time())),
                             "decode")
    assert none.utilization is None and none.why is not None
    assert "no performance profile sim-llama-3-70b-h100-sxm-tp3" in none.why
    assert load.fmt_percent(None) == "—" and load.fmt_percent(0.434) == "43%"
