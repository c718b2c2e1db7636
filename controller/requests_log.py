"""A bounded buffer of finished request records and the statistics computed over it."""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import numpy as np

from controller.models import RequestPath, RequestRecord
from pdctl_api.stats import column_quantiles

COMPONENTS = ("queue_ms", "prefill_ms", "transfer_ms", "decode_sched_ms", "overhead_ms")
QUANTILES = (0.5, 0.9, 0.95, 0.99)
SUSPECT_PENDING = 1000  # handles reported before their request finished, kept this many


def percentiles(values: Iterable[float] | np.ndarray) -> dict[str, float]:
    """Nearest-rank p50/p90/p99 plus mean and max; zeros for no data."""
    return _summaries(np.asarray(list(values) if not isinstance(values, np.ndarray)
                                 else values, dtype=float).reshape(-1, 1))[0]


def _summaries(columns: np.ndarray) -> list[dict[str, float]]:
    """``percentiles`` of every column of a 2-D array at once."""
    if columns.shape[0] == 0:
        return [dict.fromkeys(("p50", "p90", "p95", "p99", "mean", "max"), 0.0)
                for _ in range(columns.shape[1])]
    q = column_quantiles(columns, QUANTILES)
    means, maxes = columns.mean(axis=0), columns.max(axis=0)
    return [{"p50": float(q[0, k]), "p90": float(q[1, k]), "p95": float(q[2, k]),
             "p99": float(q[3, k]), "mean": float(means[k]), "max": float(maxes[k])}
            for k in range(columns.shape[1])]


STATUSES = ("ok", "error", "cancelled", "rejected")
NUMERIC = ("started_at", "ttft_ms", *COMPONENTS, "prompt_tokens", "output_tokens", "itl_ms",
           "kv_bytes", "gap_p99_ms", "gap_max_ms", "gaps", "e2e_ms", "retries", "decided")
_numeric_row = attrgetter(*NUMERIC)
COL = {name: k for k, name in enumerate(NUMERIC)}


@dataclass(frozen=True)
class Columns:
    """A window of records as numpy columns: ``values[:, COL[name]]``, ``ok``, ``disagg``,
    and ``status`` (index into STATUSES, len(STATUSES) for anything else)."""

    values: np.ndarray
    status: np.ndarray
    disagg: np.ndarray

    @classmethod
    def from_records(cls, records: list[RequestRecord]) -> Columns:
        values = np.array([_numeric_row(r) for r in records], dtype=float)
        return cls(values.reshape(-1, len(NUMERIC)),
                   np.array([_status_code(r.status) for r in records], dtype=np.int8),
                   np.array([r.path is RequestPath.DISAGGREGATED for r in records], dtype=bool))

    def __len__(self) -> int:
        return int(self.values.shape[0])

    def col(self, name: str) -> np.ndarray:
        return self.values[:, COL[name]]

    @property
    def ok(self) -> np.ndarray:
        return self.status == 0

    def select(self, mask: np.ndarray) -> Columns:
        return Columns(self.values[mask], self.status[mask], self.disagg[mask])


def _status_code(status: str) -> int:
    return STATUSES.index(status) if status in STATUSES else len(STATUSES)


def _as_columns(records: Columns | list[RequestRecord]) -> Columns:
    return records if isinstance(records, Columns) else Columns.from_records(records)


