"""``pdctl plan``'s search: which layout serves a trace within its targets on the fewest
accelerators, by discrete-event runs. Decisions as data: ``search`` returns ``LayoutResult``s,
best first.

A layout *meets* the targets when at least ``floor`` of the requests have TTFT and their own
inter-token gap p99 within them (``RunResult.attained``). Its goodput is the requests within
targets per second of the trace's window; per accelerator, that over the layout's accelerators.
So among layouts that meet, the one with the fewest accelerators ranks first.

The space: colocated layouts (one pool, each TP) and disaggregated ones (prefill TP x decode
TP x hand-off policy) within the accelerator budget. Runs are kept few by the pools' roles:
for a colocated TP, the smallest count that meets (binary search: more instances never serve
worse); disaggregated, coordinate descent -- the smallest decode count that meets beside a
prefill pool of the whole budget, then the smallest prefill count that meets beside that.
Every run is cached by layout. Probes over the budget (the wide prefill pool) are never
candidates.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from controller.replay.trace import TraceRequest
from controller.router.handoff import DisaggPolicy
from controller.whatif.layout import Layout
from controller.whatif.run import RunResult, RunSpec, simulate

SearchProgress = Callable[[str], None]


@dataclass(frozen=True)
class Space:
    """What the operator allows: the accelerator budget, the TPs, the hand-off policies."""

    budget: int
    tps: tuple[int, ...]
    policies: tuple[DisaggPolicy, ...] = ("threshold",)
    floor: float = 0.9  # share of requests within targets for a layout to meet them
    colocated: bool = True
    disaggregated: bool = True

    def __post_init__(self) -> None:
        if self.budget < 1:
            raise ValueError(f"an accelerator budget of {self.budget} holds no instance")
        if not self.tps or min(self.tps) < 1:
            raise ValueError("give at least one tensor parallelism, each at least 1")
        if not 0 < self.floor <= 1:
            raise ValueError(f"the share within targets must be in (0, 1], got {self.floor}")
        if min(self.tps) > self.budget:
            raise ValueError(f"the smallest TP ({min(self.tps)}) is more than the budget "
                             f"of {self.budget} accelerators")
        if self.disaggregated and not self.colocated and 2 * min(self.tps) > self.budget:
            raise ValueError(f"a disaggregated layout needs at least {2 * min(self.tps)} "
                             f"accelerators (a prefill and a decode instance); the budget "
                             f"is {self.budget}")


@dataclass(frozen=True)
class LayoutResult:
    layout: Layout
    meets: bool
    attained: float  # share of requests within targets
    goodput_per_s: float
    per_accelerator: float  # goodput per second per accelerator
    summary: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {"layout": self.layout.as_dict(), "label": self.layout.label,
                "meets": self.meets, "attained": round(self.attained, 4),
                "goodput_per_s": round(self.goodput_per_s, 4),
                "goodput_per_accelerator": round(self.per_accelerator, 5),
                "summary": self.summary}


def layout_result(result: RunResult, floor: float) -> LayoutResult:
    good = result.good
    rate = good / result.window_s if result.window_s > 0 else float(good)
    return LayoutResult(result.layout, result.attained >= floor, result.attained, rate,
                     rate / result.layout.accelerators, result.summary())


def rank(cands: Sequence[LayoutResult]) -> list[LayoutResult]:
    """Meeting layouts first, by goodput per accelerator (ties: fewer accelerators, then
    colocated before disaggregated); then the rest by share within targets."""
    return sorted(cands, key=lambda c: (not c.meets, -c.per_accelerator if c.meets
                                        else -c.attained, c.layout.accelerators,
                                        c.layout.disaggregated, c.layout.label))


class Searcher:
    def __init__(self, requests: list[TraceRequest], spec: RunSpec, space: Space,
                 progress: SearchProgress | None = None,
                 run: Callable[[list[TraceRequest], Layout, RunSpec], RunResult] = simulate
                 ) -> None:
        self.requests = requests
        self.spec = spec
        self.space = space
        self.progress = progress or (lambda _msg: None)
        self._run = run
        self.runs: dict[Layout, LayoutResult] = {}

    def evaluate(self, layout: Layout) -> LayoutResult:
        got = self.runs.get(layout)
        if got is None:
            result = self._run(self.requests, layout, self.spec)
            got = self.runs[layout] = layout_result(result, self.space.floor)
            verdict = "meets" if got.meets else "misses"
            self.progress(f"run {len(self.runs):>3}: {layout.label:<48} {got.attained:6.1%} "
                          f"within targets ({verdict}) [{result.wall_s:.1f} s]")
        return got

    def smallest(self, make: Callable[[int], Layout], low: int, high: int) -> Layout | None:
        """The smallest count in [low, high] whose layout meets (None: not even ``high``)."""
        if high < low or not self.evaluate(make(high)).meets:
            return None
        while low < high:
            mid = (low + high) // 2
            if self.evaluate(make(mid)).meets:
                high = mid
            else:
                low = mid + 1
        return make(high)

    def colocated(self, tp: int) -> None:
        self.smallest(lambda n: Layout(n, tp), 1, self.space.budget // tp)

    def disaggregated(self, ptp: int, dtp: int, policy: DisaggPolicy) -> None:
        budget = self.space.budget
        if ptp + dtp > budget:
            return

        def layout(p: int, d: int) -> Layout:
            return Layout(d, dtp, p, ptp, policy)

        # A probe: decode counts beside the budget's worth of prefill instances (a layout
        # over the budget, never a candidate), so that only the decode pool limits.
        wide = budget // ptp
        found = self.smallest(lambda d: layout(wide, d), 1, (budget - ptp) // dtp)
        if found is None:
            return
        d = found.decode_count
        self.smallest(lambda p: layout(p, d), 1, (budget - d * dtp) // ptp)

    def search(self) -> list[LayoutResult]:
        s = self.space
        if s.colocated:
            for tp in s.tps:
                self.colocated(tp)
        if s.disaggregated:
            for policy in s.policies:
                for ptp in s.tps:
                    for dtp in s.tps:
                        self.disaggregated(ptp, dtp, policy)
        return rank([c for c in self.runs.values() if c.layout.accelerators <= s.budget])


def search(requests: list[TraceRequest], spec: RunSpec, space: Space,
           progress: SearchProgress | None = None) -> list[LayoutResult]:
    if not requests:
        raise ValueError("the trace has no requests to plan for")
    return Searcher(requests, spec, space, progress).search()
