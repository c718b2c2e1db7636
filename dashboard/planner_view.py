"""The Planner page's data, without Streamlit: its history as tidy frames for the charts and
the decisions table, and the change that applying a recommendation means."""

from __future__ import annotations

from datetime import datetime

import pandas as pd

from pdctl_api.schema import PlannerPublic, PlanPublic, Role, TpAdvicePublic


def sizes(history: list[PlanPublic]) -> pd.DataFrame:
    """One row per (pass, pool, series): current and recommended sizes over time."""
    rows = [{"time": datetime.fromtimestamp(p.at), "pool": role.value, "series": series,
             "instances": getattr(p, series)[role]}
            for p in history for role in Role for series in ("current", "recommended")]
    return pd.DataFrame(rows, columns=["time", "pool", "series", "instances"])


def load_series(history: list[PlanPublic]) -> pd.DataFrame:
    """Observed request rate against the prediction made for it (modelled requests/s)."""
    rows = []
    for k, p in enumerate(history):
        t = datetime.fromtimestamp(p.at)
        if p.observed is not None and p.observed.requests:
            rows.append({"time": t, "series": "observed",
                         "requests/s": p.observed.load.request_rate})
        prev = history[k - 1].predicted if k else None
        if prev is not None:  # the prediction made one pass earlier, for this interval
            rows.append({"time": t, "series": "predicted", "requests/s": prev.request_rate})
    return pd.DataFrame(rows, columns=["time", "series", "requests/s"])


TTFT_P95 = "TTFT p95 (planner)"  # the planner's observation, against its own TTFT target
ITL_P95 = "ITL p95 (planner)"  # the p95 of every streamed gap in its interval, against its ITL


def latency(history: list[PlanPublic], planner: PlannerPublic) -> pd.DataFrame:
    """What each pass observed (modelled ms) against the planner's own targets: its TTFT p95,
    and its ITL p95 (the 95th percentile of every inter-token gap the router relayed in the
    interval, from ``pdctl_itl_gap_seconds``; not the operator's inter-token gap p99 target,
    which the health status compares with each streamed request's own gap p99)."""
    rows = []
    for p in history:
        if p.observed is None or not p.observed.requests:
            continue
        t = datetime.fromtimestamp(p.at)
        rows.append({"time": t, "metric": TTFT_P95, "ms": p.observed.ttft_p95_ms,
                     "target": planner.ttft_ms})
        if p.observed.itl_p95_ms is not None:
            rows.append({"time": t, "metric": ITL_P95, "ms": p.observed.itl_p95_ms,
                         "target": planner.itl_ms})
    return pd.DataFrame(rows, columns=["time", "metric", "ms", "target"])


def decisions(history: list[PlanPublic]) -> pd.DataFrame:
    """Newest first: what each pass recommended, whether it acted, and why."""
    rows = []
    for p in reversed(history):
        outcome = ("applied" if p.applied else f"refused: {p.error}" if p.error
                   else f"held: {p.hold}" if p.hold else
                   "no change" if p.recommended == p.current else "recommended")
        rows.append({
            "time": datetime.fromtimestamp(p.at).strftime("%H:%M:%S"), "mode": p.mode,
            "prefill": f"{p.current[Role.PREFILL]} → {p.recommended[Role.PREFILL]}",
            "decode": f"{p.current[Role.DECODE]} → {p.recommended[Role.DECODE]}",
            "outcome": outcome, "reasons": " · ".join(p.reasons)})
    return pd.DataFrame(rows, columns=["time", "mode", "prefill", "decode", "outcome",
                                       "reasons"])


def pending_recommendation(planner: PlannerPublic) -> dict[Role, int] | None:
    """The last recommendation's pool sizes that differ from the pools now; None when there
    is nothing to apply (no pass yet, or it matches)."""
    if not planner.history:
        return None
    last = planner.history[-1]
    diff = {r: last.recommended[r] for r in Role if last.recommended[r] != last.current[r]}
    return diff or None


def pending_tp(planner: PlannerPublic) -> TpAdvicePublic | None:
    """The last pass's TP advice (any mode: the planner recommends a TP, never applies one;
    the next pass gives none once the pool has it); None without one."""
    return planner.history[-1].tp_advice if planner.history else None
