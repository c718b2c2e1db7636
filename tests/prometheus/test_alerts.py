"""The alerting rules for the service targets, under ``promtool test rules``: synthetic
series of the controller's own metrics, and which alerts fire (and which stay quiet) after
their ``for``. The rules read the targets from the controller's ``pdctl_target_*`` gauges, so a
target changed through the API moves the threshold without touching the rules file."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from controller.obs import alerts

# 1 request/s for 10 minutes: TTFTs in the (0.5, 1] s bucket, so p95 and p99 interpolate
# inside it; 5 % of the requests fail; every gap in (0.05, 0.1].
SERIES = [
    {"series": 'pdctl_ttft_seconds_bucket{path="disaggregated",le="0.5"}',
     "values": "0+0x20"},
    {"series": 'pdctl_ttft_seconds_bucket{path="disaggregated",le="1"}',
     "values": "0+30x20"},
    {"series": 'pdctl_ttft_seconds_bucket{path="disaggregated",le="+Inf"}',
     "values": "0+30x20"},
    {"series": 'pdctl_itl_gap_seconds_bucket{le="0.05"}', "values": "0+0x20"},
    {"series": 'pdctl_itl_gap_seconds_bucket{le="0.1"}', "values": "0+300x20"},
    {"series": 'pdctl_itl_gap_seconds_bucket{le="+Inf"}', "values": "0+300x20"},
    {"series": 'pdctl_requests_total{path="disaggregated",status="ok"}',
     "values": "0+28.5x20"},
    {"series": 'pdctl_requests_total{path="disaggregated",status="error"}',
     "values": "0+1.5x20"},
]


def case(targets: dict[str, float], firing: list[str]) -> dict[str, object]:
    gauges = [{"series": name, "values": f"{value}x20"} for name, value in targets.items()]
    return {
        "interval": "30s",
        "input_series": SERIES + gauges,
        "alert_rule_test": [
            {"eval_time": "9m", "alertname": name,
             "exp_alerts": [{"exp_labels": {"severity": rule["labels"]["severity"]},
                             "exp_annotations": rule["annotations"]}]
             if name in firing else []}
            for name, rule in ((r["alert"], r) for r in alerts.rules()["groups"][0]["rules"])],
    }


def run(promtool: str, tmp_path: Path, tests: list[dict[str, object]]) -> str:
    rules = tmp_path / "alerts.yml"
    rules.write_text(yaml.safe_dump(alerts.rules(), sort_keys=False))
    spec = tmp_path / "alerts_test.yml"
    spec.write_text(yaml.safe_dump({"rule_files": [str(rules)], "evaluation_interval": "30s",
                                    "tests": tests}, sort_keys=False))
    out = subprocess.run([promtool, "test", "rules", str(spec)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_rules_pass_promtool_check(promtool: str, tmp_path: Path) -> None:
    rules = tmp_path / "alerts.yml"
    rules.write_text(yaml.safe_dump(alerts.rules(), sort_keys=False))
    out = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and "4 rules found" in out.stdout, out.stdout + out.stderr


def test_each_figure_fires_only_above_its_target(promtool: str, tmp_path: Path) -> None:
    loose = {"pdctl_target_ttft_p95_seconds": 2.0, "pdctl_target_ttft_p99_seconds": 5.0,
             "pdctl_target_gap_p99_seconds": 0.15, "pdctl_target_error_ratio": 0.10}
    tight = {"pdctl_target_ttft_p95_seconds": 0.6, "pdctl_target_ttft_p99_seconds": 0.7,
             "pdctl_target_gap_p99_seconds": 0.05, "pdctl_target_error_ratio": 0.01}
    run(promtool, tmp_path, [
        case(loose, []),  # every figure under its target: nothing fires
        case(tight, list(alerts.FIGURES)),  # every figure above: all four fire
        case({**loose, "pdctl_target_error_ratio": 0.01}, ["PdctlErrorRateAboveTarget"]),
        case({**loose, "pdctl_target_ttft_p99_seconds": 0.9}, ["PdctlTtftP99AboveTarget"]),
    ])
