"""A fake Prometheus behind a ``requests`` adapter: answers ``/api/v1/query_range`` and
``/api/v1/query`` for the console's own queries (``dashboard.prom.QUERIES``) with synthetic
series, refuses anything else the way Prometheus does (400, ``bad_data``), and records every
query."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

import requests
from requests.adapters import BaseAdapter

from dashboard import prom

PROM_URL = "http://fake-prometheus:9090"
PARTS = {"queue": 0.001, "prefill": 0.010, "transfer": 0.005, "decode_sched": 0.008,
         "overhead": 0.002}
ALERTS_PATH = "/api/v1/alerts"  # what ``queries`` records for a read of the firing alerts
ACTIVE_AT = "2026-12-03T14:02:05.5Z"  # when every fake alert began firing

Series = list[tuple[dict[str, str], float]]


def series_for(name: str) -> Series:
    """The labels and the (constant) value of each series a query returns."""
    table: dict[str, Series] = {
        "request_rate": [({"path": "disaggregated", "status": "ok"}, 4.0),
                         ({"path": "colocated", "status": "ok"}, 2.0),
                         ({"path": "disaggregated", "status": "error"}, 0.25),
                         ({"path": "colocated", "status": "cancelled"}, 0.25)],
        "ttft_p50": [({}, 0.020)], "ttft_p90": [({}, 0.030)], "ttft_p99": [({}, 0.045)],
        "part_mean": [({"component": c}, v) for c, v in PARTS.items()],
        "part_p99": [({"component": c}, 2 * v) for c, v in PARTS.items()],
        "kv_bytes_rate": [({}, 2.5e9)],
        "nixl_gbps": [({}, 40.0)], "accounted_gbps": [({}, float("nan"))],
    }
    return table[name]


def query_name(query: str) -> str | None:
    for name, template in prom.QUERIES.items():
        pattern = re.escape(template).replace(re.escape("{rate}"), r"\d+s")
        if re.fullmatch(pattern, query):
            return name
    return None


def _response(request: requests.PreparedRequest, status: int, body: Any) -> requests.Response:
    r = requests.Response()
    r.status_code = status
    r._content = json.dumps(body).encode()
    r.headers["Content-Type"] = "application/json"
    r.url = request.url or ""
    r.request = request
    return r


@dataclass
class FakePrometheus(BaseAdapter):
    reachable: bool = True
    queries: list[str] = field(default_factory=list)
    ranges: list[tuple[float, float, str]] = field(default_factory=list)
    firing: list[dict[str, str]] = field(default_factory=list)  # the firing alerts' labels

    def __post_init__(self) -> None:
        super().__init__()

    def client(self) -> prom.PromClient:
        return prom.PromClient(PROM_URL, adapter=self)

    def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:
        if not self.reachable:
            raise requests.ConnectionError("[Errno 111] Connection refused", request=request)
        url = urlsplit(request.url or "")
        if url.path == "/api/v1/alerts":
            self.queries.append(ALERTS_PATH)
            alerts = [{"labels": {"alertstate": "firing", **m}, "annotations": {},
                       "state": "firing", "activeAt": ACTIVE_AT, "value": "1.5e-01"}
                      for m in self.firing]
            return _response(request, 200, {"status": "success", "data": {"alerts": alerts}})
        q = {k: v[0] for k, v in parse_qs(url.query).items()}
        self.queries.append(q["query"])
        name = query_name(q["query"])
        if name is None:
            return _response(request, 400, {"status": "error", "errorType": "bad_data",
                                             "error": f"unknown query {q['query']!r}"})
        if url.path == "/api/v1/query":
            result = [{"metric": m, "value": [0, str(v)]} for m, v in series_for(name)]
            return _response(request, 200, {"status": "success", "data": {
                "resultType": "vector", "result": result}})
        start, end, step = float(q["start"]), float(q["end"]), q["step"]
        self.ranges.append((start, end, step))
        n = int((end - start) / float(step.removesuffix("s"))) + 1
        times = [start + k * float(step.removesuffix("s")) for k in range(n)]
        result = [{"metric": m, "values": [[t, str(v)] for t in times]}
                  for m, v in series_for(name)]
        return _response(request, 200, {"status": "success", "data": {
            "resultType": "matrix", "result": result}})

    def close(self) -> None:
        pass
