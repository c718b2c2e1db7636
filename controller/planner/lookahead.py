"""The planner's look-ahead: before pool sizes are applied, the next minutes are played in the
discrete-event fleet (``controller.whatif``), which queues, batches and caches as the engines
do: the requests not yet finished now (the backlog, whole again: a pessimistic view of work
partly done) and then the recent traffic -- the requests of the last few minutes with their
own bursts, at the predicted rate -- arrive at the current pools, and the proposed sizes take
effect as a real change would (a shrinking pool at once, new instances after the engine's
start time). A proposal whose replay keeps too few requests within the TTFT target grows
the pool the misses waited in (prefill: the router's and prefill queues, prefill and transfer;
decode: decode scheduling), one instance a trial; one that keeps enough tries one instance
fewer of each pool and keeps what still does. Sizing by the profile's mean rates cannot see
a burst inside an interval; the replay does.

A pure function of its inputs (the recent requests, the proposal, the pools' TP, bounds and
the run's model): tests assert its ``Foresight`` from small traces.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from controller.models import Role
from controller.planner.decide import Bounds, Pools
from controller.replay.trace import TraceRequest
from controller.whatif.fleet import Goals
from controller.whatif.layout import Layout
from controller.whatif.run import Prepared, RunResult, RunSpec


@dataclass(frozen=True)
class Lookahead:
    window_s: float = 300.0  # the recent traffic replayed (modelled seconds)
    goal: float = 0.95  # share of its requests within the TTFT target
    max_trials: int = 6  # replays per pass
    max_rate_scale: float = 2.0  # the predicted rate against the observed, at most (and 1/x)


@dataclass(frozen=True)
class Preview:
    prefill: int
    decode: int
    share: float  # of the replayed requests within the TTFT target
    short: str  # "prefill" or "decode": where the misses spent most of their TTFT
    wall_s: float

    @property
    def label(self) -> str:
        return f"{self.prefill}P+{self.decode}D {self.share:.1%}"


@dataclass(frozen=True)
class Foresight:
    prefill: int
    decode: int
    trials: tuple[Preview, ...]
    reasons: tuple[str, ...]

    @property
    def wall_s(self) -> float:
        return sum(t.wall_s for t in self.trials)


@dataclass(frozen=True)
class Present:
    """Where the fleet stands: its pools, the requests not finished yet (as the trace gave
    them), and how long a new instance takes to take requests. The recent traffic is played
