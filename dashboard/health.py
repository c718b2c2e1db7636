"""The fleet's health at a glance, from the window's statistics against the operator's
targets (``/api/v1/targets``) and the pools' state: pure, so tests assert it from tables.

A target is *broken* when its figure is above it, *near* at 80 % of it or more. The status is
``breach`` when a target is broken or a pool is quarantined, ``warn`` when a figure is near its
target, a pool has not converged or an instance failed in the window (replaced or not: an
engine that crashes every few minutes is not healthy), ``no data`` without requests in the
window, else ``ok``.

One clock: on a scaled simulation (``time_scale`` != 1, wall latency = scale x modelled) the
latencies are compared with the targets in modelled time, as the Planner compares them.
"""

from __future__ import annotations

from collections.abc import Sequence
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
    clock: str = ""  # "modelled" on a scaled simulation: the value is wall time / scale

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
        clock = f" ({self.clock})" if self.clock else ""
        return f"{self.name} {fmt(self.value)}{clock} {sign} {fmt(self.target)}"


@dataclass(frozen=True)
class Health:
    status: HealthStatus
    checks: tuple[Check, ...]
    pools: tuple[str, ...]  # pool problems, in words
    failures: tuple[str, ...] = ()  # instances failed in the window, in words


def checks(stats: StatsPublic, targets: TargetsPublic, time_scale: float = 1.0
           ) -> tuple[Check, ...]:
    t = stats.ttft_ms
    gap = stats.gap_p99_ms
    streamed = gap is not None and gap.max > 0  # gaps exist only for streamed answers
    per = 1.0 / time_scale  # wall ms -> modelled ms
    clock = "" if time_scale == 1.0 else "modelled"
    p95 = t.p95 if t.p95 is not None else t.p90
    return (
        Check("TTFT p95", p95 * per, targets.ttft_p95_ms, "ms", clock),
        Check("TTFT p99", t.p99 * per, targets.ttft_p99_ms, "ms", clock),
        Check("inter-token gap p99", gap.p99 * per if gap is not None and streamed else None,
              targets.gap_p99_ms, "ms", clock),
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


def evaluate(stats: StatsPublic, targets: TargetsPublic, cluster: ClusterPublic,
             failures: Sequence[str] = ()) -> Health:
    """``failures``: the instances that failed in the window, in words."""
    found, pools = checks(stats, targets, cluster.time_scale), pool_problems(cluster)
    quarantined = any("quarantined" in p for p in pools)
    if any(c.broken for c in found) or quarantined:
        status: HealthStatus = "breach"
    elif failures or any(c.near for c in found) or pools:
        status = "warn"
    elif stats.requests == 0:
        status = "no data"
    else:
        status = "ok"
    return Health(status, found, pools, tuple(failures))
