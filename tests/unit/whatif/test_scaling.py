"""Pool changes inside a discrete-event run (new instances after their start time, surplus ones
drained), the look-ahead's decisions from small traces, and the planner rehearsed on a step."""

from __future__ import annotations

import math

import pytest

from controller.config import RoutingSettings
from controller.engines.sim.cost import step_duration
from controller.models import InstanceState, Role
from controller.planner.decide import Bounds, PlannerTargets, Pools
from controller.planner.lookahead import Lookahead, Present, look_ahead
from controller.planner.profile import ProfileIndex
from controller.planner.rehearse import Rehearsal, rehearse
from controller.replay.trace import TraceRequest
from controller.whatif.engine import EngineShape
from controller.whatif.fleet import Goals
from controller.whatif.layout import Layout
from controller.whatif.run import Prepared, RunSpec
from pdctl_api import profiles
from tests.unit.whatif.shapes import BOX, TINY, requests, shape

COLOCATED = RoutingSettings(disagg_min_prompt_tokens=100_000, decode_policy="round_robin")


def spec(routing: RoutingSettings = COLOCATED, **kw: int) -> RunSpec:
    return RunSpec(shape(**kw), routing, Goals(1e9, 1e9))


def test_a_new_instance_takes_requests_only_after_its_start_time() -> None:
    times = [0.5 * k for k in range(40)]
    run = Prepared(requests(times, 100, 2), Layout(1, 1), spec())
    run.fleet.resize(Role.DECODE, 2, 5.0)
    run.events.run()
    recs = run.result().served.records
    late = [r for r in recs if r.decode_instance == "decode-1"]
    assert len(recs) == 40 and late
    assert min(r.started_at for r in late) >= 5.0
    assert run.fleet.held["decode-1"] == [0.0, math.inf]  # held from the request to the end
    assert run.fleet.accelerator_seconds(20.0) == pytest.approx(20.0 + 20.0)


def test_a_surplus_instance_drains_its_requests_then_stops() -> None:
    run = Prepared(requests([0.0, 0.0, 0.0, 0.0, 3.0, 3.0], 100, 200), Layout(2, 1), spec())
    run.events.run(until=0.01)
    run.fleet.resize(Role.DECODE, 1, 5.0)
    gone = run.fleet.members[Role.DECODE][1]
    assert gone.state is InstanceState.DRAINING
    run.events.run()
    recs = run.result().served.records
    on_gone = [r for r in recs if r.decode_instance == gone.id]
    assert len(recs) == 6 and len(on_gone) == 2  # its own two finished; none came after
    assert all(r.started_at < 0.01 for r in on_gone)
    stopped = run.fleet.held[gone.id][1]
    assert gone.state is InstanceState.STOPPED
    assert stopped == pytest.approx(max(r.started_at + r.e2e_ms / 1e3 for r in on_gone))
    end = run.events.now
    assert run.fleet.accelerator_seconds(end) == pytest.approx(end + stopped)


def test_shrinking_gives_up_a_starting_instance_before_a_ready_one() -> None:
    run = Prepared(requests([0.0], 100, 2), Layout(1, 1), spec())
    run.fleet.resize(Role.DECODE, 2, 5.0)
    run.fleet.resize(Role.DECODE, 1, 5.0)
    ready, starting = run.fleet.members[Role.DECODE]
    assert ready.state is InstanceState.READY and starting.state is InstanceState.STOPPED
    run.events.run()
    assert run.fleet.held[starting.id] == [0.0, 0.0]


# ---- the look-ahead -------------------------------------------------------------------------

ONE = step_duration(TINY, BOX, 1, [(200, 0)], [])  # one request's whole service (1 token)


def overload(n: int = 300) -> list[TraceRequest]:
    """1.5 requests per service time: one serial engine falls behind without end, two keep up."""
    return requests([k * ONE / 1.5 for k in range(n)], 200, 1)


def present(prefill: int, decode: int, start_s: float = 0.0, span: float = 0.0) -> Present:
    return Present(Pools(prefill, 1, decode, 1), [], start_s, span)


