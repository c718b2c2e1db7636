"""The controller's answers (``pdctl_api.schema`` models) -> pandas DataFrames, shaped for the
chart builders. Pure functions."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from datetime import datetime
from typing import Any

import pandas as pd

from pdctl_api.schema import (
    PARTS,
    ClusterPublic,
    EventPublic,
    InstancePublic,
    InstanceState,
    RequestPublic,
    Role,
    StatsPublic,
    TimeseriesPublic,
)

PART_LABELS = {"queue": "queue", "prefill": "prefill", "transfer": "KV transfer",
               "decode_sched": "decode scheduling", "overhead": "overhead"}
PERCENTILES = ("p50", "p90", "p99")
PATHS = ("disaggregated", "colocated", "errors")
REQUEST_EXTRAS = ("prefill_instance", "decode_instance", "kv_handle", "suspect", "decision",
                  "decision_reason", "kv_fallback")
SUSPECT_FLAG = "⚠ suspect"
FALLBACK_FLAG = "⚠ fallback"  # a silent KV fallback: the decode engine computed the prompt
ROLE_NAMES = [r.value for r in Role]  # the ``role`` column's values, prefill first


_LOCAL = datetime.now().astimezone().tzinfo


def _when(seconds: Any) -> pd.Series:
    return pd.to_datetime(pd.Series(seconds, dtype="float64"), unit="s", utc=True)


REQUEST_FRAME_COLUMNS = ["id", "started_at", "path", "status", "prompt_tokens", "output_tokens",
                   "kv_bytes", "ttft_ms", *(f"{p}_ms" for p in PARTS), *REQUEST_EXTRAS]


def _request_row(r: RequestPublic) -> tuple[Any, ...]:
    return (r.id, r.started_at, r.path.value, r.status, r.prompt_tokens, r.output_tokens,
            r.kv_bytes, r.ttft_ms, r.queue_ms, r.prefill_ms, r.transfer_ms, r.decode_sched_ms,
            r.overhead_ms, r.prefill_instance or "", r.decode_instance or "",
            r.kv_handle or "", r.suspect, r.decision or "", r.decision_reason or "",
            r.kv_fallback)


def requests_frame(records: list[RequestPublic]) -> pd.DataFrame:
    """Recent requests (the API sends newest first), oldest first, with ``seq`` 1..n.

    ``suspect`` is False and ``kv_handle`` "" for records of an older controller that does
    not send them (the model's defaults); so are ``decision`` and ``decision_reason`` ""
    and ``kv_fallback`` False."""
    df = pd.DataFrame([_request_row(r) for r in reversed(records)], columns=REQUEST_FRAME_COLUMNS)
    for c in ("prefill_instance", "decode_instance", "kv_handle", "decision", "decision_reason"):
        df[c] = df[c].astype("object")
    df[["suspect", "kv_fallback"]] = df[["suspect", "kv_fallback"]].astype(bool)
    df["started"] = _when(df["started_at"].to_numpy())
    df["seq"] = range(1, len(df) + 1)
    ttft = df["ttft_ms"].astype("float64")
    df["transfer_share"] = (df["transfer_ms"].astype("float64") / ttft.where(ttft > 0)).fillna(0.0)
    return df


def through(requests: pd.DataFrame, instance_id: str) -> pd.DataFrame:
    """The requests (a ``requests_frame``) one instance served, as prefill or as decode."""
    mask = (requests["prefill_instance"] == instance_id) | \
        (requests["decode_instance"] == instance_id)
    return requests[mask]


def recent_table(requests: pd.DataFrame) -> pd.DataFrame:
    """Recent requests for a table, newest first: ``suspect`` and ``kv_fallback`` shown as
    flags (or empty), local wall-clock times."""
    df = requests.iloc[::-1]
    out = pd.DataFrame({
        "suspect": df["suspect"].map(lambda v: SUSPECT_FLAG if v else "").astype("object"),
        "started": df["started"].dt.tz_convert(_LOCAL).dt.tz_localize(None),
        **{c: df[c] for c in ("id", "path", "status", "prompt_tokens", "output_tokens",
                              "ttft_ms", "transfer_ms", "prefill_instance", "decode_instance",
                              "kv_handle", "decision", "decision_reason")},
        "kv_fallback": df["kv_fallback"].map(lambda v: FALLBACK_FLAG if v else "")
        .astype("object"),
    })
    return out.reset_index(drop=True)


def parts_long(requests: pd.DataFrame) -> pd.DataFrame:
    """One row per (request, TTFT part) for a stacked bar per request."""
    ok = requests[requests["status"] == "ok"]
    long = ok.melt(id_vars=["seq", "id", "path", "prompt_tokens", "ttft_ms", "started",
                            "suspect"],
                   value_vars=[f"{p}_ms" for p in PARTS], var_name="part", value_name="ms")
    long["part"] = long["part"].str.removesuffix("_ms").map(PART_LABELS)
    return long.reset_index(drop=True)


def timeseries_frame(ts: TimeseriesPublic) -> pd.DataFrame:
    """One row per bucket: time, rates by path, TTFT percentiles, mean parts, KV bandwidth."""
    step = ts.step_s or 1.0
    rows = []
    for b in ts.buckets:
        q, m = b.ttft_ms, b.parts_mean_ms
        rows.append((b.t, b.requests, b.rate, b.disaggregated / step, b.colocated / step,
                     b.errors / step, b.kv_bytes, b.kv_bytes_per_s / 1e9, b.transfer_gbps,
                     q.p50, q.p90, q.p99, q.mean,
                     m.queue, m.prefill, m.transfer, m.decode_sched, m.overhead))
    cols = ["t", "requests", "rate", *PATHS, "kv_bytes", "kv_gb_per_s", "transfer_gbps",
            *(f"ttft_{k}" for k in (*PERCENTILES, "mean")), *PARTS]
    df = pd.DataFrame(rows, columns=cols)
    df["time"] = _when(df["t"].to_numpy())
    return df


def transfer_percentiles_long(ts: TimeseriesPublic) -> pd.DataFrame:
    """KV transfer p50/p99 of each bucket's disaggregated requests (``time, percentile,
    ms``); buckets without any are left out."""
    rows = [(b.t, q, v) for b in ts.buckets
            for q, v in (("p50", b.transfer_p50_ms), ("p99", b.transfer_p99_ms))
            if v is not None]
    df = pd.DataFrame(rows, columns=["t", "percentile", "ms"])
    df["time"] = _when(df["t"].to_numpy())
    return df[["time", "percentile", "ms"]]


def _bucket_lines(rows: list[tuple[float, str, float | None]]) -> pd.DataFrame:
    """``time, series, value`` of ``(t, series, value)`` rows; None values left out."""
    df = pd.DataFrame([r for r in rows if r[2] is not None], columns=["t", "series", "value"])
    df["time"] = _when(df["t"].to_numpy())
    return df[["time", "series", "value"]]


def ts_ttft_by_path_long(ts: TimeseriesPublic) -> pd.DataFrame:
    """TTFT p50 and p99 of each path per bucket (``time, series, value`` ms)."""
    return _bucket_lines([(b.t, f"{path} {q}", getattr(tail, q)) for b in ts.buckets
                    for path, tail in (b.ttft_by_path or {}).items() if tail is not None
                    for q in ("p50", "p99")])


def ts_latency_long(ts: TimeseriesPublic) -> pd.DataFrame:
    """Inter-token gap p99 and end-to-end p50/p99 per bucket (``time, series, value`` ms)."""
    return _bucket_lines([(b.t, name, v) for b in ts.buckets for name, v in (
        ("gap p99", b.gap_p99_ms), ("end-to-end p50", b.e2e_p50_ms),
        ("end-to-end p99", b.e2e_p99_ms))])


def ts_tokens_long(ts: TimeseriesPublic) -> pd.DataFrame:
    """Prompt and generated tokens per second per bucket (``time, series, value``)."""
    return _bucket_lines([(b.t, name, v) for b in ts.buckets for name, v in (
        ("prompt", b.prompt_tokens_per_s), ("generated", b.output_tokens_per_s))])


def path_table(stats: StatsPublic) -> pd.DataFrame:
    """One row per path: requests, failed, retried hops, TTFT and KV transfer p50/p99."""
    rows = []
    for name, p in (stats.by_path or {}).items():
        served = p.ttft_ms.max > 0  # percentiles over no request read 0: shown as none
        moved = served and name == "disaggregated"
        rows.append((name, p.requests, p.failed, p.retries,
                     p.ttft_ms.p50 if served else None, p.ttft_ms.p99 if served else None,
                     p.transfer_ms.p50 if moved else None, p.transfer_ms.p99 if moved else None))
    return pd.DataFrame(rows, columns=["path", "requests", "failed", "retries", "ttft_p50",
                                       "ttft_p99", "transfer_p50", "transfer_p99"])


def pair_table(requests: pd.DataFrame, scale: float = 1.0) -> pd.DataFrame:
    """Per prefill -> decode pair among the recent disaggregated requests: requests, KV
    moved, mean transfer, bandwidth (bytes / transfer time, x ``scale`` for modelled time)."""
    d = requests[(requests["path"] == "disaggregated") & (requests["transfer_ms"] > 0)]
    if d.empty:
        return pd.DataFrame(columns=["pair", "requests", "kv_gb", "transfer_ms", "gbps"])
    g = d.groupby(["prefill_instance", "decode_instance"], sort=True).agg(
        requests=("id", "count"), kv_bytes=("kv_bytes", "sum"),
        transfer_ms=("transfer_ms", "mean"), transfer_total=("transfer_ms", "sum"))
    g = g.reset_index()
    return pd.DataFrame({
        "pair": g["prefill_instance"] + " → " + g["decode_instance"],
        "requests": g["requests"], "kv_gb": g["kv_bytes"] / 1e9,
        "transfer_ms": g["transfer_ms"],
        "gbps": g["kv_bytes"] / 1e9 / (g["transfer_total"] / 1e3) * scale})


def before_after(before: StatsPublic, after: StatsPublic) -> pd.DataFrame | None:
    """The window before a change against the one after it (``/stats`` with ``end``): one
    row per figure, named in words. None when either side has no request."""
    if before.requests == 0 or after.requests == 0:
        return None
    rows = {}
    for name, s in (("before", before), ("after", after)):
        rows[name] = {"requests": s.requests, "requests per s": s.request_rate,
                      "TTFT p50 (ms)": s.ttft_ms.p50, "TTFT p99 (ms)": s.ttft_ms.p99,
                      **{f"{PART_LABELS[p]} mean (ms)": s.components_ms.part(p).mean
                         for p in PARTS},
                      "inter-token gap p99 (ms)": s.gap_p99_ms.p99 if s.gap_p99_ms else None,
                      "error rate": s.error_rate}
    return pd.DataFrame(rows).astype(float).round(3)


def ts_parts_long(ts: pd.DataFrame) -> pd.DataFrame:
    """Mean TTFT parts per bucket (stackable: the means add up to the mean TTFT)."""
    busy = ts[ts["requests"] > 0]
    long = busy.melt(id_vars=["time"], value_vars=list(PARTS), var_name="part", value_name="ms")
    long["part"] = long["part"].map(PART_LABELS)
    return long.reset_index(drop=True)


def ts_percentiles_long(ts: pd.DataFrame) -> pd.DataFrame:
    busy = ts[ts["requests"] > 0]
    long = busy.melt(id_vars=["time"], value_vars=[f"ttft_{p}" for p in PERCENTILES],
                     var_name="percentile", value_name="ms")
    long["percentile"] = long["percentile"].str.removeprefix("ttft_")
    return long.reset_index(drop=True)


def ts_rate_long(ts: pd.DataFrame) -> pd.DataFrame:
    long = ts.melt(id_vars=["time"], value_vars=list(PATHS), var_name="path",
                   value_name="per_s")
    return long.reset_index(drop=True)


def path_share(stats: StatsPublic) -> pd.DataFrame:
    """Requests in the window by path (ok requests) and errors."""
    n, ok = stats.requests, stats.by_status.get("ok", 0)
    disagg = round(ok * stats.disaggregated_share)
    return pd.DataFrame({"path": list(PATHS), "requests": [disagg, ok - disagg, n - ok]})


def components_table(stats: StatsPublic) -> pd.DataFrame:
    """Percentiles of TTFT and of each part over the window (ms)."""
    rows = [{"part": "TTFT", **stats.ttft_ms.model_dump()}]
    rows += [{"part": PART_LABELS[p], **stats.components_ms.part(p).model_dump()}
             for p in PARTS]
    return pd.DataFrame(rows, columns=["part", "p50", "p90", "p99", "mean", "max"])


def _natural(instance_id: str) -> tuple[str, int]:
    m = re.match(r"(.*?)(\d+)$", instance_id)
    return (m.group(1), int(m.group(2))) if m else (instance_id, 0)


GRID_COLUMNS = 20


LOCAL_NODE = "controller host"  # the node of an instance run as the controller's own process


ENDED_STATES = ("stopped", "failed")


def live_instances(df: pd.DataFrame) -> pd.DataFrame:
    """The instances not yet ended, re-placed on the grid."""
    return _on_grid(df[~df["state"].isin(ENDED_STATES)].reset_index(drop=True))


def _on_grid(df: pd.DataFrame) -> pd.DataFrame:
    """``col``/``row`` of each instance on a grid of ``GRID_COLUMNS`` cells per row within its
    role, in the frame's order."""
    pos = df.groupby("role", sort=False).cumcount()
    return df.assign(col=pos % GRID_COLUMNS, row=pos // GRID_COLUMNS)


def instances_frame(instances: Iterable[InstancePublic]) -> pd.DataFrame:
    """Every instance with role, state, TP, KV transfer mode, load and node (a Ray node's IP, or
    ``LOCAL_NODE``), sorted by role then id; ``col``/``row``
    place it on a grid of ``GRID_COLUMNS`` cells per row within its role."""
    rows = [(i.id, i.role.value, i.state.value, i.tp, getattr(i, "kv_mode", None) or "pull",
             i.load.running, i.load.waiting, i.load.inflight, i.load.kv_cache_usage,
             i.node or LOCAL_NODE, i.url, i.last_error or "")
            for i in instances]
    cols = ["id", "role", "state", "tp", "kv_mode", "running", "waiting", "inflight",
            "kv_cache_usage", "node", "url", "last_error"]
    df = pd.DataFrame(rows, columns=cols)
    if df.empty:
        return df.assign(col=pd.Series(dtype="int64"), row=pd.Series(dtype="int64"))
    # A stopped or failed instance's load is what its engine last said before it ended: stale.
    ended = df["state"].isin(ENDED_STATES)
    df.loc[ended, ["running", "waiting", "kv_cache_usage"]] = float("nan")
    df = df.sort_values(["role", "id"], key=lambda s: s.map(_natural) if s.name == "id" else s,
                        ascending=[False, True]).reset_index(drop=True)
    return _on_grid(df)


LEASE_COUNTERS = ("kv_expired_requests", "notifications_after_expiry")


def lease_frame(instances: Iterable[InstancePublic], requests: pd.DataFrame | None = None
                ) -> pd.DataFrame:
    """Per prefill instance, its engine's cumulative KV lease counters (``nixl``
    ``kv_expired_requests``, ``notifications_after_expiry``) and the KV handles it produced
    for ``requests`` (a ``requests_frame``: the router's records; the engines count NIXL
    transfers on the decode side only), sorted by id. NaN where the controller does not report
    the counters (older than the fields), and for handles without ``requests``."""
    handles = (None if requests is None else
               requests.loc[requests["kv_handle"] != "", "prefill_instance"].value_counts())
    rows = [(i.id, i.state.value, _nan(i.nixl.kv_expired_requests),
             _nan(i.nixl.notifications_after_expiry),
             math.nan if handles is None else float(handles.get(i.id, 0)))
            for i in instances if i.role is Role.PREFILL]
    df = pd.DataFrame(rows, columns=["id", "state", *LEASE_COUNTERS, "kv_handles"])
    df = df.astype(dict.fromkeys((*LEASE_COUNTERS, "kv_handles"), "float64"))
    return df.sort_values("id", key=lambda s: s.map(_natural)).reset_index(drop=True)


def _nan(value: float | None) -> float:
    return math.nan if value is None else value


def pool_summary(cluster: ClusterPublic) -> pd.DataFrame:
    """Per pool: desired and actual sizes, and utilization of its ready instances (the same
    figures as ``/api/v1/stats`` ``pools``, computed from the instance list already fetched)."""
    rows = []
    for role in Role:
        pool = cluster.pools[role]
        load = [i.load for i in cluster.instances
                if i.role is role and i.state is InstanceState.READY]
        n = len(load)
        rows.append({
            "role": role.value, "desired_size": pool.desired.size, "tp": pool.desired.tp,
            "kv_mode": getattr(pool.desired, "kv_mode", None) or "pull",
            "ready": pool.actual.ready, "starting": pool.actual.starting,
            "draining": pool.actual.draining,
            "ready_at_desired_tp": pool.actual.ready_at_desired_tp,
            "converged": pool.converged,
            "running": sum(x.running for x in load),
            "waiting": sum(x.waiting for x in load),
            "busy_share": sum(1 for x in load if x.inflight or x.running) / n if n else 0.0,
            "kv_cache_usage_mean": sum(x.kv_cache_usage for x in load) / n if n else 0.0,
        })
    return pd.DataFrame(rows)


def change_in_words(before: Any, after: Any) -> str:
    """A change as an operator reads it: ``disagg_min_prompt_tokens 512 → 5000, size 1 → 2``
    (the settings that changed), ``backend sim`` (what was set where nothing was before), or
    ``ready → draining``."""
    if isinstance(after, dict):
        was = before if isinstance(before, dict) else {}
        changed = [k for k in after if k not in was or was[k] != after[k]]
        return ", ".join(f"{k} {_word(was[k])} → {_word(after[k])}" if k in was
                         else f"{k} {_word(after[k])}" for k in changed) or "no change"
    if before is None or before == {}:
        return _word(after)
    return f"{_word(before)} → {_word(after)}"


def _word(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return _compact(value) if isinstance(value, dict | list) else str(value)


def _compact(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def events_frame(events: list[EventPublic]) -> pd.DataFrame:
    cols = ["id", "ts", "actor", "kind", "target", "before", "after", "detail"]
    df = pd.DataFrame([(e.id, e.ts, e.actor, e.kind, e.target, e.before, e.after, e.detail)
                       for e in events], columns=cols)
    df["change"] = [change_in_words(e.before, e.after) for e in events]
    # Local wall-clock time for the table (charts keep UTC and let the browser localise).
    df["when"] = _when(df["ts"].to_numpy()).dt.tz_convert(_LOCAL).dt.tz_localize(None)
    for c in ("before", "after", "detail"):
        df[c] = df[c].map(_compact)
    return df[["when", "actor", "kind", "target", "change", "detail", "before", "after", "id"]]
