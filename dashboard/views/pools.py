"""Pools: every instance with role, state, TP, running and waiting requests and KV cache usage,
each pool's utilization against its profiled capacity and its quarantine, the load of every
pool and instance over the window, and the prefix cache (hit rate reported and predicted,
savings, drift, each instance's KV-event block index); a grid of cells keeps 100+ instances
readable at a glance."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import changes, charts, frames, integrity, review
from dashboard import utilization as load
from dashboard.ui import errors, marks, plot, reads, tables
from dashboard.ui.cache_card import prefix_cache_section
from dashboard.ui.figures import clock, fmt_ms
from dashboard.ui.session import client
from dashboard.ui.sidebar import run_every
from dashboard.ui.tables import number_columns, text_columns
from dashboard.ui.timerange import time_range
from pdctl_api.schema import InstancePublic, QuarantinePublic, Role, UtilizationPublic
from pdctl_api.stats import quantile

GRID_CHOICES = {"KV cache usage": "kv_cache_usage", "running": "running",
                "waiting": "waiting", "state": "state"}
STATES = ["starting", "ready", "draining", "failed", "stopped"]
LIVE_STATES = ["starting", "ready", "draining", "failed"]  # the table's default: not stopped

st.title("Pools")
st.caption("From `/api/v1/cluster`: desired and actual pools, every instance and the load its "
           "engine last reported; from `/api/v1/utilization`: each pool's and instance's load "
           "over the window against the capacity the planner's profiles give; from "
           "`/api/v1/cache`: the prefix cache and each instance's KV index")


NO_UTILIZATION = ("this controller does not answer `/api/v1/utilization` (older than it, "
                  "or not reachable)")


def pool_card(row: pd.Series, instances: pd.DataFrame,
              quarantine: QuarantinePublic | None, u: UtilizationPublic | None,
              within: str) -> None:
    """A pool: its size, and over the window its utilization (percent of the capacity the
    planner's profiles give), running and waiting requests, tokens/s and KV cache."""
    role = str(row["role"])
    with st.container(border=True):
        state = ("quarantined" if quarantine else
                 "converged" if row["converged"] else "converging")
        st.markdown(f"**{role.capitalize()} pool** · TP {row['tp']} · KV {row['kv_mode']} · "
                    f"{state}")
        if quarantine is not None:
            st.error(integrity.quarantine_text(role, quarantine), icon=":material/block:")
        f = load.pool_figures(u, role) if u is not None else None
        now = f"now: running {row['running']:.0f}, waiting {row['waiting']:.0f}"
        cols = st.columns(3)
        cols[0].metric("Ready", f"{row['ready']} / {row['desired_size']}",
                       help=f"starting {row['starting']}, draining {row['draining']}")
        cols[1].metric("Utilization", load.fmt_percent(f.utilization if f else None),
                       help=(f"{f.tokens} tokens/s over the capacity of its instances "
                             f"{within}: {f.basis}" if f and f.basis else None))
        tokens = load.work_tokens(role)
        cols[2].metric(f"{tokens.capitalize()} tokens / s",
                       load.fmt_count(f.tokens_per_s if f else None, ",.0f"),
                       help=f"{tokens} tokens per second {within}, the work its capacity "
                            "counts")
        cols = st.columns(3)
        cols[0].metric("Running", load.fmt_count(f.running if f else None),
                       help=f"mean {within}; {now}")
        cols[1].metric("Waiting", load.fmt_count(f.waiting if f else None),
                       help=f"mean {within}; {now}")
        cols[2].metric("KV cache", load.fmt_percent(f.kv_cache_usage if f else None),
                       help=f"mean usage of its instances {within}")
        if f is None:
            st.caption(f"No utilization: {NO_UTILIZATION}.")
        elif f.utilization is not None:
            st.progress(min(1.0, f.utilization),
                        text=f"utilization {f.utilization:.0%} of capacity {within}")
        else:
            st.caption(f"No utilization: {f.why}.")
        counts = instances[instances["role"] == role]["state"].value_counts()
        st.caption(" · ".join(f"{s} {counts[s]}" for s in STATES if s in counts) or
                   "no instances")


@st.fragment(run_every=run_every())
@errors.card
def overview() -> None:
    cl = reads.cluster()
    inst = frames.instances_frame(cl.instances)
    summary = frames.pool_summary(cl)
    rng = time_range()
    u = errors.quietly(lambda: reads.range_utilization(rng), None)
    cols = st.columns(2)
    for col, (_, row) in zip(cols, summary.iterrows(), strict=True):
        with col:
            pool_card(row, inst, cl.pools[Role(row["role"])].quarantine, u, rng.within())
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
    "kv_mode": st.column_config.TextColumn(
        "KV", width="small", help="its KV connector's mode: pull (the decode engine reads the "
                                  "KV) or push (the prefill engine writes it)"),
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
    read = reads.requests_in(rng, REQUESTS_READ)
    df = frames.through(read, iid)
    total = reads.range_stats(rng).requests
    st.markdown("**Its requests** " + (
        f"(among all {len(read)} requests {rng.within()})" if len(read) >= total else
        f"(among the newest {len(read)} of the {total:,} requests {rng.within()}: those "
        f"since {clock(float(read['started_at'].min()))})"))
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


@errors.card
def its_load(iid: str) -> None:
    """Its utilization and KV cache, running and waiting, tokens/s over the window: the same
    read as the pools' charts."""
    rng = time_range()
    u = reads.range_utilization(rng)
    st.markdown(f"**Its load over time** ({rng.within()}, `/api/v1/utilization`)")
    if u is None:
        st.info(f"No load over time: {NO_UTILIZATION}.")
        return
    mine = load.find(u, iid)
    if mine is None:
        st.info(f"No load recorded for {iid} {rng.within()}.")
        return
    st.caption(f"Capacity: {mine.capacity.basis}; {load.clock_words(u)}")
    marked = marks.range_marks(rng)
    for col, unit in zip(st.columns(len(load.INSTANCE_CHARTS)), load.INSTANCE_CHARTS,
                         strict=True):
        chart = load.instance_chart(load.instance_series(mine, u.t, unit), unit)
        plot.chart(col, charts.span(charts.annotate(chart, marked), rng.start(), rng.stop()),
                   width="stretch")


@st.fragment(run_every=run_every())
@errors.card
def load_over_time() -> None:
    """Each pool's load over the window, a line per instance (a scale-up or a replacement is
    a line of its own) and the pool's, from the controller with or without Prometheus."""
    st.subheader("Load over time")
    choice = st.segmented_control("Show", list(load.CHOICES), default="Utilization %",
                                  key="pools_load_metric")
    metric = load.CHOICES.get(choice or "Utilization %", "utilization")
    rng = time_range()
    u = reads.range_utilization(rng)
    if u is None:
        st.info(f"No load over time: {NO_UTILIZATION}.")
        return
    st.caption(f"A line per instance, dashed: the pool; {rng.within()} in "
               f"{u.step_s:g} s buckets; {load.clock_words(u)}. Marks: "
               f"{marks.LEGEND.removeprefix('marks: ')}")
    marked = marks.range_marks(rng)
    for col, role in zip(st.columns(2), Role, strict=True):
        df = load.pool_lines(u, role, metric)
        title = (f"{load.work_tokens(role)} tokens / s" if metric == "tokens_per_s"
                 else None)
        col.markdown(f"**{role.value.capitalize()} pool**")
        if df.empty:
            col.info(f"No {role.value} instance {rng.within()}.")
            continue
        chart = charts.span(charts.annotate(load.load_chart(df, metric, title), marked),
                            rng.start(), rng.stop())
        plot.chart(col, chart, width="stretch")
        f = load.pool_figures(u, role)
        if metric == "utilization":
            col.caption(f"Capacity: {f.basis}" if f.utilization is not None
                        else f"No utilization: {f.why}.")


overview()
load_over_time()
prefix_cache_section()
instance_table()
drill_down()
