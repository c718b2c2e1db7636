"""Planner: the SLA planner's targets and mode (changed here, live), what it observed and
predicted, the pool sizes it recommended against the pools over time, and each decision with
its reasons. In advisory mode its recommendation can be applied as a pool change, through the
same review (the controller's dry run) and confirmation as on the Controls page."""

from __future__ import annotations

from typing import Any, get_args

import altair as alt
import streamlit as st

from dashboard import changes, charts, planner_view
from dashboard.client import ApiError
from dashboard.ui import alerts, errors, forecast_card, marks, plot
from dashboard.ui.figures import clock
from dashboard.ui.reads import forget_reads, may_change
from dashboard.ui.session import client
from dashboard.ui.sidebar import run_every
from dashboard.ui.timerange import time_range
from pdctl_api.schema import PlannerMode, PlannerPublic, PredictorName, Role

PLANNER_PASSES = 720  # planner passes read: the API's most; the page shows those in its window

PLANNER_PENDING_KEY = "pdctl_planner_pending"  # (kind, payload, effects)
PLANNER_PREDICTION_KEY = "pdctl_planner_prediction"  # the reviewed recommendation's what-if
PLANNER_OUTCOME_KEY = "pdctl_planner_outcome"  # (ok, message or ApiError)
MODES: list[str] = list(get_args(PlannerMode))
PREDICTORS: list[str] = list(get_args(PredictorName))
MODE_HELP = {"off": "the planner does nothing",
             "advisory": "recommends pool sizes (here, in the API and as "
                         "pdctl_planner_recommended_instances); changes nothing",
             "apply": "changes the pools itself, recorded in the audit log as `planner`"}

st.title("Planner")
st.caption("The SLA planner (`/api/v1/planner`): pool sizes from its own TTFT p95 and ITL p95 "
           "targets (not the service targets of Controls), a load prediction and the pools' "
           "performance profiles")


def _outcome() -> None:
    held = st.session_state.get(PLANNER_OUTCOME_KEY)
    if not held:
        return
    ok, body = held
    errors.change_outcome(ok, body)
    if ok:
        st.session_state.pop(PLANNER_OUTCOME_KEY, None)


def _confirm() -> None:
    held = st.session_state.pop(PLANNER_PENDING_KEY, None)
    st.session_state.pop(PLANNER_PREDICTION_KEY, None)
    if held is None:
        return
    kind, payload, _ = held
    c = client()

    def send() -> str:
        if kind == "settings":
            c.set_planner(payload)
            return "planner settings changed"
        if kind == "tp":
            role, size, tp = payload
            c.set_pool(role, size=size, tp=tp)
            return f"TP recommendation applied: the {role} pool is being replaced at TP {tp}"
        for role in sorted(payload, key=lambda r: payload[r]):  # shrink first
            c.set_pool(role, size=payload[role])
        return "recommendation applied: the pools are converging"

    message = errors.attempt(send)
    if isinstance(message, ApiError):
        st.session_state[PLANNER_OUTCOME_KEY] = (False, message)
        return
    forget_reads()
    st.session_state[PLANNER_OUTCOME_KEY] = (True, message)


def _cancel() -> None:
    st.session_state.pop(PLANNER_PENDING_KEY, None)
    st.session_state.pop(PLANNER_PREDICTION_KEY, None)


def _pending() -> None:
    held = st.session_state.get(PLANNER_PENDING_KEY)
    if not held:
        return
    kind, _, effects = held
    with st.container(border=True):
        title = {"settings": "Confirm — planner settings",
                 "tp": "Confirm — apply the planner's TP recommendation"}.get(
            kind, "Confirm — apply the planner's recommendation")
        (st.warning if kind != "settings" or "apply" in " ".join(effects) else st.info)(
            f"**{title}**")
        st.markdown("\n".join(f"- {e}" for e in effects))
        if kind in ("pools", "tp"):
            forecast_card.show_prediction(st.session_state.get(PLANNER_PREDICTION_KEY))
        left, right = st.columns(2)
        left.button("Confirm", key="planner-confirm", type="primary", on_click=_confirm)
        right.button("Cancel", key="planner-cancel", on_click=_cancel)


