"""The planner's decision: a pure function from what was observed, the predicted load, the
pools' performance profiles, the targets, the bounds and the current pools to the pool sizes
it recommends, with every reason. No clock, no I/O: tests assert it from tables.

The sizing follows NVIDIA Dynamo's SLA planner, with the fixes its users asked for:

- prefill instances = ceil(predicted prefill tokens/s x min(1, observed / profiled prefill
  time) / one instance's prompt tokens/s at the predicted prompt length);
- decode instances = ceil(predicted output tokens/s / the best tokens/s of one instance whose
  ITL meets the target, corrected by observed / profiled ITL, at the predicted context, with
  the concurrency capped by the KV cache it holds);
- queueing is a signal of its own: a pool whose p95 queue time plus the profiled prefill time
  breaks the TTFT target grows although the model says it is enough (Dynamo's estimate stayed
  at a few hundred ms while clients waited 160 s), and a decode pool whose inter-token gap
  p95 breaks the ITL target grows;
- a pool shrinks only when the survivors stay at or under ``scale_down_utilization`` of their
  profiled capacity at the predicted load and the targets hold now (Dynamo oscillated 2 <-> 1
  when scale-down ignored what the survivors carry);
- bounds per pool, never fewer than one decode instance, an accelerator budget never
  exceeded, and ceil(x - 1e-9) so that 3.0000000001 instances are 3.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from controller.planner.predict import Traffic
from controller.planner.profile import PerfProfile

EPS = 1e-9
MAX_CORRECTION = 4.0  # observed/profiled ratios are clamped to [1/4, 4]


def ceil(x: float) -> int:
    return max(0, math.ceil(x - EPS))


@dataclass(frozen=True)
class PlannerTargets:
    ttft_ms: float  # p95 time to first token
    itl_ms: float  # p95 inter-token gap


@dataclass(frozen=True)
class Bounds:
    min_prefill: int = 1
    max_prefill: int = 64
    min_decode: int = 1
    max_decode: int = 64
    accelerator_budget: int | None = None  # None: no budget beyond the pools' maxima


@dataclass(frozen=True)
class Pools:
    prefill: int
    prefill_tp: int
    decode: int
    decode_tp: int

    def accelerators(self, prefill: int | None = None, decode: int | None = None) -> int:
        p = self.prefill if prefill is None else prefill
        d = self.decode if decode is None else decode
        return p * self.prefill_tp + d * self.decode_tp


@dataclass(frozen=True)
class Observed:
    """One interval, in modelled time (``planner.observe``)."""

    requests: int  # finished ok in the interval
    load: Traffic
    ttft_p95_ms: float
    itl_p95_ms: float | None = None  # inter-token gap p95 of streamed answers
    itl_mean_ms: float | None = None  # the engines' mean ITL
    prefill_ms_mean: float | None = None  # engine prefill time of disaggregated requests
    prefill_queue_p95_ms: float = 0.0
    decode_queue_p95_ms: float = 0.0
    decode_concurrency: float = 0.0  # sequences running per decode instance
    disagg_token_share: float = 1.0  # share of prompt tokens prefilled by the prefill pool


@dataclass(frozen=True)
class Stability:
    converging: bool = False  # pools not yet at their desired state
    cooling_down: bool = False  # within the cooldown after the last change
    scale_down_utilization: float = 0.7


def stability_at(now: float, starting: bool, changed_at: float | None, interval_s: float,
                 cooldown_s: float | None, scale_down_utilization: float,
                 stuck_intervals: int = 3) -> Stability:
    """Converging: instances of the last change still starting (the capacity they add is not
    in the observation yet), unless the start has taken over ``stuck_intervals`` intervals.
    Draining ones hold nothing back (a drain behind long requests would block every
    correction, scale-up included). Cooling down: within ``cooldown_s`` (default two
    intervals) of the last change."""
    cooldown = 2 * interval_s if cooldown_s is None else cooldown_s
    stuck = changed_at is not None and now - changed_at > stuck_intervals * interval_s
    return Stability(converging=starting and not stuck,
                     cooling_down=changed_at is not None and now - changed_at < cooldown,
                     scale_down_utilization=scale_down_utilization)


@dataclass(frozen=True)
class PoolNeed:
    """One pool's sizing before bounds and budget."""

    size: int
    needed: float  # instances the model asks for, before ceil
    capacity_per_instance: float  # tokens/s one instance carries (prompt or output)
    pressure: bool  # a queue or tail signal says it is short now
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class ScaleDecision:
    prefill: int
    decode: int
    reasons: tuple[str, ...]
    hold: str | None = None  # why nothing should be applied now
    prefill_need: PoolNeed | None = field(default=None, compare=False)
    decode_need: PoolNeed | None = field(default=None, compare=False)

    def changes(self, pools: Pools) -> bool:
        return (self.prefill, self.decode) != (pools.prefill, pools.decode)


def _clamp(ratio: float) -> float:
    return min(MAX_CORRECTION, max(1 / MAX_CORRECTION, ratio))


