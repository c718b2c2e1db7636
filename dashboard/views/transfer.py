"""Transfer: KV bytes moved per second, bytes per request against prompt length, and the
bandwidth achieved during transfers against the KV link's ceiling. The time series come from
Prometheus when the console has one (the engines' NIXL counters too), else from the
controller's API."""

from __future__ import annotations

from typing import Any

import streamlit as st

from controller import profiles
from dashboard import charts, frames, prom, ui, whatif
from dashboard.client import ApiError, Json

SCATTER_LIMIT = 500
window = ui.window_s()
st.title("Transfer")
st.caption(f"Last {window:g} s · KV cache moved from prefill to decode instances "
           "(disaggregated requests only)")


def link_of(cluster: Json) -> tuple[str, float | None]:
    name = str(cluster["hardware"]["kv_link"])
    ceiling = whatif.link_ceiling_gbps(name) if name in profiles.LINKS else None
    return name, ceiling


@st.fragment(run_every=ui.run_every())
def headline() -> None:
    try:
        s, cl = ui.stats(window), ui.cluster()
    except ApiError as exc:
        ui.card_error(exc)
        return
    link, ceiling = link_of(cl)
    kv = s["kv"]
    cols = st.columns(5)
    cols[0].metric("KV moved", f"{kv['bytes_per_s'] / 1e9:.2f} GB/s",
                   help="KV bytes of the window's disaggregated requests / window length")
    cols[1].metric("KV bytes in window", ui.fmt_bytes(kv["bytes"]))
    cols[2].metric("Achieved bandwidth", f"{kv['transfer_gbps']:.1f} GB/s",
                   help="bytes / time spent transferring, over the window")
    cols[3].metric(f"Link ceiling ({link})", f"{ceiling:.0f} GB/s" if ceiling else "unknown",
                   help=profiles.LINKS[link].description if link in profiles.LINKS else None)
    use = kv["transfer_gbps"] / ceiling if ceiling else 0.0
    cols[4].metric("Of the ceiling", f"{use:.0%}",
                   help="achieved bandwidth includes the link's per-transfer latency, so "
                        "small transfers stay well below the ceiling")
    ui.transfer_alert(s["transfer_share"])


TRANSFER_QUERIES = ("kv_bytes_rate", "nixl_gbps", "accounted_gbps")


@st.fragment(run_every=ui.run_every())
def over_time() -> None:
    res = ui.prom_results(TRANSFER_QUERIES, window)
    try:
        cl = ui.cluster()
        ts = None if res is not None else frames.timeseries_frame(ui.timeseries(window))
    except ApiError as exc:
        ui.card_error(exc)
        return
    link, ceiling = link_of(cl)
    left, right = st.columns(2)
    left.subheader("KV moved per second")
    right.subheader("Achieved bandwidth vs link ceiling")
    if res is not None:
        prom_over_time(left, right, res, link, ceiling or 0.0)
    elif ts is not None:
        left.altair_chart(charts.kv_throughput(ts), width="stretch")
        right.altair_chart(charts.achieved_bandwidth(ts, ceiling or 0.0, link),
                           width="stretch")


def prom_over_time(left: Any, right: Any, res: dict[str, prom.Result], link: str,
                   ceiling: float) -> None:
    step = ui.prom_window(window).step_s
    left.caption(ui.prom_caption("`pdctl_kv_transfer_bytes_total`", window))
    left.altair_chart(charts.kv_throughput(prom.kv_frame(res["kv_bytes_rate"], step)),
                      width="stretch")
    right.caption(ui.prom_caption("`vllm:nixl_bytes_transferred` / "
                                  "`vllm:nixl_xfer_time_seconds` on the engines; the "
                                  "controller's KV bytes / accounted transfer time", window))
    bw = prom.bandwidth_frame(res["nixl_gbps"], res["accounted_gbps"])
    right.altair_chart(charts.bandwidth_by_source(bw, ceiling, link), width="stretch")


@st.fragment(run_every=ui.run_every())
def per_request() -> None:
    st.subheader("KV bytes per request vs prompt length")
    try:
        df, cl = frames.requests_frame(ui.recent_requests(SCATTER_LIMIT)), ui.cluster()
    except ApiError as exc:
        ui.card_error(exc)
        return
    per_token = int(cl["model"]["kv_bytes_per_token"])
    st.caption(f"Last {SCATTER_LIMIT} requests; dashed: {cl['model']['name']} at "
               f"{per_token / 1e3:.0f} KB per token (the engine rounds up to whole blocks)")
    top = int(df["prompt_tokens"].max()) if not df.empty else 1
    st.altair_chart(charts.kv_bytes_vs_prompt(df, whatif.kv_line(per_token, top)),
                    width="stretch")


headline()
over_time()
per_request()
