"""Transfer: KV bytes moved per second, the hand-off decision (which requests move KV at all,
why, and the silent fallbacks whose KV never arrived), bytes per request against prompt
length, the bandwidth achieved during transfers against the KV link's ceiling, and the
prefill engines' KV lease counters (blocks freed when their lease expired, reads completed
after that). The time series come from Prometheus when the console has one (the engines'
NIXL counters too), else from the controller's API."""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from dashboard import charts, frames, prom, whatif
from dashboard.ui import alerts, errors, marks, plot, prom_reads, reads, tables
from dashboard.ui.cache_card import decode_kv_saved
from dashboard.ui.figures import clock, fmt_bytes, fmt_ms, rate_basis
from dashboard.ui.handoff_card import handoff_section
from dashboard.ui.sidebar import run_every
from dashboard.ui.tables import number_columns, text_columns
from dashboard.ui.timerange import TimeRange, time_range
from pdctl_api import profiles
from pdctl_api.schema import ClusterPublic, Role, StatsPublic

SCATTER_LIMIT = 500
st.title("Transfer")
st.caption(f"{time_range().label()} · KV cache moved from prefill to decode instances "
           "(disaggregated requests only)")


def link_of(cluster: ClusterPublic) -> tuple[str, float | None]:
    name = cluster.hardware.kv_link
    ceiling = whatif.link_ceiling_gbps(name) if name in profiles.LINKS else None
    return name, ceiling


@st.fragment(run_every=run_every())
@errors.card
def kv_headline() -> None:
    """KV moved, bandwidth against the link, and the KV alerts."""
    rng = time_range()
    s, cl = reads.range_stats(rng), reads.cluster()
    link, ceiling = link_of(cl)
    kv, scale = s.kv, cl.time_scale
    modelled = " (modelled)" if scale != 1.0 else ""
    cols = [*st.columns(3), *st.columns(3)]  # two rows: room for the labels in full
    cols[0].metric(f"KV moved{modelled}", f"{kv.bytes_per_s * scale / 1e9:.2f} GB/s",
                   help=f"KV bytes of the window's disaggregated requests, {rate_basis(s)}"
                        + _scaled(scale))
    cols[1].metric("KV bytes in window", fmt_bytes(kv.bytes))
    cols[2].metric(f"Link ceiling ({link})", f"{ceiling:.0f} GB/s" if ceiling else "unknown",
                   help=profiles.LINKS[link].description if link in profiles.LINKS else None)
    clock_note = ", modelled" if scale != 1.0 else ""
    cols[3].metric(f"Bandwidth (controller{clock_note})",
                   f"{kv.transfer_gbps * scale:.1f} GB/s",
                   help="the controller's accounting over the window: the KV bytes of its "
                        "disaggregated requests / their accounted transfer time, which spans "
                        "the whole pull (the handshake with the prefill engine, posting the "
                        "read, the transfer and its notification)" + BANDWIDTH_GAP
                        + _scaled(scale))
    engines = nixl_gbps(s)
    cols[4].metric(f"Bandwidth (engines, NIXL{clock_note})",
                   "no data" if engines is None else f"{engines * scale:.1f} GB/s",
                   help="the decode engines' own NIXL counters (`vllm:nixl_bytes_transferred` "
                        "/ `vllm:nixl_xfer_time_seconds`, `pools.decode.nixl` in "
                        "`/api/v1/stats`): cumulative since each live decode engine started, "
                        "not the window; they time the transfer only" + BANDWIDTH_GAP
                        + _scaled(scale))
    use = kv.transfer_gbps * scale / ceiling if ceiling else 0.0
    cols[5].metric("Of the ceiling", f"{use:.0%}",
                   help="the controller's bandwidth against the link's: it includes the "
                        "link's per-transfer latency, so small transfers stay well below the "
                        "ceiling")
    decode_kv_saved(st)
    alerts.kv_integrity_alerts(s, rng.window_s)
    alerts.transfer_alert(s.transfer_share)


BANDWIDTH_GAP = ("; the controller's figure usually reads below the engines' (NIXL): about "
                 "the same bytes over a longer time")


def nixl_gbps(s: StatsPublic) -> float | None:
    """The decode engines' NIXL bandwidth (cumulative, wall time), or None: no live decode
    engine has timed a transfer."""
    pool = s.pools.get(Role.DECODE)
    return pool.nixl.gbps if pool is not None and pool.nixl.seconds > 0 else None


def _scaled(scale: float) -> str:
    return ("" if scale == 1.0 else f"; in modelled time: the wall-time figure x {scale:g} "
            "(sim.time_scale), comparable with the link")


TRANSFER_QUERIES = ("kv_bytes_rate", "nixl_gbps", "accounted_gbps")


