"""One discrete-event run: a trace's requests on one layout, and what they measured.

Requests arrive at their trace times divided by ``RunSpec.rate_scale`` (open loop, as
``pdctl replay`` sends them), their lengths fitted to the model's context as the replay fits
them. The run ends
when the last request has finished; every request finishes (the model has no failures).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from controller.config import RoutingSettings
from controller.replay.prompts import fit_context
from controller.replay.summary import met, rounded_quantiles, summarize
from controller.replay.trace import TraceRequest
from controller.whatif.engine import EngineShape
from controller.whatif.events import EventQueue
from controller.whatif.fleet import DesFleet, Goals, Outcomes
from controller.whatif.layout import Layout
from pdctl_api.schema.requests import PARTS


@dataclass(frozen=True)
class RunSpec:
    """Everything of a run but the layout and the traffic."""

    shape: EngineShape
    routing: RoutingSettings
    targets: Goals
    context: int | None = None  # tokens of context served (None: the model's)
    rate_scale: float = 1.0  # the trace's request rate multiplied (its times divided)


@dataclass
class RunResult:
    layout: Layout
    served: Outcomes
    window_s: float  # from the first arrival to the last (modelled seconds)
    span_s: float  # from the first arrival to the last finish
    busy_s: dict[str, float]  # modelled seconds each pool's engines spent in steps
    events: int
    wall_s: float  # what the run took on this machine
    targets: Goals

    @property
    def good(self) -> int:
        t = self.targets
        return sum(met(r, t.ttft_ms, t.gap_ms) for r in self.served.rows)

    @property
    def attained(self) -> float:
        """The share of requests within both targets."""
        return self.good / len(self.served.rows) if self.served.rows else 0.0

    def summary(self) -> dict[str, Any]:
        """``pdctl replay``'s summary of the rows, the TTFT parts' p50/p90/p99, pool busy."""
        out = summarize(self.served.rows, self.targets.ttft_ms, self.targets.gap_ms,
                        self.window_s or None)
        recs = self.served.records
        out["parts_ms"] = {part: part_quantiles([getattr(r, f"{part}_ms") for r in recs])
                           for part in PARTS}
        out["disaggregated"] = sum(1 for r in recs if r.prefill_instance is not None)
        out["busy_share"] = {pool: round(s / self.span_s, 4) if self.span_s else 0.0
                             for pool, s in self.busy_s.items()}
        return out


def part_quantiles(values: list[float]) -> dict[str, float | None]:
    return dict(zip(("p50", "p90", "p99"), rounded_quantiles(values, (0.5, 0.9, 0.99)),
                    strict=True))


def simulate(requests: list[TraceRequest], layout: Layout, spec: RunSpec,
             fast: bool = True) -> RunResult:
    """``fast``: runs of decode steps as one event each (the same results, sooner)."""
    run = Prepared(requests, layout, spec, fast)
    run.events.run()
    return run.result()


class Prepared:
    """A run set up: the fleet, and every arrival on the event queue (``events.run()`` plays
    it; a driver may put its own events beside them, such as a planner's passes)."""

    def __init__(self, requests: list[TraceRequest], layout: Layout, spec: RunSpec,
                 fast: bool = True) -> None:
        if not requests:
            raise ValueError("no requests to simulate")
        if spec.rate_scale <= 0:
            raise ValueError(f"rate scale must be positive, got {spec.rate_scale}")
        self.started = time.perf_counter()
        self.layout, self.spec = layout, spec
        self.events = events = EventQueue()
        self.fleet = fleet = DesFleet(events, layout, spec.shape, spec.routing, spec.targets,
                                      fast)
        context = spec.context or spec.shape.model.max_model_len
        t0 = requests[0].time_s
        self.last_due = 0.0
        for i, req in enumerate(requests):
            self.last_due = due = (req.time_s - t0) / spec.rate_scale
            events.at(due, fleet.arrive, i, req, fit_context(req, context), due)

    def result(self) -> RunResult:
        fleet = self.fleet
        if fleet.table.store is not None:
            fleet.table.store.close()
        served = fleet.served
        served.rows.sort(key=lambda r: r.index)
        busy: dict[str, float] = {}
        for engine in fleet.engines.values():
            pool = engine.instance.role.value
            busy[pool] = busy.get(pool, 0.0) + engine.busy_s
        return RunResult(self.layout, served, self.last_due, self.events.now, busy,
                         self.events.handled, time.perf_counter() - self.started,
                         self.spec.targets)
