"""Prometheus alerting rules for the operator's service targets, so that alerts outlive the
console's page. The targets themselves are live (``PATCH /api/v1/targets``): the controller
exports them as gauges (``pdctl_target_*``), and each rule compares a measured figure with its
gauge, so the rules file never changes when a target does.

The figures, over the last ``WINDOW`` (from the controller's own histograms and counters):
TTFT p95 and p99 (``pdctl_ttft_seconds``), the p99 of every inter-token gap the router relayed
(``pdctl_itl_gap_seconds``; the console's figure is the p99 of each streamed request's own
p99, close but not the same), and the share of failed and refused requests
(``pdctl_requests_total``). A figure above its target for ``FOR`` fires.
"""

from __future__ import annotations

from typing import Any

WINDOW = "5m"
FOR = "2m"
RULES_FILE = "alerts.yml"
GROUP = "pdctl-targets"


def _quantile(q: float, metric: str) -> str:
    return f"histogram_quantile({q}, sum by (le) (rate({metric}_bucket[{WINDOW}])))"


ERROR_SHARE = (f'sum(rate(pdctl_requests_total{{status=~"error|rejected"}}[{WINDOW}])) '
               f"/ sum(rate(pdctl_requests_total[{WINDOW}]))")

# name -> (measured expression, target gauge, what it says)
FIGURES: dict[str, tuple[str, str, str]] = {
    "PdctlTtftP95AboveTarget": (_quantile(0.95, "pdctl_ttft_seconds"),
                                "pdctl_target_ttft_p95_seconds", "TTFT p95"),
    "PdctlTtftP99AboveTarget": (_quantile(0.99, "pdctl_ttft_seconds"),
                                "pdctl_target_ttft_p99_seconds", "TTFT p99"),
    "PdctlGapP99AboveTarget": (_quantile(0.99, "pdctl_itl_gap_seconds"),
                               "pdctl_target_gap_p99_seconds", "inter-token gap p99"),
    "PdctlErrorRateAboveTarget": (ERROR_SHARE, "pdctl_target_error_ratio", "error rate"),
}


def rules() -> dict[str, Any]:
    """The rules file (``promtool check rules`` accepts it; tests run ``promtool test``)."""
    out = []
    for name, (expr, target, what) in FIGURES.items():
        out.append({
            "alert": name,
            "expr": f"({expr}) > on() group_left() max({target})",
            "for": FOR,
            "labels": {"severity": "page" if "Error" in name or "P99" in name else "warn"},
            "annotations": {
                "summary": f"{what} above its target",
                "description": f"{what} over the last {WINDOW} is above the target set in "
                               "pdctl (GET /api/v1/targets); the alert's value is the "
                               "measured figure"},
        })
    return {"groups": [{"name": GROUP, "rules": out}]}