@st.fragment(run_every=run_every())
@errors.card
def kv_over_time() -> None:
    rng = time_range()
    res = prom_reads.prom_results(TRANSFER_QUERIES, rng)
    cl = reads.cluster()
    ts = None if res is not None else frames.timeseries_frame(reads.range_timeseries(rng))
    link, ceiling = link_of(cl)
    scale = cl.time_scale
    modelled = " (modelled time)" if scale != 1.0 else ""
    marked = marks.range_marks(rng)
    left, right = st.columns(2)
    left.subheader(f"KV moved per second{modelled}")
    right.subheader(f"Achieved bandwidth vs link ceiling{modelled}")
    if res is not None:
        kv_over_time_prom(left, right, res, rng, link, ceiling or 0.0, scale, marked)
    elif ts is not None:
        ts = ts.assign(kv_gb_per_s=ts["kv_gb_per_s"] * scale,
                       transfer_gbps=ts["transfer_gbps"] * scale)
        left.caption(f"From the controller's records; {marks.LEGEND}")
        right.caption("The controller's KV bytes / accounted transfer time, per bucket")
        plot.chart(left, on_axis(charts.kv_throughput(ts), rng, marked), width="stretch")
        plot.chart(right, on_axis(charts.achieved_bandwidth(ts, ceiling or 0.0, link), rng,
                                  marked), width="stretch")
    marks.in_words(st, marked)


def on_axis(chart: Any, rng: TimeRange, marked: pd.DataFrame) -> Any:
    """A time chart of this page: the range's marks on it, over the range's whole axis."""
    return charts.span(charts.annotate(chart, marked), rng.start(), rng.stop())


def kv_over_time_prom(left: Any, right: Any, res: dict[str, prom.PromResult], rng: TimeRange,
                      link: str, ceiling: float, scale: float, marked: pd.DataFrame) -> None:
    step = prom_reads.prom_window(rng).step_s
    left.caption(prom_reads.prom_caption(f"`pdctl_kv_transfer_bytes_total`; {marks.LEGEND}",
                                         rng))
    kv = prom.kv_frame(res["kv_bytes_rate"], step)
    plot.chart(left, on_axis(charts.kv_throughput(kv.assign(
        kv_gb_per_s=kv["kv_gb_per_s"] * scale)), rng, marked), width="stretch")
    right.caption(prom_reads.prom_caption("`vllm:nixl_bytes_transferred` / "
                                          "`vllm:nixl_xfer_time_seconds` on the engines; the "
                                          "controller's KV bytes / accounted transfer time",
                                          rng))
    bw = prom.bandwidth_frame(res["nixl_gbps"], res["accounted_gbps"])
    bw = bw.assign(gbps=bw["gbps"] * scale)
    plot.chart(right, on_axis(charts.bandwidth_by_source(bw, ceiling, link), rng, marked),
               width="stretch")


PATH_COLUMNS = {
    **text_columns(path="path"),
    **number_columns("%d", requests="requests", failed="failed", retries="retried hops"),
    **number_columns("%.1f", ttft_p50="TTFT p50 (ms)", ttft_p99="TTFT p99 (ms)",
                     transfer_p50="KV transfer p50 (ms)", transfer_p99="KV transfer p99 (ms)"),
}
PAIR_COLUMNS = {
    **text_columns(pair="prefill → decode"),
    **number_columns("%d", requests="requests"),
    **number_columns("%.2f", kv_gb="KV moved (GB)"),
    **number_columns("%.1f", transfer_ms="mean transfer (ms)", gbps="bandwidth (GB/s)"),
}


@st.fragment(run_every=run_every())
@errors.card
def by_path() -> None:
    """Each path on its own: a mean over both would count colocated requests' zero transfer."""
    st.subheader("By path")
    rng = time_range()
    s, cl = reads.range_stats(rng), reads.cluster()
    ts = reads.range_timeseries(rng)
    recent = reads.requests_in(rng, SCATTER_LIMIT)  # one read for the page's cards (cached)
    if s.by_path is None:
        st.caption("This controller does not report statistics per path.")
        return
    failed = sum(i.nixl.failed_transfers or 0.0 for i in cl.instances)
    d = s.by_path["disaggregated"]
    cols = st.columns(3)
    cols[0].metric("KV transfer p50 · p99 (disaggregated)",
                   f"{fmt_ms(d.transfer_ms.p50)} · {fmt_ms(d.transfer_ms.p99)}"
                   if d.requests else "no data",
                   help="over the window's disaggregated requests only; wall time")
    cols[1].metric("Failed KV pulls", f"{failed:g}",
                   help="cumulative over the live decode engines "
                        "(vllm:nixl_num_failed_transfers)")
    cols[2].metric("Retried hops", f"{d.retries + s.by_path['colocated'].retries}",
                   help="hops the router sent again to another instance, in the window")
    st.dataframe(frames.path_table(s), column_config=PATH_COLUMNS, hide_index=True,
                 width="stretch")
    left, right = st.columns(2)
    left.markdown("**KV transfer percentiles over time** (disaggregated requests)")
    xfer = frames.transfer_percentiles_long(ts)
    if xfer.empty:
        left.info("No disaggregated requests in the window.")
    else:
        plot.chart(left, on_axis(charts.transfer_percentiles(xfer), rng,
                                 marks.range_marks(rng)), width="stretch")
    scale = cl.time_scale
    modelled = "; bandwidth in modelled time" if scale != 1 else ""
    right.markdown("**Per prefill → decode pair**")
    right.caption(upper_first(sampled(recent, s.requests, rng)) + modelled)
    pairs = frames.pair_table(recent, scale)
    if pairs.empty:
        right.info("No disaggregated requests among them.")
    else:
        right.dataframe(pairs, column_config=PAIR_COLUMNS, hide_index=True, width="stretch",
                        height=tables.rows_height(len(pairs), 360))