def size_prefill(obs: Observed, load: Traffic, prof: PerfProfile, targets: PlannerTargets,
                 current: int, util: float) -> PoolNeed:
    ttft_prof, per_inst = prof.prefill_at(load.prompt_tokens)
    demand = load.prefill_tokens_per_s * obs.disagg_token_share
    corr = 1.0
    if obs.prefill_ms_mean is not None and ttft_prof > 0:
        corr = min(1.0, _clamp(obs.prefill_ms_mean / ttft_prof))
    needed = demand * corr / per_inst if per_inst > 0 else 0.0
    reasons = [f"prefill: {demand:,.0f} prompt tokens/s predicted"
               f"{f' x {corr:.2f} (observed/profiled prefill time)' if corr < 1 else ''}"
               f" / {per_inst:,.0f} per instance at {load.prompt_tokens:,.0f}-token prompts "
               f"= {needed:.2f} instances"]
    size = ceil(needed)
    slack = targets.ttft_ms - ttft_prof
    pressure = False
    if slack <= 0:
        reasons.append(f"prefill: the profiled TTFT at this prompt length ({ttft_prof:.0f} ms) "
                       f"alone exceeds the {targets.ttft_ms:.0f} ms target: more instances "
                       "cannot meet it")
    elif obs.prefill_queue_p95_ms > slack:
        pressure = True
        grow = max(current + 1, ceil(current * min(2.0, obs.prefill_queue_p95_ms / slack)))
        if grow > size:
            size = grow
            reasons.append(f"prefill: queue p95 {obs.prefill_queue_p95_ms:,.0f} ms + profiled "
                           f"prefill {ttft_prof:,.0f} ms breaks the {targets.ttft_ms:,.0f} ms "
                           f"TTFT target: grow to {size} although the model asks for "
                           f"{needed:.2f}")
    return _with_scale_down(PoolNeed(size, needed, per_inst, pressure, tuple(reasons)),
                            current, util, "prefill")


def size_decode(obs: Observed, load: Traffic, prof: PerfProfile, targets: PlannerTargets,
                current: int, util: float) -> PoolNeed:
    context = load.prompt_tokens + load.output_tokens / 2
    corr = 1.0
    if obs.itl_mean_ms is not None and obs.decode_concurrency > 0:
        expected = prof.decode_itl_at(obs.decode_concurrency, context)
        if expected > 0:
            corr = _clamp(obs.itl_mean_ms / expected)
    budget = targets.itl_ms / corr
    choice = prof.decode_best(context, budget)
    reasons = []
    if choice is None:
        low = min((p for p in prof.decode if p.context_tokens >= min(
            c.context_tokens for c in prof.decode)), key=lambda p: (p.concurrency,
                                                                    -p.context_tokens))
        per_inst = low.tokens_per_s
        reasons.append(f"decode: no concurrency meets the {budget:.1f} ms ITL budget at "
                       f"{context:,.0f}-token contexts; sizing at one sequence per step")
    else:
        per_inst = choice.tokens_per_s
        reasons.append(
            f"decode: best {per_inst:,.0f} output tokens/s per instance at concurrency "
            f"{choice.concurrency} (ITL {choice.itl_ms:.1f} ms <= budget {budget:.1f} ms"
            f"{f' = target / {corr:.2f} observed/profiled ITL' if corr != 1 else ''}) at "
            f"{context:,.0f}-token contexts")
        if choice.kv_bound:
            reasons.append(f"decode: the KV cache ({prof.kv_capacity_tokens:,} tokens per "
                           f"instance) caps concurrency at {choice.concurrency} for "
                           f"{context:,.0f}-token contexts")
    needed = load.output_tokens_per_s / per_inst if per_inst > 0 else 0.0
    reasons.append(f"decode: {load.output_tokens_per_s:,.0f} output tokens/s predicted / "
                   f"{per_inst:,.0f} = {needed:.2f} instances")
    size = ceil(needed)
    pressure = False
    ttft_prof, _ = prof.prefill_at(load.prompt_tokens)
    slack = targets.ttft_ms - ttft_prof
    if slack > 0 and obs.decode_queue_p95_ms > slack:
        pressure = True
        grow = max(current + 1, ceil(current * min(2.0, obs.decode_queue_p95_ms / slack)))
        if grow > size:
            size = grow
            reasons.append(f"decode: queue p95 {obs.decode_queue_p95_ms:,.0f} ms breaks the "
                           f"TTFT budget ({slack:,.0f} ms after prefill): grow to {size}")
    if obs.itl_p95_ms is not None and obs.itl_p95_ms > targets.itl_ms:
        pressure = True
        if current + 1 > size:
            size = current + 1
            reasons.append(f"decode: inter-token gap p95 {obs.itl_p95_ms:.1f} ms breaks the "
                           f"{targets.itl_ms:.1f} ms target: grow to {size}")
    return _with_scale_down(PoolNeed(size, needed, per_inst, pressure, tuple(reasons)),
                            current, util, "decode")


