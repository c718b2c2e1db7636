"""Planner rehearsal: the SLA planner in apply mode on a real trace hour, in the discrete-event
fleet, alone and with its look-ahead (``controller.planner.rehearse``).

Llama-3-70B on H100 (prefill TP4, decode TP2, the shipped sim profiles), starting from 1 + 1
instances, interval 60 modelled s, a new instance taking requests 60 s after it is asked for,
TTFT p95 target 2 s and gap p95 60 ms, the router's prefill queue on (4 per instance). Per
trace: the share of requests within the TTFT target, the accelerator-seconds the pools held
against a fixed fleet of the planner's own peak, the number of changes, the wall time.

    .venv/bin/python -m bench planner-rehearse                   # both traces, the hour
    .venv/bin/python -m bench planner-rehearse --minutes 10 --trace azure
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field

from bench.scenario import Scenario
from bench.scenarios.whatif.model import TRACE
from controller.config import RoutingSettings
from controller.planner.decide import Bounds, PlannerTargets
from controller.planner.lookahead import Lookahead
from controller.planner.profile import ProfileIndex
from controller.planner.rehearse import Rehearsal, Rehearsed, rehearse
from controller.replay.trace import load_trace
from controller.whatif.engine import EngineShape
from controller.whatif.fleet import Goals
from controller.whatif.layout import Layout
from controller.whatif.run import RunSpec
from pdctl_api import profiles

TRACES = {"azure": TRACE.parent / "azure_llm_2023_conv.csv", "mooncake": TRACE}
MODEL, ACCELERATOR, LINK = "llama-3-70b", "h100-sxm", "ib-ndr"
PREFILL_TP, DECODE_TP = 4, 2


@dataclass
class RehearseOptions:
    traces: tuple[str, ...] = ("azure", "mooncake")
    minutes: float = 60.0
    start_s: float = 60.0
    budget: int = 128


@dataclass
class RehearseRow:
    trace: str
    planner: str
    requests: int
    share: float
    accelerator_s: float
    peak: int
    ratio: float
    changes: int
    wall_s: float


@dataclass
class RehearseResult:
    options: RehearseOptions
    rows: list[RehearseRow] = field(default_factory=list)


def run_rehearsals(o: RehearseOptions) -> RehearseResult:
    shape = EngineShape(profiles.model(MODEL), profiles.hardware(ACCELERATOR),
                        profiles.link(LINK))
    spec = RunSpec(shape, RoutingSettings(prefill_max_inflight=4), Goals(2000.0, 1e9))
    index = ProfileIndex()
    pp = index.find("sim", MODEL, ACCELERATOR, PREFILL_TP)
    dp = index.find("sim", MODEL, ACCELERATOR, DECODE_TP)
    assert pp is not None and dp is not None, "the shipped sim profiles"
    res = RehearseResult(o)
    for name in o.traces:
        reqs = list(load_trace(TRACES[name]).requests)
        reqs = [r for r in reqs if r.time_s - reqs[0].time_s < o.minutes * 60]
        for label, la in (("planner", None), ("planner + look-ahead", Lookahead())):
            plan = Rehearsal(PlannerTargets(2000.0, 60.0), Bounds(accelerator_budget=o.budget),
                             start_s=o.start_s, lookahead=la)
            started = time.perf_counter()
            out: Rehearsed = rehearse(reqs, spec, Layout(1, DECODE_TP, 1, PREFILL_TP), plan,
                                      pp, dp)
            row = RehearseRow(name, label, len(reqs), out.ttft_share, out.accelerator_seconds,
                              out.peak_accelerators, out.cost_ratio, out.changes,
                              time.perf_counter() - started)
            print(f"  {name} {label}: {row.share:.1%} within 2 s, {row.ratio:.2f}x the "
                  f"peak fleet's accelerator-seconds ({row.wall_s:.0f} s)", flush=True)
            res.rows.append(row)
    return res


def rehearse_report(r: RehearseResult) -> str:
    o = r.options
    lines = [f"Llama-3-70B on H100 (prefill TP{PREFILL_TP}, decode TP{DECODE_TP}), from 1 + 1, "
             f"interval 60 s, instances start in {o.start_s:g} s, budget {o.budget}; "
             f"the first {o.minutes:g} min of each trace; every time modelled.", "",
             "| trace | planner | requests | within TTFT 2 s | accelerator-s | peak | "
             "vs peak fleet | changes | wall s |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for w in r.rows:
        lines.append(f"| {w.trace} | {w.planner} | {w.requests:,} | {w.share:.1%} | "
                     f"{w.accelerator_s:,.0f} | {w.peak} | {w.ratio:.2f}x | {w.changes} | "
                     f"{w.wall_s:.0f} |")
    return "\n".join(lines)


class RehearseTool(Scenario[RehearseOptions, RehearseResult], name="planner-rehearse",
                   alias="bench.planner_rehearse", in_suite=False):
    """Planner rehearsal: the planner in apply mode on a trace hour, discrete-event

    The SLA planner's own decisions every modelled minute on the Azure and Mooncake traces,
    alone and with its look-ahead: share within the TTFT target, accelerator-seconds against
    a fixed fleet of the planner's peak, changes."""

    def add_options(self, ap: argparse.ArgumentParser) -> None:
        ap.add_argument("--trace", choices=sorted(TRACES), action="append")
        ap.add_argument("--minutes", type=float, default=60.0)
        ap.add_argument("--start-s", type=float, default=60.0)
        ap.add_argument("--budget", type=int, default=128)

    def options(self, args: argparse.Namespace) -> RehearseOptions:
        traces = tuple(args.trace) if args.trace else RehearseOptions.traces
        return RehearseOptions(traces, args.minutes, args.start_s, args.budget)

    def defaults(self, quick: bool) -> RehearseOptions:
        return RehearseOptions(minutes=10.0) if quick else RehearseOptions()

    def run(self, options: RehearseOptions) -> RehearseResult:
        return run_rehearsals(options)

    def report(self, result: RehearseResult) -> str:
        return rehearse_report(result)