@st.fragment(run_every=run_every())
@errors.card
def per_request() -> None:
    st.subheader("KV bytes per request vs prompt length")
    rng = time_range()
    df = reads.requests_in(rng, SCATTER_LIMIT)  # one read for the page's cards (cached)
    s, cl = reads.range_stats(rng), reads.cluster()
    per_token = cl.model.kv_bytes_per_token
    if per_token is None:
        st.caption(f"KV bytes unknown: {cl.model.served_name} has no profile and no model "
                   "directory, so its architecture numbers are not known (model.name, "
                   "model.path)")
        return
    st.caption(f"{upper_first(sampled(df, s.requests, rng))}; dashed: {cl.model.name} at "
               f"{per_token / 1e3:.0f} KB per token (the engine rounds up to whole blocks)")
    top = int(df["prompt_tokens"].max()) if not df.empty else 1
    plot.chart(st, charts.kv_bytes_vs_prompt(df, whatif.kv_line(per_token, top)),
               width="stretch")
    suspect = df[df["suspect"]]
    if not suspect.empty:
        st.markdown(f"**{len(suspect)} suspect of the {len(df)} requests drawn** (red "
                    "crosses): their decode hop read KV blocks the prefill engine had already "
                    "freed, so their output may be wrong")
        tables.requests_table(suspect)


def sampled(df: pd.DataFrame, total: int, rng: TimeRange) -> str:
    """What a table or chart of the range's requests (``requests_in``, at most
    ``SCATTER_LIMIT``) covers: ``all 72 requests in the last 300 s``, or ``the newest 500 of
    the 1,234 requests in the last 300 s (from 14:02:11)`` when the limit cut it."""
    if df.empty:
        return f"no request {rng.within()}"
    if len(df) < SCATTER_LIMIT or len(df) >= total:  # short of the limit: none left out
        return f"all {len(df):,} requests {rng.within()}"
    return (f"the newest {len(df):,} of the {total:,} requests {rng.within()} (from "
            f"{clock(float(df['started_at'].min()))})")


def upper_first(text: str) -> str:
    return text[:1].upper() + text[1:]


LEASE_COLUMNS = {
    **text_columns(id="prefill instance", state="state"),
    "kv_expired_requests": st.column_config.NumberColumn(
        "KV expired", format="%.0f",
        help="requests whose KV blocks the engine freed when their lease expired, read late "
             "or never (`vllm:nixl_num_kv_expired_reqs`, cumulative)"),
    "notifications_after_expiry": st.column_config.NumberColumn(
        "reads after expiry", format="%.0f",
        help="decode reads that completed after the blocks were freed: the output of those "
             "requests may be wrong (`vllm:nixl_num_notifications_after_expiry`, cumulative)"),
    "kv_handles": st.column_config.NumberColumn(
        "KV handles", format="%.0f",
        help="KV handles this prefill produced for the requests listed (router's records); "
             "NIXL counts its transfers on the decode engines"),
}


@st.fragment(run_every=run_every())
@errors.card
def leases() -> None:
    st.subheader("KV leases per prefill instance")
    rng = time_range()
    s, cl = reads.range_stats(rng), reads.cluster()
    recent = reads.requests_in(rng, SCATTER_LIMIT)  # the page's one read of the records
    df = frames.lease_frame(cl.instances, recent)
    k = s.kv_integrity
    if k is not None:
        cols = st.columns(3)
        cols[0].metric("KV expired in window", f"{k.expired_in_window:g}",
                       help=f"{k.expired_requests:g} in total over the live prefill engines")
        cols[1].metric("Reads after expiry in window", f"{k.after_expiry_in_window:g}",
                       help=f"{k.notifications_after_expiry:g} in total over the live "
                            "prefill engines")
        cols[2].metric("Suspect requests", f"{k.suspect_requests}",
                       help="request records marked suspect since the controller started")
    if df.empty:
        st.info("No prefill instances.")
        return
    if df[list(frames.LEASE_COUNTERS)].isna().all().all():
        st.caption("This controller does not report the engines' KV lease counters.")
    st.caption("Cumulative counters of each prefill engine, as the controller last polled "
               "them (`nixl` in `/api/v1/instances`); KV handles: of the "
               f"{len(recent)} newest requests in the range")
    st.dataframe(df, column_config=LEASE_COLUMNS, hide_index=True, width="stretch",
                 height=tables.rows_height(len(df), 420))


kv_headline()
handoff_section(SCATTER_LIMIT)
kv_over_time()
by_path()
per_request()
leases()
