"""Overview: live TTFT broken into its parts, request rate, disaggregated vs colocated share,
and the alerts: KV transfer taking more than the configured share of TTFT, reads of KV blocks
a prefill engine had already freed (output may be wrong), leases that ran out, quarantined
pools. The time series come from Prometheus when the console has one, else from the
controller's API."""

from __future__ import annotations

import streamlit as st

from dashboard import charts, frames, prom, ui
from dashboard.client import ApiError

window = ui.window_s()
st.title("Overview")
st.caption(f"Last {window:g} s · from `/api/v1/stats`, `/api/v1/timeseries`, "
           f"`/api/v1/requests?limit={ui.RECENT_LIMIT}` and `/api/v1/cluster`")


@st.fragment(run_every=ui.run_every())
def headline() -> None:
    try:
        s, cl = ui.stats(window), ui.cluster()
    except ApiError as exc:
        ui.card_error(exc)
        return
    ui.kv_integrity_alerts(s, window)
    ui.quarantine_alerts(cl, " See Pools.")
    share = s.transfer_share
    ui.transfer_alert(share)
    cols = st.columns(5)
    cols[0].metric("Request rate", f"{s.request_rate:.1f} /s",
                   help=f"{s.requests} requests in the window ({s.total_requests} total), "
                        f"{ui.rate_basis(s)}")
    cols[1].metric("TTFT p50", ui.fmt_ms(s.ttft_ms.p50))
    cols[2].metric("TTFT p99", ui.fmt_ms(s.ttft_ms.p99))
    cols[3].metric("Disaggregated", f"{s.disaggregated_share:.0%}",
                   help="share of successful requests that took the two-hop path")
    cols[4].metric("Transfer share of TTFT", f"{share.p50:.0%}",
                   delta=f"alert above {share.alert_share:.0%}", delta_color="off",
                   help="median of transfer_ms / ttft_ms over disaggregated requests")
    st.markdown("**Mean TTFT, part by part** — the means add up to the mean TTFT "
                f"({ui.fmt_ms(s.ttft_ms.mean)})")
    parts = st.columns(5)
    for col, part in zip(parts, frames.PARTS, strict=True):
        c = s.components_ms.part(part)
        col.metric(frames.PART_LABELS[part], ui.fmt_ms(c.mean),
                   help=f"p50 {c.p50:.2f} · p90 {c.p90:.2f} · p99 {c.p99:.2f} ms")
    d = (s.by_path or {}).get("disaggregated")
    if d is not None and d.requests:
        st.caption(f"KV transfer of the disaggregated requests alone: p50 "
                   f"{ui.fmt_ms(d.transfer_ms.p50)} · p99 {ui.fmt_ms(d.transfer_ms.p99)} (the "
                   "mean above counts colocated requests, which move no KV, as 0)")
    with st.expander("Percentiles of TTFT and each part (ms)"):
        st.dataframe(frames.components_table(s), hide_index=True, width="stretch")


@st.fragment(run_every=ui.run_every())
def recent() -> None:
    st.subheader("Recent requests")
    try:
        df = frames.requests_frame(ui.recent_requests())
    except ApiError as exc:
        ui.card_error(exc)
        return
    if df.empty:
        st.info("No requests recorded yet.")
        return
    st.altair_chart(charts.ttft_recent(frames.parts_long(df)), width="stretch")
    suspect = int(df["suspect"].sum())
    if suspect:
        st.caption("Outlined in red: suspect requests, whose decode hop read KV blocks the "
                   "prefill engine had already freed")
    label = (f"Recent requests as a table · {suspect} suspect (read freed KV blocks)"
             if suspect else "Recent requests as a table")
    with st.expander(label, expanded=bool(suspect)):
        ui.requests_table(df)


TTFT_QUERIES = ("part_mean", "part_p99", *(f"ttft_{p}" for p in frames.PERCENTILES))


@st.fragment(run_every=ui.run_every())
def over_time() -> None:
    st.subheader("TTFT over time")
    res = ui.prom_results(TTFT_QUERIES, window)
    if res is not None:
        prom_over_time(res)
        return
    try:
        ts = frames.timeseries_frame(ui.timeseries(window))
    except ApiError as exc:
        ui.card_error(exc)
        return
    left, right = st.columns(2)
    left.caption(f"Mean of each part per {ui.step_for(window):g} s bucket")
    left.altair_chart(charts.ttft_parts_over_time(frames.ts_parts_long(ts)), width="stretch")
    right.caption("TTFT percentiles per bucket")
    right.altair_chart(charts.ttft_percentiles(frames.ts_percentiles_long(ts)), width="stretch")


def prom_over_time(res: dict[str, prom.Result]) -> None:
    left, right = st.columns(2)
    left.caption(ui.prom_caption("Mean of each part (`pdctl_ttft_component_seconds`)", window))
    left.altair_chart(charts.ttft_parts_over_time(prom.parts_frame(res["part_mean"])),
                      width="stretch")
    right.caption(ui.prom_caption("TTFT percentiles (`pdctl_ttft_seconds`)", window))
    right.altair_chart(charts.ttft_percentiles(prom.percentiles_frame(res)), width="stretch")
    st.caption(ui.prom_caption("p99 of each TTFT part (`histogram_quantile`, bucket "
                               "resolution)", window))
    st.altair_chart(charts.part_lines(prom.parts_frame(res["part_p99"]), "p99 (ms)"),
                    width="stretch")


@st.fragment(run_every=ui.run_every())
def traffic() -> None:
    st.subheader("Traffic")
    res = ui.prom_results(("request_rate",), window)
    try:
        rate = (prom.rate_frame(res["request_rate"]) if res is not None
                else frames.ts_rate_long(frames.timeseries_frame(ui.timeseries(window))))
        s = ui.stats(window)
    except ApiError as exc:
        ui.card_error(exc)
        return
    left, right = st.columns([2, 1])
    left.caption(ui.prom_caption("Requests per second by path (`pdctl_requests_total`)", window)
                 if res is not None else "Requests per second by path")
    left.altair_chart(charts.request_rate(rate), width="stretch")
    right.caption("Disaggregated vs colocated in the window")
    right.altair_chart(charts.path_share(frames.path_share(s)), width="stretch")


headline()
recent()
over_time()
traffic()