from the change until ``start_s`` + ``Lookahead.window_s`` later, repeated if it is shorter."""

    pools: Pools
    backlog: list[TraceRequest]
    start_s: float
    recent_s: float  # the span of trace time the recent traffic covers


def look_ahead(recent: list[TraceRequest], proposal: tuple[int, int], now: Present,
               spec: RunSpec, la: Lookahead, bounds: Bounds, ttft_ms: float,
               rate_scale: float = 1.0, may_shrink: bool = True) -> Foresight:
    """The pool sizes (prefill, decode) under which the backlog and then ``recent`` keep
    ``la.goal`` of their requests within ``ttft_ms``, from ``proposal``; ``rate_scale``: the
    predicted rate over the observed one."""
    scale = min(la.max_rate_scale, max(1 / la.max_rate_scale, rate_scale))
    run_spec = RunSpec(spec.shape, spec.routing, Goals(ttft_ms, math.inf), spec.context)
    pools = now.pools
    ahead = _ahead(now.backlog, recent, now.recent_s, now.start_s + la.window_s,
                   spec.rate_scale * scale)
    tried: dict[tuple[int, int], Preview] = {}
    trials: list[Preview] = []

    def trial(p: int, d: int) -> Preview:
        if (p, d) not in tried:
            tried[(p, d)] = _trial(ahead, p, d, now, run_spec, ttft_ms)
            trials.append(tried[(p, d)])
        return tried[(p, d)]

    def fits(p: int, d: int) -> bool:
        budget = bounds.accelerator_budget
        return (bounds.min_prefill <= p <= bounds.max_prefill
                and max(1, bounds.min_decode) <= d <= bounds.max_decode
                and (budget is None or pools.accelerators(p, d) <= budget))

    p, d = proposal
    reasons = [f"look-ahead: {len(now.backlog)} unfinished requests, then the last "
               f"{la.window_s:.0f} s of traffic ({len(recent)} requests"
               f"{f' at {scale:.2f}x its rate' if scale != 1 else ''}), on "
               f"{p} prefill + {d} decode: {trial(p, d).share:.1%} within "
               f"{ttft_ms:.0f} ms (goal {la.goal:.0%})"]
    while trial(p, d).share < la.goal and len(trials) < la.max_trials:
        short = trial(p, d).short
        steps = [(p + 1, d), (p, d + 1)] if short == "prefill" else [(p, d + 1), (p + 1, d)]
        step = next((s for s in steps if fits(*s)), None)
        if step is None:
            reasons.append("look-ahead: the bounds or the budget stop growth here")
            break
        if trial(*step).share <= trial(p, d).share:
            reasons.append(f"look-ahead: {step[0]} prefill + {step[1]} decode keeps no more "
                           "(the misses are the backlog's or beyond any size)")
            break
        p, d = step
        reasons.append(f"look-ahead: misses waited in {short}: {p} prefill + {d} decode "
                       f"keeps {trial(p, d).share:.1%}")
    if trial(p, d).share >= la.goal and may_shrink:
        # the larger saving first
        for cand in sorted([(p - 1, d), (p, d - 1)],
                           key=lambda c: pools.accelerators(*c)):
            if len(trials) >= la.max_trials or not fits(*cand) or cand == (p, d):
                continue
            if trial(*cand).share >= la.goal:
                p, d = cand
                reasons.append(f"look-ahead: {p} prefill + {d} decode keeps "
                               f"{trial(p, d).share:.1%}: one fewer suffices")
    return Foresight(p, d, tuple(trials), tuple(reasons))


def _ahead(backlog: list[TraceRequest], recent: list[TraceRequest], span_s: float,
           horizon_s: float, rate_scale: float) -> list[TraceRequest]:
    """The backlog at once, then ``recent`` (which spans ``span_s`` of the trace) at
    ``rate_scale`` times its rate from 0 s, repeated until ``horizon_s``."""
    out = [replace(r, time_s=0.0) for r in backlog]
    if not recent:
        return out
    t0, period = recent[0].time_s, span_s / rate_scale
    if period <= 0:  # no span to repeat: the recent requests once
        period = horizon_s
    offset = 0.0
    while offset < horizon_s:
        out.extend(replace(r, time_s=offset + (r.time_s - t0) / rate_scale) for r in recent)
        offset += period
    return out


def _trial(ahead: list[TraceRequest], p: int, d: int, now: Present, spec: RunSpec,
           ttft_ms: float) -> Preview:
    pools = now.pools
    run = Prepared(ahead, Layout(pools.decode, pools.decode_tp, pools.prefill,
                                 pools.prefill_tp, spec.routing.disagg_policy), spec)
    run.fleet.resize(Role.PREFILL, p, now.start_s)
    run.fleet.resize(Role.DECODE, d, now.start_s)
    run.events.run()
    result = run.result()
    # what the change decides: the requests that arrive once it has taken effect
    after = [r for r in result.served.rows if r.due_s >= now.start_s] or result.served.rows
    late = {r.request_id for r in after if r.ttft_ms is None or r.ttft_ms > ttft_ms}
    return Preview(p, d, 1 - len(late) / len(after), _short_side(result, late), result.wall_s)


def _short_side(result: RunResult, late: set[str | None]) -> str:
    prefill = decode = 0.0
    for rec in result.served.records:
        if rec.id not in late:
            continue
        if rec.prefill_instance is None:  # colocated: every wait is the decode instance's
            decode += (rec.queue_ms or 0.0) + (rec.decode_sched_ms or 0.0)
        else:
            prefill += (rec.queue_ms or 0.0) + (rec.prefill_ms or 0.0) + \
                (rec.transfer_ms or 0.0)
            decode += rec.decode_sched_ms or 0.0
    return "decode" if decode > prefill else "prefill"
