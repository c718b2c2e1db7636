"""A bounded buffer of finished request records and the statistics computed over it."""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

from controller.models import RequestPath, RequestRecord

COMPONENTS = ("queue_ms", "prefill_ms", "transfer_ms", "decode_sched_ms", "overhead_ms")
QUANTILES = (0.5, 0.9, 0.99)


def percentiles(values: list[float]) -> dict[str, float]:
    """Nearest-rank p50/p90/p99 plus mean and max; zeros for no data."""
    if not values:
        return {"p50": 0.0, "p90": 0.0, "p99": 0.0, "mean": 0.0, "max": 0.0}
    s = sorted(values)
    out = {f"p{round(q * 100)}": s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]
           for q in QUANTILES}
    out["mean"] = sum(s) / len(s)
    out["max"] = s[-1]
    return out


class RequestLog:
    def __init__(self, maxlen: int) -> None:
        self._records: deque[RequestRecord] = deque(maxlen=maxlen)
        self.total = 0

    def add(self, record: RequestRecord) -> None:
        self._records.append(record)
        self.total += 1

    def __len__(self) -> int:
        return len(self._records)

    def recent(self, limit: int) -> list[RequestRecord]:
        """Newest first."""
        out: list[RequestRecord] = []
        for rec in reversed(self._records):
            if len(out) >= limit:
                break
            out.append(rec)
        return out

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


def stats(records: list[RequestRecord], window_s: float, alert_share: float
          ) -> dict[str, Any]:
    """Aggregates of one window: rates, TTFT and component percentiles, KV transfer."""
    ok = [r for r in records if r.status == "ok"]
    disagg = [r for r in ok if r.path is RequestPath.DISAGGREGATED]
    kv_bytes = sum(r.kv_bytes for r in disagg)
    kv_ms = sum(r.transfer_ms for r in disagg)
    shares = [r.transfer_ms / r.ttft_ms for r in disagg if r.ttft_ms > 0]
    share = percentiles(shares)
    by_status: dict[str, int] = {}
    for r in records:
        by_status[r.status] = by_status.get(r.status, 0) + 1
    return {
        "window_s": window_s,
        "requests": len(records),
        "by_status": by_status,
        "request_rate": len(records) / window_s if window_s > 0 else 0.0,
        "disaggregated_share": len(disagg) / len(ok) if ok else 0.0,
        "ttft_ms": percentiles([r.ttft_ms for r in ok]),
        "components_ms": {c.removesuffix("_ms"): percentiles([getattr(r, c) for r in ok])
                          for c in COMPONENTS},
        "itl_ms": percentiles([r.itl_ms for r in ok if r.itl_ms > 0]),
        "prompt_tokens": percentiles([float(r.prompt_tokens) for r in ok]),
        "output_tokens": percentiles([float(r.output_tokens) for r in ok]),
        "kv": {
            "bytes": kv_bytes,
            "bytes_per_s": kv_bytes / window_s if window_s > 0 else 0.0,
            "transfer_gbps": (kv_bytes / 1e9) / (kv_ms / 1e3) if kv_ms > 0 else 0.0,
        },
        "transfer_share": {**share, "alert_share": alert_share,
                           "alert": bool(shares) and share["p50"] > alert_share},
    }


def mean(values: Iterable[float]) -> float:
    vals = list(values)
    return sum(vals) / len(vals) if vals else 0.0


def timeseries(records: list[RequestRecord], window_s: float, step_s: float, now: float
               ) -> list[dict[str, Any]]:
    """Per-``step_s`` buckets over the last ``window_s`` seconds, oldest first: request rate,
    paths, errors, TTFT percentiles, mean TTFT parts (for stacking) and KV bandwidth."""
    n = max(1, math.ceil(window_s / step_s))
    start = now - n * step_s
    buckets: list[list[RequestRecord]] = [[] for _ in range(n)]
    for r in records:
        k = int((r.started_at - start) // step_s)
        if 0 <= k < n:
            buckets[k].append(r)
    return [_bucket(start + k * step_s, step_s, b) for k, b in enumerate(buckets)]


def _bucket(t: float, step_s: float, records: list[RequestRecord]) -> dict[str, Any]:
    ok = [r for r in records if r.status == "ok"]
    disagg = [r for r in ok if r.path is RequestPath.DISAGGREGATED]
    ttft = percentiles([r.ttft_ms for r in ok])
    kv_bytes = sum(r.kv_bytes for r in disagg)
    kv_ms = sum(r.transfer_ms for r in disagg)
    return {
        "t": t,
        "requests": len(records),
        "rate": len(records) / step_s,
        "ok": len(ok),
        "errors": len(records) - len(ok),
        "disaggregated": len(disagg),
        "colocated": len(ok) - len(disagg),
        "ttft_ms": {k: ttft[k] for k in ("p50", "p90", "p99", "mean")},
        "parts_mean_ms": {c.removesuffix("_ms"): mean(getattr(r, c) for r in ok)
                          for c in COMPONENTS},
        "kv_bytes": kv_bytes,
        "kv_bytes_per_s": kv_bytes / step_s,
        "transfer_gbps": (kv_bytes / 1e9) / (kv_ms / 1e3) if kv_ms > 0 else 0.0,
    }
