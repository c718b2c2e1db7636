"""The layout search from tables: which layouts it runs, which it ranks first, and that probes
over the budget are never candidates."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from controller.replay.trace import TraceRequest
from controller.whatif.layout import Layout
from controller.whatif.run import RunSpec
from controller.whatif.search import LayoutResult, Searcher, Space, rank

REQS = [TraceRequest(1, 0.0, 100, 10, (1,)), TraceRequest(2, 10.0, 100, 10, (2,))]


@dataclass
class Table:
    """A fake run: a layout's share within targets from a rule over its pools."""

    rule: Callable[[Layout], float]
    seen: list[Layout] = field(default_factory=list)

    def __call__(self, requests: list[TraceRequest], layout: Layout, spec: RunSpec) -> Any:
        self.seen.append(layout)
        share = self.rule(layout)
        return FakeResult(layout, share, round(share * len(requests)))


@dataclass
class FakeResult:
    layout: Layout
    attained: float
    good: int
    window_s: float = 10.0
    wall_s: float = 0.0

    def summary(self) -> dict[str, Any]:
        return {"ttft_ms": {"p50": 1.0, "p90": 2.0, "p99": 3.0}, "gap_p99_ms": 1.0}


def searcher(rule: Callable[[Layout], float], space: Space) -> tuple[Searcher, Table]:
    table = Table(rule)
    return Searcher(REQS, None, space, run=table), table  # type: ignore[arg-type]


def capacity(prefill_need: int, decode_need: int) -> Callable[[Layout], float]:
    """Meets when each pool has enough accelerators; colocated needs both on one pool."""
    def rule(lay: Layout) -> float:
        if not lay.disaggregated:
            return 1.0 if lay.decode_count * lay.decode_tp >= prefill_need + decode_need else 0.5
        ok = (lay.prefill_count * lay.prefill_tp >= prefill_need
              and lay.decode_count * lay.decode_tp >= decode_need)
        return 1.0 if ok else 0.5
    return rule


def test_the_smallest_meeting_layout_of_each_kind_is_found_and_ranked_first() -> None:
    s, table = searcher(capacity(2, 3), Space(budget=8, tps=(1, 2)))
    cands = s.search()
    best = cands[0]
    assert best.meets and best.layout.accelerators == 5
    assert all(c.layout.accelerators <= 8 for c in cands)  # probes are not candidates
    meeting = [c.layout for c in cands if c.meets]
    assert Layout(5, 1) in meeting  # colocated TP1: the smallest count that meets
    assert Layout(3, 1, 2, 1) in meeting and Layout(3, 1, 1, 2) in meeting
    assert not any(c.meets for c in cands[len(meeting):])
    assert len(table.seen) == len(set(table.seen))  # each layout run once


def test_the_search_runs_few_layouts_not_the_whole_space() -> None:
    space = Space(budget=32, tps=(1, 2, 4, 8))
    s, table = searcher(capacity(6, 10), space)
    s.search()
    every = sum(1 for tp in space.tps for n in range(1, 33) if n * tp <= 32) + sum(
        1 for p in space.tps for d in space.tps for a in range(1, 33) for b in range(1, 33)
        if a * p + b * d <= 32)
    assert len(table.seen) < every / 10


def test_a_layout_that_cannot_meet_within_the_budget_is_reported_as_missing() -> None:
    s, _ = searcher(capacity(20, 20), Space(budget=8, tps=(1,)))
    cands = s.search()
    assert cands and not any(c.meets for c in cands)


def test_rank_puts_meeting_layouts_first_by_goodput_per_accelerator() -> None:
    def cand(lay: Layout, meets: bool, share: float) -> LayoutResult:
        rate = share * 10
        return LayoutResult(lay, meets, share, rate, rate / lay.accelerators, {})

    small, big, bad = Layout(2, 1), Layout(4, 1), Layout(1, 1)
    order = rank([cand(bad, False, 0.5), cand(big, True, 0.99), cand(small, True, 0.95)])
    assert [c.layout for c in order] == [small, big, bad]


@pytest.mark.parametrize(("kw", "message"), [
    ({"budget": 0, "tps": (1,)}, "holds no instance"),
    ({"budget": 2, "tps": (4,)}, "more than the budget"),
    ({"budget": 2, "tps": (2,), "colocated": False}, "needs at least 4"),
    ({"budget": 8, "tps": (1,), "floor": 0.0}, "share within targets"),
])
def test_an_impossible_space_is_refused_with_the_reason(kw: dict[str, Any], message: str
                                                        ) -> None:
    with pytest.raises(ValueError, match=message):
        Space(**kw)
