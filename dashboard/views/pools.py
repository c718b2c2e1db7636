"""Pools: every instance with role, state, TP, running and waiting requests and KV cache usage,
and each pool's utilization and quarantine; a grid of cells keeps 100+ instances readable at a
glance."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import changes, charts, frames, integrity, prom, review
from dashboard.ui import errors, plot, prom_reads, reads, tables
from dashboard.ui.figures import fmt_ms
from dashboard.ui.session import client
from dashboard.ui.sidebar import run_every
from dashboard.ui.tables import number_columns, text_columns
from dashboard.ui.timerange import time_range
from pdctl_api.schema import InstancePublic, QuarantinePublic, Role
from pdctl_api.stats import quantile

GRID_CHOICES = {"KV cache usage": "kv_cache_usage", "running": "running",
                "waiting": "waiting", "state": "state"}
STATES = ["starting", "ready", "draining", "failed", "stopped"]
LIVE_STATES = ["starting", "ready", "draining", "failed"]  # the table's default: not stopped

st.title("Pools")
st.caption("From `/api/v1/cluster`: desired and actual pools, every instance and the load its "
           "engine last reported")


def pool_card(row: pd.Series, instances: pd.DataFrame,
              quarantine: QuarantinePublic | None) -> None:
    role = str(row["role"])
    with st.container(border=True):
        state = ("quarantined" if quarantine else
                 "converged" if row["converged"] else "converging")
        st.markdown(f"**{role.capitalize()} pool** · TP {row['tp']} · {state}")
        if quarantine is not None:
            st.error(integrity.quarantine_text(role, quarantine), icon=":material/block:")
        cols = st.columns(3)
        cols[0].metric("Ready", f"{row['ready']} / {row['desired_size']}",
                       help=f"starting {row['starting']}, draining {row['draining']}")
        cols[1].metric("Running", f"{row['running']:.0f}")
        cols[2].metric("Waiting", f"{row['waiting']:.0f}")
        busy, kv = float(row["busy_share"]), float(row["kv_cache_usage_mean"])
        st.progress(min(1.0, busy), text=f"busy {busy:.0%} · ready instances with requests "
                                         "in flight or running")
        st.progress(min(1.0, kv), text=f"KV cache {kv:.0%} · mean usage of the ready "
                                       "instances")
        counts = instances[instances["role"] == role]["state"].value_counts()
        st.caption(" · ".join(f"{s} {counts[s]}" for s in STATES if s in counts) or
                   "no instances")


@st.fragment(run_every=run_every())
@errors.card
def overview() -> None:
    cl = reads.cluster()
    inst = frames.instances_frame(cl.instances)
    summary = frames.pool_summary(cl)
    cols = st.columns(2)
    for col, (_, row) in zip(cols, summary.iterrows(), strict=True):
        with col:
            pool_card(row, inst, cl.pools[Role(row["role"])].quarantine)
    choice = st.segmented_control("Colour instances by", list(GRID_CHOICES),
                                  default="KV cache usage", key="pools_grid_metric")
    live = frames.live_instances(inst)
    if live.empty:
        st.info("No live instances.")
    else:
        metric = GRID_CHOICES.get(choice or "KV cache usage", "kv_cache_usage")
        plot.chart(st, charts.instance_grid(live, metric))
    ended = len(inst) - len(live)
    if ended:
        st.caption(f"Live instances only: {ended} stopped or failed "
                   f"instance{'s are' if ended > 1 else ' is'} in the table below.")


INSTANCE_COLUMNS = {
    **text_columns(id="instance", role="role", state="state"),
    **number_columns("%d", tp="TP"),
    **number_columns("%.0f", running="running", waiting="waiting"),
    **number_columns("%d", inflight="in flight"),
    "kv_cache_usage": st.column_config.ProgressColumn("KV cache", min_value=0.0, max_value=1.0,
                                                      format="percent"),
    "node": st.column_config.TextColumn("node", help="the Ray node it runs on, or the "
                                        "controller's host for local processes"),
    **text_columns(url="url", last_error="last error"),
}


@st.fragment(run_every=run_every())
@errors.card
def instance_table() -> None:
    st.subheader("Instances")
    left, right = st.columns(2)
    roles = left.multiselect("Role", frames.ROLE_NAMES, default=frames.ROLE_NAMES,
                             key="pools_roles")
    states = right.multiselect("State", STATES, default=LIVE_STATES, key="pools_states",
                               help="stopped instances are hidden unless chosen here; their "
                                    "load and that of failed ones is left blank (stale)")
    inst = frames.instances_frame(reads.cluster().instances)
    shown = inst[inst["role"].isin(roles) & inst["state"].isin(states)]
    st.dataframe(shown[list(INSTANCE_COLUMNS)], column_config=INSTANCE_COLUMNS,
                 hide_index=True, height=tables.rows_height(len(shown), 600), width="stretch")
    st.caption(f"{len(shown)} of {len(inst)} instances")


@st.fragment
@errors.card
def drill_down() -> None:
    """One instance: its figures, its audit events and the tail of its engine's log."""
    st.subheader("Instance")
    cl = reads.cluster()
    ids = [i.id for i in cl.instances]
    if not ids:
        st.info("No instances.")
        return
    iid = st.selectbox("instance", ids, index=None, placeholder="choose an instance to open",
                       key="pools_instance")
    if iid is None:
        return
    chosen = next((i for i in cl.instances if i.id == iid), None)
    if chosen is None:
        st.warning(f"{iid} is no longer known to the controller.")
        return
    cols = st.columns(4)
    cols[0].metric("State", chosen.state.value)
    cols[1].metric("TP", chosen.tp)
    ended = chosen.state.value in frames.ENDED_STATES
    cols[2].metric("In flight", "—" if ended else chosen.load.inflight)
    cols[3].metric("KV cache", "—" if ended else f"{chosen.load.kv_cache_usage:.0%}")
    if chosen.last_error:
        st.error(chosen.last_error)
    events = [e for e in reads.audit_events(500, None) if e.target == iid]
    log = client().instance_log(iid, lines=40).log
    drain_action(chosen, cl.instances)
    its_requests(iid)
    its_load(iid)
    st.markdown("**Its events** (newest first)")
    st.dataframe(frames.events_frame(events), hide_index=True, width="stretch",
                 height=tables.rows_height(len(events), 300))
    st.markdown("**The tail of its engine's log** (`/api/v1/instances/{id}/log`)")
    st.code(log or "(empty)", language=None)