def settings_form(pl: PlannerPublic) -> None:
    with st.form("planner-settings"):
        cols = st.columns(5)
        mode = cols[0].selectbox("Mode", MODES, index=MODES.index(pl.mode),
                                 help="; ".join(f"{k}: {v}" for k, v in MODE_HELP.items()))
        ttft = cols[1].number_input(
            "Planner TTFT p95 target (ms)", min_value=1.0, value=pl.ttft_ms, step=100.0,
            help="the planner's own target (modelled ms), which it sizes the prefill pool "
                 "for; not the Controls page's TTFT targets of the health status")
        itl = cols[2].number_input(
            "Planner ITL p95 target (ms)", min_value=0.1, value=pl.itl_ms, step=5.0,
            help=f"the planner's own target for the {planner_view.ITL_P95}: the 95th "
                 "percentile of every inter-token gap the router relayed in an interval "
                 "(modelled ms), which it sizes the decode pool for; not the Controls page's "
                 "inter-token gap p99 target (each streamed request's own gap p99)")
        interval = cols[3].number_input("Interval (s)", min_value=1.0, value=pl.interval_s,
                                        step=10.0)
        predictor = cols[4].selectbox("Predictor", PREDICTORS,
                                      index=PREDICTORS.index(pl.predictor))
        submitted = st.form_submit_button("Review change")
    if not submitted:
        return
    now: dict[str, Any] = {"mode": pl.mode, "ttft_ms": pl.ttft_ms, "itl_ms": pl.itl_ms,
                           "interval_s": pl.interval_s, "predictor": pl.predictor}
    new: dict[str, Any] = {"mode": mode, "ttft_ms": float(ttft), "itl_ms": float(itl),
                           "interval_s": float(interval), "predictor": predictor}
    patch = {k: v for k, v in new.items() if v != now[k]}
    st.session_state.pop(PLANNER_OUTCOME_KEY, None)
    if not patch:
        st.session_state.pop(PLANNER_PENDING_KEY, None)
        st.session_state[PLANNER_OUTCOME_KEY] = (True, "nothing to change")
        return
    effects = [f"{k}: {now[k]} → {v}" for k, v in patch.items()]
    if patch.get("mode") == "apply":
        effects.append("in apply mode the planner changes the pools itself every interval")
    st.session_state[PLANNER_PENDING_KEY] = ("settings", patch, effects)


def review_recommendation(want: dict[Role, int]) -> None:
    """The controller's dry run of each pool change the recommendation means."""
    st.session_state.pop(PLANNER_OUTCOME_KEY, None)

    def dry_runs() -> list[str]:
        effects: list[str] = []
        for role, size in want.items():
            plan = client().plan_pool(role, size=size)
            effects.append(f"**{role}** → {size} instances")
            effects += [changes.action_text(a) for a in plan.actions] or [
                changes.NOTHING_PLANNED]
        return effects

    effects = errors.attempt(dry_runs)
    if isinstance(effects, ApiError):
        st.session_state[PLANNER_OUTCOME_KEY] = (False, effects)
        return
    st.session_state[PLANNER_PREDICTION_KEY] = forecast_card.predict(
        {role.value: {"size": size} for role, size in want.items()})
    st.session_state[PLANNER_PENDING_KEY] = ("pools", want, effects)


def review_tp(role: Role, size: int, tp: int) -> None:
    """The controller's dry run and what-if of the planner's TP advice for ``role``."""
    st.session_state.pop(PLANNER_OUTCOME_KEY, None)
    plan = errors.attempt(lambda: client().plan_pool(role, size=size, tp=tp))
    if isinstance(plan, ApiError):
        st.session_state[PLANNER_OUTCOME_KEY] = (False, plan)
        return
    effects = [f"**{role}** → {size} x TP{tp}: a rolling replacement, every instance of the "
               "pool drained and restarted at the new TP",
               *([changes.action_text(a) for a in plan.actions] or [changes.NOTHING_PLANNED])]
    st.session_state[PLANNER_PREDICTION_KEY] = forecast_card.predict(
        {role.value: {"size": size, "tp": tp}})
    st.session_state[PLANNER_PENDING_KEY] = ("tp", (role, size, tp), effects)