class RequestLog:
    """The last ``maxlen`` records, kept twice: as objects (for ``/requests``) and as a ring
    of numpy rows (for aggregates, which then cost milliseconds at 100k records)."""

    def __init__(self, maxlen: int) -> None:
        self._records: deque[RequestRecord] = deque(maxlen=maxlen)
        self._maxlen = maxlen
        self._values = np.zeros((maxlen, len(NUMERIC)))
        self._status = np.zeros(maxlen, dtype=np.int8)
        self._disagg = np.zeros(maxlen, dtype=bool)
        self.total = 0
        self._suspect_later: deque[str] = deque(maxlen=SUSPECT_PENDING)
        self.since = time.time()  # unix time from which requests are recorded

    def covered(self, window_s: float, now: float | None = None) -> float:
        """Seconds of the last ``window_s`` during which requests were being recorded: a
        window longer than the log's life holds fewer requests than its length implies, so
        a rate divides by this, not by ``window_s``."""
        now = time.time() if now is None else now
        return max(0.0, min(window_s, now - self.since))

    def add(self, record: RequestRecord) -> None:
        self.since = min(self.since, record.started_at)
        if record.kv_handle is not None and record.kv_handle in self._suspect_later:
            record.suspect = True
            self._suspect_later.remove(record.kv_handle)
        self._records.append(record)
        i = self.total % self._maxlen
        self._values[i] = _numeric_row(record)
        self._status[i] = _status_code(record.status)
        self._disagg[i] = record.path is RequestPath.DISAGGREGATED
        self.total += 1

    def __len__(self) -> int:
        return len(self._records)

    def mark_suspect(self, kv_handle: str) -> None:
        """Mark the record whose decode hop read ``kv_handle``; one still being served is
        marked when it is added."""
        for rec in reversed(self._records):
            if rec.kv_handle == kv_handle:
                rec.suspect = True
                return
        self._suspect_later.append(kv_handle)

    def recent(self, limit: int, since: float | None = None, until: float | None = None
               ) -> list[RequestRecord]:
        """Newest first: at most ``limit`` records that started in ``[since, until)`` (either
        bound open when None). Like ``window`` it stops at the first record older than
        ``since``, counting back from the newest."""
        out: list[RequestRecord] = []
        for rec in reversed(self._records):
            if len(out) >= limit or (since is not None and rec.started_at < since):
                break
            if until is None or rec.started_at < until:
                out.append(rec)
        return out

    def find(self, request_id: str) -> RequestRecord | None:
        """The newest record of ``request_id`` still in the buffer, or None."""
        for rec in reversed(self._records):
            if rec.id == request_id:
                return rec
        return None

    def window(self, window_s: float, now: float | None = None) -> list[RequestRecord]:
        """Records that started within the last ``window_s`` seconds, oldest first."""
        cutoff = (time.time() if now is None else now) - window_s
        out: list[RequestRecord] = []
        for rec in reversed(self._records):
            if rec.started_at < cutoff:
                break
            out.append(rec)
        out.reverse()
        return out

    def columns(self, window_s: float, now: float | None = None) -> Columns:
        """The same window as ``window``, as columns, in completion order. Like ``window`` it
        stops at the first record older than the window, counting back from the newest."""
        cutoff = (time.time() if now is None else now) - window_s
        return _tail(self, lambda v: v[:, COL["started_at"]] >= cutoff)

    def between(self, window_s: float, end: float | None = None) -> tuple[Columns, float]:
        """Records that started in ``[end - window_s, end)`` (``end``: now by default), and
        the seconds of that window the log was recording (``covered``)."""
        now = time.time()
        end = now if end is None else min(end, now)
        cols = self.columns(window_s, end)
        if end < now:  # a window in the past: not what started after it
            cols = cols.select(cols.col("started_at") < end)
        return cols, self.covered(window_s, end)

    def finished(self, window_s: float, now: float | None = None) -> Columns:
        """Records that finished within the last ``window_s`` seconds (the log's order), as
        columns: a window's throughput, which a window by start time understates while its
        requests are still running."""
        cutoff = (time.time() if now is None else now) - window_s
        return _tail(self, lambda v: v[:, COL["started_at"]] + v[:, COL["e2e_ms"]] / 1e3
                     >= cutoff)


def _tail(log: RequestLog, keep: Any) -> Columns:
    n = len(log._records)
    order = np.arange(log.total - n, log.total) % log._maxlen
    older = np.flatnonzero(~keep(log._values[order]))
    rows = order[older[-1] + 1:] if older.size else order
    return Columns(log._values[rows], log._status[rows], log._disagg[rows])


def _kv(c: Columns, seconds: float) -> dict[str, float]:
    d = c.select(c.ok & c.disagg)
    kv_bytes = float(d.col("kv_bytes").sum())
    kv_ms = float(d.col("transfer_ms").sum())
    return {"bytes": kv_bytes, "bytes_per_s": kv_bytes / seconds if seconds > 0 else 0.0,
            "transfer_gbps": (kv_bytes / 1e9) / (kv_ms / 1e3) if kv_ms > 0 else 0.0}


def stats(records: Columns | list[RequestRecord], window_s: float, alert_share: float,
          covered_s: float | None = None) -> dict[str, Any]:
    """Aggregates of one window: rates, TTFT and component percentiles, KV transfer. Rates
    divide by ``covered_s``, the part of the window requests were recorded in (default: all
    of it)."""
    c = _as_columns(records)
    covered = window_s if covered_s is None else min(window_s, covered_s)
    ok = c.select(c.ok)
    fields = ("ttft_ms", *COMPONENTS, "prompt_tokens", "output_tokens")
    summary = dict(zip(fields, _summaries(np.stack([ok.col(f) for f in fields], axis=1)),
                       strict=True))
    d = ok.select(ok.disagg & (ok.col("ttft_ms") > 0))
    shares = d.col("transfer_ms") / d.col("ttft_ms")
    share = percentiles(shares)
    counts = np.bincount(c.status, minlength=len(STATUSES) + 1)
    by_status = {name: int(counts[k]) for k, name in enumerate(STATUSES) if counts[k]}
    if counts[-1]:
        by_status["other"] = int(counts[-1])
    itl = ok.col("itl_ms")
    streamed = ok.col("gaps") > 0
    failed = int(counts[STATUSES.index("error")] + counts[STATUSES.index("rejected")])
    return {
        "window_s": window_s,
        "covered_s": covered,
        "requests": len(c),
        "by_status": by_status,
        "request_rate": len(c) / covered if covered > 0 else 0.0,
        "error_rate": failed / len(c) if len(c) else 0.0,
        "output_tokens_per_s": float(ok.col("output_tokens").sum()) / covered
        if covered > 0 else 0.0,
        "disaggregated_share": float(ok.disagg.mean()) if len(ok) else 0.0,
        "ttft_ms": summary["ttft_ms"],
        "components_ms": {f.removesuffix("_ms"): summary[f] for f in COMPONENTS},
        "itl_ms": percentiles(itl[itl > 0]),
        "gap_p99_ms": percentiles(ok.col("gap_p99_ms")[streamed]),
        "gap_max_ms": percentiles(ok.col("gap_max_ms")[streamed]),
        "prompt_tokens": summary["prompt_tokens"],
        "output_tokens": summary["output_tokens"],
        "kv": _kv(c, covered),
        "transfer_share": {**share, "alert_share": alert_share,
                           "alert": bool(shares.size) and share["p50"] > alert_share},
        "by_path": {"disaggregated": _path(c, c.disagg), "colocated": _path(c, ~c.disagg)},
    }


