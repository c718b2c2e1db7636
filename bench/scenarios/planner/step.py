"""The planner scenario's stepped load: the planner in apply mode from 1 + 1 instances, an
open-loop load stepping low -> high -> low, the accelerators in use sampled every 2 s; then
per planner interval what it observed, predicted and did, how long each step took to be back
under target, and the accelerator-seconds against a fixed fleet of the peak."""

from __future__ import annotations

import asyncio
import math
import random
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from bench.fleet import ControllerProc, start_controller
from bench.loadgen import OpenLoop
from bench.loadgen import run as run_loop
from bench.processes import ProcessFleet
from bench.scenarios.planner.chart import timeline_chart
from bench.scenarios.planner.model import (
    Interval,
    PlannerOptions,
    PlannerStepResult,
    base_config,
    payload,
)

AccelSample = tuple[float, int, int]  # (monotonic, used, desired accelerators)


def step_config(o: PlannerOptions) -> dict[str, Any]:
    cfg = base_config(o.nodes, o.step_scale)
    cfg["pools"] = {"prefill": {"size": 1, "tp": 4}, "decode": {"size": 1, "tp": 2}}
    # The router's prefill queue: a backlog waits in the router, not in the one engine it was
    # sent to, so instances the planner adds take it at once (2-3 such prompts fill a step of
    # 8,192 tokens; 4 keep the engine fed).
    cfg["routing"]["prefill_max_inflight"] = o.prefill_max_inflight
    cfg["planner"] = {"mode": "apply", "interval_s": o.interval_s, "ttft_ms": o.ttft_ms,
                      "itl_ms": o.itl_ms, "min_requests": 5, "predictor": "constant"}
    return cfg


class _quiet:
    """Swallow one sampling failure (the controller may be busy); the next sample counts."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> bool:
        return kind is not None and issubclass(kind, (httpx.HTTPError, KeyError, ValueError))


def sample_accelerators(ctl: ControllerProc, samples: list[AccelSample],
                        stop: threading.Event) -> None:
    """Every 2 s until ``stop``: accelerators in use and desired, from ``/cluster``."""
    while not stop.is_set():
        with _quiet():
            c = ctl.get("/cluster")
            p, d = c["pools"]["prefill"]["desired"], c["pools"]["decode"]["desired"]
            samples.append((time.monotonic(), c["hardware"]["used_accelerators"],
                            p["size"] * p["tp"] + d["size"] * d["tp"]))
        stop.wait(2.0)


def run_phases(o: PlannerOptions, url: str, steps: list[tuple[float, float]]) -> list[OpenLoop]:
    """The load's phases, each started at its step's time; they share one prompt stream."""
    rng = random.Random(o.seed)
    phases = []
    for k, ((_, rate), n) in enumerate(zip(steps, o.phases, strict=True)):
        def make(i: int, stream: bool, k: int = k) -> tuple[str, bytes, int]:
            return url, payload(rng.randint(2500, 3500), 150, stream, rng), 150
        phases.append(OpenLoop(make, rate / o.step_scale, n * o.interval_s, poisson=True,
                               stream_share=0.5, max_inflight=4000, timeout_s=600.0,
                               seed=o.seed + k))

    async def after(delay: float, phase: OpenLoop) -> None:
        await asyncio.sleep(delay)
        await phase.run()

    async def all_phases() -> None:
        await asyncio.gather(*(after(s[0], p) for s, p in zip(steps, phases, strict=True)))

    run_loop(all_phases())
    return phases


def planner_intervals(plan: dict[str, Any], t0_wall: float) -> list[Interval]:
    """The planner's passes since the load started, each with the prediction made for it."""
    out = []
    hist = [p for p in plan["history"] if p["at"] >= t0_wall]
    for k, p in enumerate(hist):
        ob = p.get("observed") or {}
        prev = hist[k - 1]["predicted"] if k else None
        out.append(Interval(
            t=round(p["at"] - t0_wall, 1),
            rate=(ob.get("load") or {}).get("request_rate") if ob.get("requests") else None,
            predicted=prev["request_rate"] if prev else None,
            prefill=p["current"]["prefill"], decode=p["current"]["decode"],
            rec_prefill=p["recommended"]["prefill"], rec_decode=p["recommended"]["decode"],
            ttft_p95_ms=ob.get("ttft_p95_ms") if ob.get("requests") else None,
            gap_p95_ms=ob.get("itl_p95_ms") if ob.get("requests") else None,
            applied=p["applied"], hold=p["hold"]))
    return out