def ahead(proposal: tuple[int, int], now: Present, bounds: Bounds | None = None,
          **kw: float) -> tuple[int, int, list[str]]:
    trace = overload()
    span = trace[-1].time_s + ONE / 1.5
    now = Present(now.pools, now.backlog, now.start_s, span)
    f = look_ahead(trace, proposal, now, spec(max_num_seqs=1), Lookahead(window_s=span, **kw),
                   bounds or Bounds(), 20 * ONE * 1e3)
    return f.prefill, f.decode, list(f.reasons)


def test_a_proposal_the_replay_misses_with_grows_the_pool_the_misses_waited_in() -> None:
    p, d, reasons = ahead((1, 1), present(1, 1))
    assert (p, d) == (1, 2)
    assert "misses waited in decode: 1 prefill + 2 decode" in reasons[1]


def test_a_proposal_larger_than_the_replay_needs_gives_one_of_each_back() -> None:
    p, d, reasons = ahead((1, 4), present(1, 4))
    assert (p, d) == (1, 3) and "one fewer suffices" in reasons[-1]


def test_the_bounds_stop_the_look_ahead_growing() -> None:
    p, d, reasons = ahead((1, 1), present(1, 1), Bounds(max_prefill=1, max_decode=1))
    assert (p, d) == (1, 1) and "bounds or the budget" in reasons[-1]


def test_growth_that_buys_nothing_stops() -> None:
    p, d, reasons = ahead((1, 1), present(1, 1), Bounds(max_decode=1))
    assert (p, d) == (1, 1) and "2 prefill + 1 decode keeps no more" in reasons[-1]


def test_without_shrinking_the_proposal_stands_when_it_meets() -> None:
    trace = overload()
    span = trace[-1].time_s + ONE / 1.5
    f = look_ahead(trace, (1, 3), present(1, 3, span=span), spec(max_num_seqs=1),
                   Lookahead(window_s=span),
                   Bounds(), 20 * ONE * 1e3, may_shrink=False)
    assert (f.prefill, f.decode) == (1, 3) and len(f.trials) == 1


# ---- the planner rehearsed --------------------------------------------------------------------


def test_the_planner_grows_the_pools_for_a_step_in_load_and_every_request_finishes() -> None:
    """A real model and the shipped sim profiles: 2 then 40 requests/s of 4,000-token prompts
    on Llama-3-8B (prefill TP1, decode TP1) from 1 + 1, interval 20 s, start 10 s."""
    low = [k / 2 for k in range(120)]  # 60 s at 2/s
    high = [60 + k / 40 for k in range(3600)]  # 90 s at 40/s
    trace = requests(low + high, 4000, 100)
    m = profiles.model("llama-3-8b")
    run_spec = RunSpec(EngineShape(m, profiles.hardware("h100-sxm"), profiles.link("ib-ndr")),
                       RoutingSettings(prefill_max_inflight=4), Goals(1e9, 1e9))
    index = ProfileIndex()
    pp = index.find("sim", "llama-3-8b", "h100-sxm", 1)
    assert pp is not None
    plan = Rehearsal(PlannerTargets(1000.0, 60.0), Bounds(max_prefill=16, max_decode=16),
                     interval_s=20.0, start_s=10.0)
    out = rehearse(trace, run_spec, Layout(1, 1, 1, 1), plan, pp, pp)
    rows = out.run.served.rows
    assert len(rows) == len(trace) and all(r.ok for r in rows)
    assert [t.at for t in out.ticks[:3]] == [20.0, 40.0, 60.0]
    grown = [t for t in out.ticks if t.applied and sum(t.recommended) > t.prefill + t.decode]
    assert grown and grown[0].at > 60.0  # the step at 60 s is what grew them
    assert out.changes == sum(1 for t in out.ticks if t.applied)
    assert out.peak_accelerators >= max(sum(t.recommended) for t in out.ticks)
    assert 2 * out.run.span_s < out.accelerator_seconds < out.peak_accelerator_seconds


def test_recent_requests_with_no_span_are_played_once_not_forever() -> None:
    trace = requests([0.0] * 12, 200, 1)
    f = look_ahead(trace, (1, 2), present(1, 2, span=0.0), spec(max_num_seqs=1),
                   Lookahead(window_s=60.0), Bounds(), 1e6)
    assert len(f.trials) >= 1 and f.trials[0].share == 1.0