def drain_action(chosen: InstancePublic, instances: list[InstancePublic]) -> None:
    """Drain (and so restart) the instance: reviewed, then confirmed, like every change."""
    if not reads.may_change():
        return
    section = f"pools-drain-{chosen.id}"
    if chosen.id in {i.id for i in changes.drainable(instances)}:
        st.caption("Draining stops new requests to it; it stops when its requests are done, "
                   "and the pool starts a replacement while its size is unchanged: a restart.")
        if st.button("Review drain (restart)", key=f"pools-review-drain-{chosen.id}"):
            review.review(section, changes.drain_change(chosen))
    review.show_pending(section)
    review.show_outcome(section)


REQUESTS_READ = 500  # recent requests searched for the instance's own


@errors.card
def its_requests(iid: str) -> None:
    """The recent requests it served (as prefill or as decode), their TTFT over time."""
    rng = time_range()
    df = frames.through(reads.requests_in(rng, REQUESTS_READ), iid)
    st.markdown(f"**Its requests** (of the last {REQUESTS_READ} {rng.within()})")
    if df.empty:
        st.info(f"No request went through {iid} among them.")
        return
    # The project's one percentile (nearest rank), as the Overview's TTFT p50.
    p50 = quantile(df[df["status"] == "ok"]["ttft_ms"].tolist(), 0.5)
    cols = st.columns(3)
    cols[0].metric("Requests", f"{len(df)}", help="as prefill or as decode")
    cols[1].metric("TTFT p50", "no data" if p50 is None else fmt_ms(p50))
    cols[2].metric("Failed", f"{int((df['status'] != 'ok').sum())}")
    plot.chart(st, charts.instance_requests(df), width="stretch")
    with st.expander("Its requests as a table", key=f"pools-requests-{iid}",
                     on_change="rerun") as box:
        if box.open:
            tables.requests_table(df)


def load_charts(res: dict[str, prom.PromResult]) -> None:
    """Running, waiting and KV cache usage side by side, a line per role."""
    load = prom.load_frame(res)
    for col, metric in zip(st.columns(3), prom.LOAD_METRICS.values(), strict=True):
        plot.chart(col, charts.load_lines(load, metric), width="stretch")


def its_load(iid: str) -> None:
    """With Prometheus: the engine's own running, waiting and KV cache series."""
    if prom_reads.prom() is None:
        return
    res = prom_reads.prom_instance(iid, time_range())
    if res is None:
        return
    st.markdown("**Its engine's load over time** (Prometheus: `vllm:num_requests_running`, "
                "`vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`)")
    load_charts(res)


LOAD_QUERIES = tuple(prom.LOAD_METRICS)


@st.fragment(run_every=run_every())
def load_over_time() -> None:
    """Only with Prometheus: the engines' own load series, summed per role."""
    if prom_reads.prom() is None:
        return
    rng = time_range()
    st.subheader("Engine load over time")
    res = prom_reads.prom_results(LOAD_QUERIES, rng)
    if res is None:
        return
    st.caption(prom_reads.prom_caption("`vllm:num_requests_running`, "
                                       "`vllm:num_requests_waiting` (sum per role), "
                                       "`vllm:kv_cache_usage_perc` (mean per role)", rng))
    load_charts(res)


overview()
load_over_time()
instance_table()
drill_down()