def recovery(intervals: list[Interval], step_t: float, o: PlannerOptions) -> float | None:
    """Intervals after a step until a pass whose whole interval followed it saw both p95s
    under their targets; None if none did."""
    for iv in intervals:
        if iv.t - o.interval_s < step_t - 1e-6 or iv.ttft_p95_ms is None:
            continue
        if iv.ttft_p95_ms <= o.ttft_ms and (iv.gap_p95_ms or 0.0) <= o.itl_ms:
            return math.ceil((iv.t - step_t) / o.interval_s - 1e-9)
    return None


def tally(res: PlannerStepResult, phases: list[OpenLoop], events: list[dict[str, Any]],
          samples: list[AccelSample], t0_wall: float) -> None:
    """Requests and failures, the planner's pool changes and the accelerator-seconds."""
    arrivals = [a for p in phases for a in p.arrivals]
    res.requests = len(arrivals)
    res.failed = sum(1 for a in arrivals if a.error is not None)
    for p in phases:
        for kind, sample_list in p.error_samples.items():
            res.error_samples.setdefault(kind, []).extend(sample_list[:2])
    res.changes = [{"t": round(e["ts"] - t0_wall, 1), "pool": e["target"],
                    "from": e["before"]["size"], "to": e["after"]["size"], "actor": e["actor"]}
                   for e in sorted(events, key=lambda e: e["id"])]
    if samples:
        for (ta, used, _), (tb, _, _) in zip(samples, samples[1:], strict=False):
            res.accel_seconds += used * (tb - ta)
        res.peak_accelerators = max(d for _, _, d in samples)
        res.fixed_accel_seconds = res.peak_accelerators * (samples[-1][0] - samples[0][0])


def run_step(o: PlannerOptions, work: Path) -> PlannerStepResult:
    rates = (o.low, o.high, o.low)
    steps, t = [], 0.0
    for rate, n in zip(rates, o.phases, strict=True):
        steps.append((t, rate))
        t += n * o.interval_s
    res = PlannerStepResult(options={k: getattr(o, k) for k in (
        "step_scale", "interval_s", "low", "high", "phases", "ttft_ms", "itl_ms", "nodes",
        "prefill_max_inflight")}, steps=steps)
    shutil.rmtree(work, ignore_errors=True)  # a fresh state: no stored pools, no old events
    with ProcessFleet(work) as fleet:
        ctl = start_controller(work, step_config(o), fleet=fleet, wait="converged",
                               timeout_s=120)
        samples: list[AccelSample] = []
        stop = threading.Event()
        sampler = threading.Thread(target=sample_accelerators, args=(ctl, samples, stop),
                                   daemon=True)
        t0_wall, t0 = time.time(), time.monotonic()
        sampler.start()
        phases = run_phases(o, f"{ctl.url}/v1/completions", steps)
        # Two more intervals: the planner's last passes and the pools' drain.
        time.sleep(2 * o.interval_s)
        stop.set()
        sampler.join()
        res.duration_s = time.monotonic() - t0
        plan = ctl.get("/planner", history=720)
        events = ctl.get("/events", limit=2000, kind="pool.update")
        ctl.stop()
    tally(res, phases, events, samples, t0_wall)
    res.intervals = planner_intervals(plan, t0_wall)
    for step_t, _ in steps[1:]:
        res.recovered_after.append(recovery(res.intervals, step_t, o))
    res.chart = timeline_chart(res, o)
    return res