@st.fragment(run_every=run_every())
@errors.card
def live() -> None:
    """Refreshed on its own; the confirmation step and outcomes show here too, so that a
    button inside the fragment (which reruns only the fragment) shows its result."""
    pl = client().planner(history=PLANNER_PASSES)
    _outcome()
    _pending()
    rng = time_range()
    start, end = rng.start(), rng.stop()
    hist = [p for p in pl.history if start <= p.at <= end]  # the page's window, as every page
    cols = st.columns(4)
    last = hist[-1] if hist else None
    cols[0].metric("Mode", pl.mode)
    for col, role in zip(cols[1:3], (Role.PREFILL, Role.DECODE), strict=True):
        if last is None:
            col.metric(f"{role} (now → recommended)", "no pass yet")
        else:
            col.metric(f"{role} (now → recommended)",
                       f"{last.current[role]} → {last.recommended[role]}")
    cols[3].metric("Next pass", clock(pl.next_at) if pl.next_at else "—",
                   help=f"every {pl.interval_s:g} s while the mode is not off")
    if pl.time_scale != 1.0:  # the page banner says time is scaled; here: in which units
        st.caption(f"Targets, observations and profiles here are in modelled time (wall / "
                   f"{pl.time_scale:g}).")
    want = planner_view.pending_recommendation(pl)
    if pl.mode == "advisory" and want and may_change():
        st.button("Review the recommendation", type="primary", on_click=review_recommendation,
                  args=(want,), help="as a pool change: the controller's dry run, then your "
                                     "confirmation")
    tp = planner_view.pending_tp(pl)
    if tp is not None and may_change():
        st.button(f"Review the TP recommendation ({tp.role} {tp.size} x TP{tp.tp})",
                  on_click=review_tp, args=(tp.role, tp.size, tp.tp),
                  help="the planner never changes a TP itself: its dry run, what-if and your "
                       "confirmation, as any pool change")
    if not hist:
        st.caption("No decision yet: the first comes one interval after the mode leaves off."
                   if not pl.history else
                   f"No decision {rng.within()} ({len(pl.history)} older ones kept).")
        return
    st.caption(f"The {len(hist)} passes {rng.within()}; {marks.LEGEND}")
    marked = marks.range_marks(rng)

    def framed(chart: alt.Chart | alt.LayerChart) -> alt.LayerChart:
        return charts.span(charts.annotate(chart, marked), start, end)
    left, right = st.columns(2)
    sizes = planner_view.sizes(hist)
    left.markdown("**Pool sizes: recommended vs current**")
    plot.chart(left, framed(alt.Chart(sizes).mark_line(point=True,
                                                       interpolate="step-after").encode(
        x=charts.TIME, y=alt.Y("instances:Q", title="instances",
                               axis=alt.Axis(tickMinStep=1, format="d")),  # whole ones
        color="pool:N", strokeDash="series:N", tooltip=["time:T", "pool", "series",
                                                        "instances"])),
        width="stretch")
    ld = planner_view.load_series(hist)
    right.markdown("**Load: predicted vs observed (requests/s)**")
    if ld.empty:
        right.caption("no data yet")
    else:
        plot.chart(right, framed(alt.Chart(ld).mark_line(point=True).encode(
            x=charts.TIME, y="requests/s:Q", color="series:N",
            tooltip=["time:T", "series", "requests/s"])), width="stretch")
    lat = planner_view.latency(hist, pl)
    if not lat.empty:
        st.markdown("**Observed p95 against the planner's targets (ms)**")
        st.caption(f"{planner_view.TTFT_P95} and {planner_view.ITL_P95} (the 95th percentile "
                   "of every inter-token gap the router relayed in the planner's interval) per "
                   "pass; dashed: the planner's own targets, not the service targets of "
                   "Controls")
        base = alt.Chart(lat)
        plot.chart(st, framed(
            base.mark_line(point=True).encode(x=charts.TIME, y="ms:Q", color="metric:N")
            + base.mark_rule(strokeDash=[4, 4]).encode(y="target:Q", color="metric:N")),
            width="stretch")
    marks.in_words(st, marked)
    st.markdown("**Decisions**")
    st.dataframe(planner_view.decisions(hist), hide_index=True, width="stretch")


@errors.card
def planner_page() -> None:
    pl = client().planner()
    if pl.problem:
        st.warning(f"The planner cannot run: {pl.problem}", icon=":material/warning:")
    prof = ", ".join(f"{r}: `{pl.profiles[r] or 'none'}`" for r in (Role.PREFILL, Role.DECODE))
    st.caption(f"Profiles — {prof} · bounds prefill {pl.bounds.min_prefill}–"
               f"{pl.bounds.max_prefill}, decode {pl.bounds.min_decode}–{pl.bounds.max_decode}"
               f", budget {pl.bounds.accelerator_budget} accelerators")
    if may_change():
        settings_form(pl)
    else:
        alerts.read_only_note()
    live()
    forecast_card.hindsight()


planner_page()
