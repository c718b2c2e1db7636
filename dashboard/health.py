"""The fleet's health at a glance, from the window's statistics against the operator's
targets (``/api/v1/targets``) and the pools' state: pure, so tests assert it from tables.

A target is *broken* when its figure is above it, *near* at 80 % of it or more. The status is
``breach`` when a target is broken or a pool is quarantined, ``warn`` when a figure is near its
target or a pool has not converged, ``no data`` without requests in the window, else ``ok``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pdctl_api.schema import ClusterPublic, StatsPublic, TargetsPublic

NEAR = 0.8
HealthStatus = Literal["ok", "warn", "breach", "no data"]


@dataclass(frozen=True)
class Check:
    name: str
    value: float | None  # None: nothing to measure it on (no streamed requests, say)
    target: float
    unit: str  # "ms" or "%"

    @property
    def broken(self) -> bool:
        return self.value is not None and self.value > self.target

    @property
    def near(self) -> bool:
        return self.value is not None and not self.broken and self.value >= NEAR * self.target

    def text(self) -> str:
        def fmt(x: float) -> str:
            return f"{x:.1%}" if self.unit == "%" else f"{x:,.0f} ms"
        if self.value is None:
            return f"{self.name}: no data (target {fmt(self.target)})"
        sign = ">" if self.broken else "≤"
        return f"{self.name} {fmt(self.value)} {sign} {fmt(self.target)}"


@dataclass(frozen=True)
class Health:
    status: HealthStatus
    checks: tuple[Check, ...]
    pools: tuple[str, ...]  # pool problems, in words


def checks(stats: StatsPublic, targets: TargetsPublic) -> tuple[Check, ...]:
    t = stats.ttft_ms
    gap = stats.gap_p99_ms
    streamed = gap is not None and gap.max > 0  # gaps exist only for streamed answers
    return (
        Check("TTFT p95", t.p95 if t.p95 is not None else t.p90, targets.ttft_p95_ms, "ms"),
        Check("TTFT p99", t.p99, targets.ttft_p99_ms, "ms"),
        Check("inter-token gap p99", gap.p99 if gap is not None and streamed else None,
              targets.gap_p99_ms, "ms"),
        Check("error rate", stats.error_rate, targets.error_rate, "%"),
    )


def pool_problems(cluster: ClusterPublic) -> tuple[str, ...]:
    out = []
    for role, pool in cluster.pools.items():
        if pool.quarantine is not None:
            out.append(f"{role} pool quarantined")
        elif not pool.converged:
            out.append(f"{role} pool converging: {pool.actual.ready_at_desired_tp} of "
                       f"{pool.desired.size} ready")
    return tuple(out)


def evaluate(stats: StatsPublic, targets: TargetsPublic, cluster: ClusterPublic) -> Health:
    found, pools = checks(stats, targets), pool_problems(cluster)
    quarantined = any("quarantined" in p for p in pools)
    if any(c.broken for c in found) or quarantined:
        status: HealthStatus = "breach"
    elif stats.requests == 0:
        status = "no data"
    elif any(c.near for c in found) or pools:
        status = "warn"
    else:
        status = "ok"
    return Health(status, found, pools)