def _with_scale_down(need: PoolNeed, current: int, util: float, role: str) -> PoolNeed:
    """Below the current size only as far as the survivors stay at or under ``util`` of
    their capacity (hysteresis: up at 100 %, down only under ``util``)."""
    if need.size >= current or need.pressure:
        return need if need.size >= current else PoolNeed(
            current, need.needed, need.capacity_per_instance, True,
            need.reasons + (f"{role}: no scale-down while a queue or tail signal is on",))
    floor_size = ceil(need.needed / util)
    size = max(need.size, min(current, floor_size))
    note = (f"{role}: {size} instance{'s' if size != 1 else ''} would run at "
            f"{need.needed / max(size, 1):.0%} of capacity (scale-down limit {util:.0%})"
            if size < current else
            f"{role}: stays at {current}: {current - 1} would run at "
            f"{need.needed / max(current - 1, 1):.0%} of capacity, over the "
            f"{util:.0%} scale-down limit")
    return PoolNeed(size, need.needed, need.capacity_per_instance, False,
                    need.reasons + (note,))


def _bounded(size: int, lo: int, hi: int, role: str, reasons: list[str]) -> int:
    if size < lo:
        reasons.append(f"{role}: raised to the minimum of {lo}")
        return lo
    if size > hi:
        reasons.append(f"{role}: capped at the maximum of {hi}")
        return hi
    return size


def _fit_budget(p: int, d: int, pn: PoolNeed, dn: PoolNeed, pools: Pools, bounds: Bounds,
                reasons: list[str]) -> tuple[int, int]:
    budget = bounds.accelerator_budget
    if budget is None or pools.accelerators(p, d) <= budget:
        return p, d
    want = (p, d)
    lo_p, lo_d = bounds.min_prefill, max(1, bounds.min_decode)
    if pools.accelerators(lo_p, lo_d) > budget:
        reasons.append(f"budget: even the minimum pools need {pools.accelerators(lo_p, lo_d)} "
                       f"accelerators, over the budget of {budget}: kept at the minimum")
        return lo_p, lo_d
    f = budget / pools.accelerators(p, d)
    p, d = max(lo_p, math.floor(p * f)), max(lo_d, math.floor(d * f))
    while pools.accelerators(p, d) > budget:  # the minima may push it over
        if d > lo_d and (p <= lo_p or d * pools.decode_tp >= p * pools.prefill_tp):
            d -= 1
        else:
            p -= 1
    while True:  # give back what fits, to the pool furthest short of its need
        short = sorted(((pn.needed / max(p, 1), "p"), (dn.needed / max(d, 1), "d")),
                       reverse=True)
        grown = False
        for _, which in short:
            np_, nd = (p + 1, d) if which == "p" else (p, d + 1)
            if (np_, nd) != (p, d) and np_ <= want[0] and nd <= want[1] \
                    and pools.accelerators(np_, nd) <= budget:
                p, d, grown = np_, nd, True
                break
        if not grown:
            break
    reasons.append(f"budget: prefill {want[0]} x TP{pools.prefill_tp} + decode {want[1]} x "
                   f"TP{pools.decode_tp} = {pools.accelerators(*want)} accelerators is over "
                   f"the budget of {budget}: scaled to prefill {p} + decode {d}")
    return p, d


def decide(obs: Observed | None, load: Traffic | None, prefill_profile: PerfProfile,
           decode_profile: PerfProfile, targets: PlannerTargets, bounds: Bounds, pools: Pools,
           stability: Stability, min_requests: int = 10) -> ScaleDecision:
    """The recommended pool sizes and why; ``hold`` says why they should not be applied now
    (no data, a change still converging, a scale-down within the cooldown)."""
    if obs is None or load is None or obs.requests < min_requests:
        n = 0 if obs is None else obs.requests
        return ScaleDecision(pools.prefill, pools.decode, (),
                        hold=f"no data: {n} finished requests in the interval "
                             f"(at least {min_requests} needed)")
    util = stability.scale_down_utilization
    if obs.ttft_p95_ms > targets.ttft_ms or (obs.itl_p95_ms or 0.0) > targets.itl_ms:
        util = 0.0  # targets broken now: nothing shrinks
    pn = size_prefill(obs, load, prefill_profile, targets, pools.prefill, util or 1e-9)
    dn = size_decode(obs, load, decode_profile, targets, pools.decode, util or 1e-9)
    reasons = [*pn.reasons, *dn.reasons]
    if util == 0.0:
        reasons.append(f"targets broken now (TTFT p95 {obs.ttft_p95_ms:,.0f} ms, gap p95 "
                       f"{obs.itl_p95_ms or 0:.1f} ms): no pool shrinks")
    p = _bounded(pn.size, bounds.min_prefill, bounds.max_prefill, "prefill", reasons)
    d = _bounded(dn.size, max(1, bounds.min_decode), bounds.max_decode, "decode", reasons)
    p, d = _fit_budget(p, d, pn, dn, pools, bounds, reasons)
    hold = None
    if stability.converging:
        hold = "a previous change is still converging"
    elif stability.cooling_down and (p < pools.prefill or d < pools.decode):
        reasons.append("cooldown: no pool shrinks within the cooldown after the last change")
        p, d = max(p, pools.prefill), max(d, pools.decode)
    return ScaleDecision(p, d, tuple(reasons), hold, pn, dn)
