"""The planner rehearsed on a trace: the discrete-event fleet (``controller.whatif``) serves the
trace while the planner's own ``observe`` -> predict -> ``decide`` runs every interval of
modelled time and its decisions resize the pools, new instances taking requests only after
an engine's start time and surplus ones draining. What the live planner does against a fleet
in minutes of wall time per modelled minute, this does for a trace hour in about a minute.

What it measures: each request's TTFT parts (the controller's accounting), the share within the
targets, the accelerator-seconds the pools held (starting and draining instances count) against
a fixed fleet of the largest layout the planner asked for, and every pass as a ``Tick``.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from controller.models import Instance, InstanceState, Role
from controller.planner.decide import (
    Bounds,
    PlannerTargets,
    Pools,
    ScaleDecision,
    decide,
    stability_at,
)
from controller.planner.lookahead import Foresight, Lookahead, Present, look_ahead
from controller.planner.observe import Window, observe
from controller.planner.predict import LoadPredictor, PredictorName
from controller.planner.profile import PerfProfile
from controller.replay.trace import TraceRequest
from controller.requests_log import Columns
from controller.whatif.layout import Layout
from controller.whatif.run import Prepared, RunResult, RunSpec
from pdctl_api.stats import quantile


@dataclass(frozen=True)
class Rehearsal:
    """How the planner runs (the live planner's settings, in modelled seconds)."""

    targets: PlannerTargets
    bounds: Bounds = Bounds()
    interval_s: float = 60.0
    start_s: float = 60.0  # from a scale-up to the new instance taking requests
    predictor: PredictorName = "constant"
    min_requests: int = 10
    scale_down_utilization: float = 0.7
    cooldown_s: float | None = None  # None: two intervals
    lookahead: Lookahead | None = None  # None: the planner alone


@dataclass(frozen=True)
class Tick:
    """One planner pass."""

    at: float
    prefill: int  # the pools' sizes before it
    decode: int
    recommended: tuple[int, int]
    applied: bool
    hold: str | None
    rate: float  # observed requests/s (arrived) over the interval
    ttft_p95_ms: float
    foresight: Foresight | None = None


@dataclass
class Rehearsed:
    run: RunResult
    ticks: list[Tick] = field(default_factory=list)
    accelerator_seconds: float = 0.0
    peak_accelerators: int = 0  # the largest layout the planner asked for
    targets: PlannerTargets = PlannerTargets(2000.0, 60.0)

    @property
    def ttft_share(self) -> float:
        """The share of requests whose TTFT met the planner's target."""
        rows = self.run.served.rows
        target = self.targets.ttft_ms
        return sum(1 for r in rows if r.ok and r.ttft_ms is not None
                   and r.ttft_ms <= target) / len(rows) if rows else 0.0

    @property
    def peak_accelerator_seconds(self) -> float:
        """A fixed fleet of the peak layout over the same span."""
        return self.peak_accelerators * self.run.span_s

    @property
    def cost_ratio(self) -> float:
        peak = self.peak_accelerator_seconds
        return self.accelerator_seconds / peak if peak else 0.0

    @property
    def changes(self) -> int:
        return sum(1 for t in self.ticks if t.applied)


def rehearse(requests: list[TraceRequest], spec: RunSpec, start: Layout, plan: Rehearsal,
             prefill_profile: PerfProfile, decode_profile: PerfProfile,
             progress: Callable[[Tick], None] | None = None) -> Rehearsed:
    """Serve ``requests`` from ``start`` with the planner in apply mode."""
    run = Prepared(requests, start, spec)
    driver = _Driver(run, plan, prefill_profile, decode_profile, requests, progress)
    run.events.at(plan.interval_s, driver.tick)
    run.events.run()
    result = run.result()
    fleet = run.fleet
    return Rehearsed(result, driver.ticks, fleet.accelerator_seconds(run.events.now),
                     driver.peak, plan.targets)


class _Driver:
    def __init__(self, run: Prepared, plan: Rehearsal, pp: PerfProfile, dp: PerfProfile,
                 requests: list[TraceRequest], progress: Callable[[Tick], None] | None
                 ) -> None:
        self.run, self.plan, self.pp, self.dp = run, plan, pp, dp
        self.requests, self.progress = requests, progress
        self.fleet = run.fleet
        self.fleet.gap_log = []
        self.predictor = LoadPredictor(plan.predictor)
        self.ticks: list[Tick] = []
        self.seen = 0  # records read by earlier passes
        self.arrived = (0, 0)
        self.changed_at: float | None = None
        layout = run.layout
        self.pools = Pools(layout.prefill_count, layout.prefill_tp, layout.decode_count,
                           layout.decode_tp)
        self.peak = self.pools.accelerators()
        self.t0 = requests[0].time_s
        self.times = [r.time_s for r in requests]

    def tick(self) -> None:
        fleet, plan, now = self.fleet, self.plan, self.run.events.now
        records = fleet.served.records
        new, self.seen = records[self.seen:], len(records)
        gaps, fleet.gap_log = fleet.gap_log or [], []
        arrived = (fleet.arrived[0] - self.arrived[0], fleet.arrived[1] - self.arrived[1])
        self.arrived = (fleet.arrived[0], fleet.arrived[1])
        gap_p95 = quantile(np.asarray(gaps), 0.95) if gaps else None
        window = Window(plan.interval_s, Columns.from_records(new), gap_p95,
                        _ready(fleet.live(Role.DECODE)), _ready(fleet.live(Role.PREFILL)),
                        arrived[0], arrived[1])
        obs = observe(window)
        enough = obs.requests >= plan.min_requests
        if enough:
            self.predictor.update(obs.load)
        pred = self.predictor.predict()
        pools = self.pools
        starting = any(i.state is InstanceState.STARTING
                       for role in Role for i in fleet.members[role])
        stab = stability_at(now, starting, self.changed_at, plan.interval_s, plan.cooldown_s,
                            plan.scale_down_utilization)
        decision: ScaleDecision = decide(obs if enough else None, pred, self.pp, self.dp,
                                         plan.targets, plan.bounds, pools, stab,
                                         plan.min_requests)
        want = (decision.prefill, decision.decode)
        foresight = None
        if plan.lookahead is not None and decision.hold is None and pred is not None:
            recent = self._recent(now, plan.lookahead.window_s)
            if len(recent) >= plan.min_requests:
                rate_scale = pred.request_rate / max(obs.load.request_rate, 1e-9) \
                    if enough else 1.0
                span = min(now, plan.lookahead.window_s) * self.run.spec.rate_scale
                present = Present(pools, self._backlog(), plan.start_s, span)
                foresight = look_ahead(recent, want, present, self.run.spec, plan.lookahead,
                                       plan.bounds, plan.targets.ttft_ms, rate_scale,
                                       may_shrink=not stab.cooling_down)
                want = (foresight.prefill, foresight.decode)
        applied = decision.hold is None and want != (pools.prefill, pools.decode)
        tick = Tick(now, pools.prefill, pools.decode, want, applied, decision.hold,
                    obs.load.request_rate, obs.ttft_p95_ms, foresight)
        self.ticks.append(tick)
        if applied:
            self._apply(want)
        if self.progress is not None:
            self.progress(tick)
        if len(records) < len(self.requests):
            self.run.events.at(now + plan.interval_s, self.tick)

    def _apply(self, want: tuple[int, int]) -> None:
        pools, fleet, now = self.pools, self.fleet, self.run.events.now
        # the shrinking pool first, as the live planner orders it
        order = sorted(((want[0] - pools.prefill, Role.PREFILL, want[0]),
                        (want[1] - pools.decode, Role.DECODE, want[1])), key=lambda x: x[0])
        for delta, role, count in order:
            if delta:
                fleet.resize(role, count, self.plan.start_s)
        self.pools = Pools(want[0], pools.prefill_tp, want[1], pools.decode_tp)
        self.peak = max(self.peak, self.pools.accelerators())
        self.changed_at = now

    def _backlog(self) -> list[TraceRequest]:
        """The requests that arrived and have not finished."""
        done = {row.index for row in self.fleet.served.rows}
        return [r for i, r in enumerate(self.requests[:self.fleet.arrived[0]])
                if i not in done]

    def _recent(self, now: float, window_s: float) -> list[TraceRequest]:
        """The requests that arrived in the last ``window_s`` (the traffic the look-ahead
        replays), as the trace gave them."""
        scale = self.run.spec.rate_scale
        lo = bisect.bisect_left(self.times, self.t0 + (now - window_s) * scale)
        hi = bisect.bisect_left(self.times, self.t0 + now * scale)
        return self.requests[lo:hi]


def _ready(instances: list[Instance]) -> list[Instance]:
    return [i for i in instances if i.state.routable]

