"""The console's time series from Prometheus: the PromQL of every panel (the Grafana dashboard
uses the same expressions), range queries through ``prometheus-api-client``, and frames shaped
like ``dashboard.frames``'s so the same chart builders draw them. No Streamlit here.

Each expression has a ``{rate}`` placeholder for its rate window (Grafana's
``$__rate_interval``); the console uses ``rate_window(step)``: at least ``PROM_RATE_MIN_S``
and two query steps. ``PROM_RATE_MIN_S`` is Grafana's ``$__rate_interval`` floor for the
lab's 10 s scrape interval (4 x 10 s: four scrapes, so a rate survives a missed one), so the
console and the Grafana dashboard draw the same series.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pandas as pd
import requests
from prometheus_api_client import PrometheusApiClientException, PrometheusConnect
from urllib3.util.retry import Retry

from dashboard.frames import PART_LABELS, PERCENTILES

PromResult = list[dict[str, Any]]  # a query's series, as Prometheus's API sends them
PROM_RATE_MIN_S = 40.0
HISTOGRAM_QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}  # of the TTFT histogram


def _ttft_quantile(q: float) -> str:
    return f"histogram_quantile({q}, sum by (le) (rate(pdctl_ttft_seconds_bucket[{{rate}}])))"


QUERIES: dict[str, str] = {
    "request_rate": "sum by (path, status) (rate(pdctl_requests_total[{rate}]))",
    **{f"ttft_{p}": _ttft_quantile(q) for p, q in HISTOGRAM_QUANTILES.items()},
    "part_mean": "sum by (component) (rate(pdctl_ttft_component_seconds_sum[{rate}])) / "
                 "sum by (component) (rate(pdctl_ttft_component_seconds_count[{rate}]))",
    "part_p99": "histogram_quantile(0.99, sum by (component, le) "
                "(rate(pdctl_ttft_component_seconds_bucket[{rate}])))",
    "kv_bytes_rate": "sum(rate(pdctl_kv_transfer_bytes_total[{rate}]))",
    "nixl_gbps": "sum(rate(vllm:nixl_bytes_transferred_sum[{rate}])) / "
                 "sum(rate(vllm:nixl_xfer_time_seconds_sum[{rate}])) / 1e9",
    "accounted_gbps": "sum(rate(pdctl_kv_transfer_bytes_total[{rate}])) / "
                      "sum(rate(pdctl_kv_transfer_seconds_sum[{rate}])) / 1e9",
}


def expr(name: str, rate: str) -> str:
    """The PromQL of query ``name`` with its rate window (``"40s"``, ``"$__rate_interval"``)."""
    return QUERIES[name].replace("{rate}", rate)


def prom_duration(seconds: float) -> str:
    """A PromQL duration: whole seconds, rounded up, at least one (``"40s"``)."""
    return f"{max(1, math.ceil(seconds))}s"


def rate_window(step_s: float) -> str:
    return prom_duration(max(PROM_RATE_MIN_S, 2 * step_s))


class PromError(Exception):
    """A Prometheus query that did not succeed: unreachable, or refused with a reason."""

    def __init__(self, url: str, detail: str) -> None:
        super().__init__(f"{url}: {detail}")
        self.url = url
        self.detail = detail


class PromClient:
    """One Prometheus. ``adapter`` lets tests put a fake Prometheus behind it."""

    def __init__(self, url: str, timeout_s: float = 5.0,
                 adapter: requests.adapters.BaseAdapter | None = None) -> None:
        self.url = url.rstrip("/")
        self.cache_key = self.url
        session = self._session = requests.Session()
        self._timeout_s = timeout_s
        # No retries: a live card refreshes every few seconds anyway.
        self._conn = PrometheusConnect(self.url, session=session, retry=Retry(total=0),
                                       timeout=int(math.ceil(timeout_s)))
        if adapter is not None:
            session.mount(self.url, adapter)
            self.cache_key = f"{self.url}#{id(adapter):x}"

    def close(self) -> None:
        self._conn.close()

    def range(self, query: str, start: float, end: float, step_s: float) -> PromResult:
        """``query_range`` from ``start`` to ``end`` (Unix seconds) every ``step_s``."""
        t0, t1 = (datetime.fromtimestamp(t, tz=UTC) for t in (start, end))
        return self._call(lambda: self._conn.custom_query_range(query, t0, t1,
                                                                step=prom_duration(step_s)))

    def alerts(self) -> list[dict[str, Any]]:
        """The alerts firing (``/api/v1/alerts``): ``labels``, ``activeAt`` (unix s) and
        ``value`` (the rule's expression when it last fired) of each."""
        def call() -> list[dict[str, Any]]:
            r = self._session.get(f"{self.url}/api/v1/alerts", timeout=self._timeout_s)
            r.raise_for_status()
            return list(r.json()["data"]["alerts"])
        rows = self._call(call)
        return [{"labels": a.get("labels", {}), "activeAt": _unix(a.get("activeAt")),
                 "value": a.get("value")} for a in rows if a.get("state") == "firing"]

    def instant(self, query: str) -> PromResult:
        return self._call(lambda: self._conn.custom_query(query))

    def _call(self, fn: Callable[[], Any]) -> PromResult:
        try:
            result = fn()
        except requests.RequestException as exc:
            raise PromError(self.url, f"{type(exc).__name__}: {exc}") from None
        except (PrometheusApiClientException, ValueError, KeyError, TypeError) as exc:
            raise PromError(self.url, str(exc)[:300]) from None
        return list(result)


def _unix(rfc3339: Any) -> float:
    """Prometheus's ``2026-12-03T14:02:05.123456789Z`` as unix seconds (0 when absent)."""
    if not isinstance(rfc3339, str) or not rfc3339:
        return 0.0
    head, _, frac = rfc3339.rstrip("Z").partition(".")
    base = datetime.fromisoformat(head).replace(tzinfo=UTC).timestamp()
    return base + (float(f"0.{frac.split('+')[0]}") if frac else 0.0)


@dataclass(frozen=True)
class PromRange:
    """A range query: the last ``window_s`` seconds up to ``end``, a point every ``step_s``."""

    end: float
    window_s: float
    step_s: float

    @property
    def start(self) -> float:
        return self.end - self.window_s

    @property
    def rate(self) -> str:
        return rate_window(self.step_s)


def fetch(client: PromClient, name: str, w: PromRange) -> PromResult:
    return client.range(expr(name, w.rate), w.start, w.end, w.step_s)


# ---- results -> frames (pure) ---------------------------------------------------------------

def long_frame(result: PromResult, label: str | None = None, scale: float = 1.0) -> pd.DataFrame:
    """``time, key, value`` rows of a range result; ``key`` is the series' ``label`` value.
    NaN points (no data in the rate window, 0/0) are dropped."""
    rows = []
    for series in result:
        key = series.get("metric", {}).get(label, "") if label else ""
        for t, v in series.get("values", []):
            value = float(v)
            if math.isfinite(value):
                rows.append((float(t), key, value * scale))
    df = pd.DataFrame(rows, columns=["t", "key", "value"])
    df["time"] = pd.to_datetime(df["t"], unit="s", utc=True)
    return df[["time", "key", "value"]]


def percentiles_frame(results: dict[str, PromResult]) -> pd.DataFrame:
    """TTFT percentile lines (``time, percentile, ms``) from the ``ttft_p*`` queries."""
    parts = [long_frame(results[f"ttft_{p}"], scale=1e3).assign(percentile=p)
             for p in PERCENTILES]
    df = pd.concat(parts, ignore_index=True)
    return df.rename(columns={"value": "ms"})[["time", "percentile", "ms"]]


def parts_frame(result: PromResult) -> pd.DataFrame:
    """Per TTFT part (``time, part, ms``), from ``part_mean`` or ``part_p99``."""
    df = long_frame(result, "component", scale=1e3)
    df = df[df["key"].isin(list(PART_LABELS))]
    return pd.DataFrame({"time": df["time"], "part": df["key"].map(PART_LABELS),
                         "ms": df["value"]}).reset_index(drop=True)


def rate_frame(result: PromResult) -> pd.DataFrame:
    """Requests per second by path (``time, path, per_s``); every non-ok status is an error."""
    rows = []
    for series in result:
        m = series.get("metric", {})
        path = m.get("path", "") if m.get("status") == "ok" else "errors"
        one = long_frame([series])
        rows.append(pd.DataFrame({"time": one["time"], "path": path, "per_s": one["value"]}))
    if not rows:
        return pd.DataFrame({"time": pd.Series(dtype="datetime64[ns, UTC]"),
                             "path": pd.Series(dtype=str), "per_s": pd.Series(dtype=float)})
    df = pd.concat(rows, ignore_index=True)
    return df.groupby(["time", "path"], as_index=False)["per_s"].sum()


def kv_frame(result: PromResult, step_s: float) -> pd.DataFrame:
    """KV moved (``time, kv_gb_per_s, kv_bytes``; bytes per step) for ``charts.kv_throughput``."""
    df = long_frame(result)
    return pd.DataFrame({"time": df["time"], "kv_gb_per_s": df["value"] / 1e9,
                         "kv_bytes": df["value"] * step_s})


def bandwidth_frame(nixl: PromResult, accounted: PromResult) -> pd.DataFrame:
    """Achieved transfer bandwidth (``time, source, gbps``): the engines' NIXL counters, and
    the controller's accounted transfer time."""
    a = long_frame(nixl).assign(source="engines (NIXL)")
    b = long_frame(accounted).assign(source="controller (accounted)")
    df = pd.concat([a, b], ignore_index=True)
    return df.rename(columns={"value": "gbps"})[["time", "source", "gbps"]]