def _path(c: Columns, mask: np.ndarray) -> dict[str, Any]:
    mine = c.select(mask)
    ok = mine.select(mine.ok)
    ttft, transfer = _summaries(np.stack([ok.col("ttft_ms"), ok.col("transfer_ms")], axis=1))
    return {"requests": len(mine),
            "failed": int((mine.status == STATUSES.index("error")).sum()),
            "retries": int(mine.col("retries").sum()), "ttft_ms": ttft, "transfer_ms": transfer}


def bucket_grid(window_s: float, step_s: float, now: float) -> tuple[float, int]:
    """``(first bucket's start, buckets)`` of a time series of ``step_s`` buckets ending at
    ``now`` and covering ``window_s`` (``/timeseries``, ``/utilization``)."""
    n = max(1, math.ceil(window_s / step_s))
    return now - n * step_s, n


def timeseries(records: Columns | list[RequestRecord], window_s: float, step_s: float,
               now: float) -> list[dict[str, Any]]:
    """Per-``step_s`` buckets over the last ``window_s`` seconds, oldest first: request rate,
    paths, errors, TTFT percentiles, mean TTFT parts (for stacking) and KV bandwidth."""
    c = _as_columns(records)
    start, n = bucket_grid(window_s, step_s, now)
    k = np.floor((c.col("started_at") - start) / step_s).astype(int)
    order = np.argsort(k, kind="stable")
    k = k[order]
    bounds = np.searchsorted(k, np.arange(n + 1), side="left")
    return [_bucket(start + b * step_s, step_s, c.select(order[bounds[b]:bounds[b + 1]]))
            for b in range(n)]


def _p50_p99(c: Columns, field: str) -> dict[str, float] | None:
    """p50 and p99 of ``field`` over ``c``; None without a record."""
    if not len(c):
        return None
    q = percentiles(c.col(field))
    return {"p50": q["p50"], "p99": q["p99"]}


def _bucket(t: float, step_s: float, c: Columns) -> dict[str, Any]:
    ok = c.select(c.ok)
    ttft, e2e = _summaries(np.stack([ok.col("ttft_ms"), ok.col("e2e_ms")], axis=1))
    streamed = ok.col("gaps") > 0
    gap_p99 = ok.col("gap_p99_ms")[streamed]
    n_disagg = int(ok.disagg.sum())
    kv = _kv(c, step_s)
    xfer = ok.select(ok.disagg).col("transfer_ms")
    xq = percentiles(xfer) if xfer.size else None
    return {
        "t": t,
        "requests": len(c),
        "rate": len(c) / step_s,
        "ok": len(ok),
        "errors": len(c) - len(ok),
        "disaggregated": n_disagg,
        "colocated": len(ok) - n_disagg,
        "decided_disaggregated": int((c.col("decided") == 1).sum()),
        "decided_local": int((c.col("decided") == 0).sum()),
        "ttft_ms": {q: ttft[q] for q in ("p50", "p90", "p99", "mean")},
        "gap_p99_ms": percentiles(gap_p99)["p99"] if gap_p99.size else None,
        "itl_ms": float(ok.col("itl_ms").mean()) if len(ok) else None,
        "parts_mean_ms": {f.removesuffix("_ms"): float(ok.col(f).mean()) if len(ok) else 0.0
                          for f in COMPONENTS},
        "kv_bytes": kv["bytes"],
        "kv_bytes_per_s": kv["bytes_per_s"],
        "transfer_gbps": kv["transfer_gbps"],
        "transfer_p50_ms": xq["p50"] if xq else None,
        "transfer_p99_ms": xq["p99"] if xq else None,
        "e2e_p50_ms": e2e["p50"] if len(ok) else None,
        "e2e_p99_ms": e2e["p99"] if len(ok) else None,
        "prompt_tokens_per_s": float(ok.col("prompt_tokens").sum()) / step_s,
        "output_tokens_per_s": float(ok.col("output_tokens").sum()) / step_s,
        "ttft_by_path": {"disaggregated": _p50_p99(ok.select(ok.disagg), "ttft_ms"),
                         "colocated": _p50_p99(ok.select(~ok.disagg), "ttft_ms")},
    }
