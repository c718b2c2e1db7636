"""The planner scenario's timeline chart: a Vega-Lite page of the stepped load -- load,
pool sizes, TTFT and gap p95 against their targets, stacked
(``bench-results/planner-timeline.html``)."""

from __future__ import annotations

import json

from bench.scenarios.planner.model import PlannerOptions, PlannerStepResult


def timeline_chart(res: PlannerStepResult, o: PlannerOptions) -> str:
    """A Vega-Lite page: load, pool sizes, TTFT and gap p95 against the targets, stacked."""
    rows = []
    for iv in res.intervals:
        for series, value, panel in (
                ("observed rate", iv.rate, "requests/s"),
                ("predicted rate", iv.predicted, "requests/s"),
                ("prefill instances", iv.prefill, "instances"),
                ("decode instances", iv.decode, "instances"),
                ("TTFT p95 (ms)", iv.ttft_p95_ms, "TTFT p95 ms"),
                ("gap p95 (ms)", iv.gap_p95_ms, "gap p95 ms")):
            if value is not None:
                rows.append({"t": iv.t, "series": series, "value": value, "panel": panel})
    targets = [{"panel": "TTFT p95 ms", "target": o.ttft_ms},
               {"panel": "gap p95 ms", "target": o.itl_ms}]
    spec = {
        "$schema": "https://vega.github.io/schema/vega-lite/v5.json",
        "title": "pdctl SLA planner, apply mode: stepped load",
        "vconcat": [
            {"layer": [
                {"data": {"values": [r for r in rows if r["panel"] == panel]},
                 "mark": {"type": "line", "point": True,
                          "interpolate": "step-after" if panel == "instances" else "linear"},
                 "encoding": {"x": {"field": "t", "type": "quantitative",
                                    "title": "wall s since the load started"},
                              "y": {"field": "value", "type": "quantitative", "title": panel},
                              "color": {"field": "series", "type": "nominal"}}},
                *([{"data": {"values": [t for t in targets if t["panel"] == panel]},
                    "mark": {"type": "rule", "strokeDash": [4, 4]},
                    "encoding": {"y": {"field": "target", "type": "quantitative"}}}]
                  if panel.endswith("ms") else [])],
             "width": 720, "height": 140}
            for panel in ("requests/s", "instances", "TTFT p95 ms", "gap p95 ms")],
        "resolve": {"scale": {"color": "independent"}},
    }
    return ("<!doctype html><html><head><script src=\"https://cdn.jsdelivr.net/npm/vega@5\">"
            "</script><script src=\"https://cdn.jsdelivr.net/npm/vega-lite@5\"></script>"
            "<script src=\"https://cdn.jsdelivr.net/npm/vega-embed@6\"></script></head><body>"
            f"<div id=\"c\"></div><script>vegaEmbed('#c', {json.dumps(spec)});</script>"
            "</body></html>\n")
