"""The health status from the window's figures, the targets and the pools, from tables."""

from __future__ import annotations

import pytest

from dashboard import health
from pdctl_api.schema import ClusterPublic, StatsPublic, TargetsPublic
from tests.dashboard.fake import FakeController

TARGETS = TargetsPublic(ttft_p95_ms=1000.0, ttft_p99_ms=2000.0, gap_p99_ms=100.0,
                        error_rate=0.01)


def stats(p95: float = 500.0, p99: float = 900.0, gap: float | None = 40.0,
          errors: float = 0.0, requests: int = 100) -> StatsPublic:
    pct = {"p50": 1.0, "p90": 1.0, "mean": 1.0, "max": 1.0}
    return StatsPublic.model_validate({
        "window_s": 60.0, "requests": requests, "by_status": {}, "request_rate": 1.0,
        "error_rate": errors, "disaggregated_share": 1.0,
        "ttft_ms": {**pct, "p95": p95, "p99": p99},
        "components_ms": {k: {**pct, "p99": 1.0} for k in
                          ("queue", "prefill", "transfer", "decode_sched", "overhead")},
        "itl_ms": {**pct, "p99": 1.0},
        "gap_p99_ms": None if gap is None else {**pct, "max": gap, "p99": gap},
        "prompt_tokens": {**pct, "p99": 1.0}, "output_tokens": {**pct, "p99": 1.0},
        "kv": {"bytes": 0, "bytes_per_s": 0, "transfer_gbps": 0},
        "transfer_share": {**pct, "p99": 0.1, "alert_share": 0.2, "alert": False},
        "pools": {}, "total_requests": requests})


def cluster(converged: bool = True) -> ClusterPublic:
    fake = FakeController()
    c = ClusterPublic.model_validate(fake.cluster())
    if not converged:
        c.pools["decode"] = c.pools["decode"].model_copy(update={"converged": False})
    return c


@pytest.mark.parametrize(("s", "converged", "status", "broken"), [
    (stats(), True, "ok", []),
    (stats(p95=850.0), True, "warn", []),  # within 80 % of its target
    (stats(), False, "warn", []),  # a pool still converging
    (stats(p95=1200.0), True, "breach", ["TTFT p95"]),
    (stats(p99=2500.0, gap=150.0), True, "breach", ["TTFT p99", "inter-token gap p99"]),
    (stats(errors=0.05), True, "breach", ["error rate"]),
    (stats(gap=None), True, "ok", []),  # no streamed requests: the gap is not judged
    (stats(requests=0, p95=0.0, p99=0.0, gap=None), True, "no data", []),
])
def test_status(s: StatsPublic, converged: bool, status: str, broken: list[str]) -> None:
    h = health.evaluate(s, TARGETS, cluster(converged))
    assert h.status == status
    assert [c.name for c in h.checks if c.broken] == broken


def test_check_texts() -> None:
    h = health.evaluate(stats(p95=1200.0, errors=0.005, gap=None), TARGETS, cluster(False))
    texts = [c.text() for c in h.checks]
    assert texts == ["TTFT p95 1,200 ms > 1,000 ms", "TTFT p99 900 ms ≤ 2,000 ms",
                     "inter-token gap p99: no data (target 100 ms)",
                     "error rate 0.5% ≤ 1.0%"]
    assert h.pools == ("decode pool converging: 1 of 1 ready",)


def test_an_instance_that_failed_in_the_window_is_not_healthy() -> None:
    """Replaced or not: an engine that crashes every few minutes must not read healthy."""
    h = health.evaluate(stats(), TARGETS, cluster(), ["decode-1 failed at 14:03:05"])
    assert h.status == "warn" and h.failures == ("decode-1 failed at 14:03:05",)
    quiet = health.evaluate(stats(requests=0, p95=0.0, p99=0.0, gap=None), TARGETS,
                            cluster(), ["decode-1 failed at 14:03:05"])
    assert quiet.status == "warn"  # no traffic, but a failure is still news


def test_one_clock_on_a_scaled_simulation() -> None:
    """Wall latency = time_scale x modelled: the targets are compared in modelled time, as the
    Planner compares them (a modelled p95 of 19 s used to read healthy at scale 0.05)."""
    scaled = cluster().model_copy(update={"time_scale": 0.05})
    h = health.evaluate(stats(p95=950.0, p99=990.0, gap=None), TARGETS, scaled)
    assert h.status == "breach"
    assert [c.text() for c in h.checks][:2] == ["TTFT p95 19,000 ms (modelled) > 1,000 ms",
                                                "TTFT p99 19,800 ms (modelled) > 2,000 ms"]
    assert health.evaluate(stats(p95=950.0, p99=990.0, gap=None), TARGETS,
                           cluster()).status == "warn"  # at wall speed: near, not broken
