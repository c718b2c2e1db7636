"""The SLA planner's evidence, on real ``pdctl controller`` processes with simulated engines
(Llama-3-70B on H100 SXM, the shipped profiles):

1. **Stepped load in apply mode.** Prefill TP4, decode TP2 (the issue's layout), prompts of
   2,500-3,500 tokens (token ids), 150 output tokens, half the requests streamed; an
   open-loop load that steps low -> high -> low (modelled requests/s). The planner starts at
   1 + 1 instances and sizes both pools itself. Reported per planner interval: observed and
   predicted rate, pool sizes, TTFT p95 and inter-token gap p95 (the planner's own
   observation); how many intervals after each step both p95s were back under their
   targets; accelerator-seconds used (sampled every 2 s: every instance holding
   accelerators, starting and draining ones included) against a fixed fleet sized for the
   peak the planner reached, over the same time; and a timeline chart
   (``bench-results/planner-timeline.html``, Vega-Lite).

2. **Disaggregated against colocated at equal accelerators** (8 H100): 1 prefill TP4 + 1
   decode TP4 against 2 colocated TP4 engines (the prefill pool empty: every request is
   served whole by a decode engine), under the same mix: 20 % prompts of 3,000-7,600 tokens,
   80 % of 100-300, 150-300 output tokens, every answer streamed, Poisson arrivals at each
   rate. Per prompt class: TTFT p50/p99; over all answers: inter-token gap p99 and p99.9 and
   each answer's worst gap (as this client read the stream); goodput under a TTFT + worst-gap
   SLO and under a TTFT + mean-ITL SLO; and the controller's advisor verdict for the traffic.

All times are modelled: the engines run at ``time_scale`` wall seconds per modelled second
(slower than real time where this 2-core machine could not carry the wall rate), and every
measured time is divided by it, every wall rate multiplied.

    .venv/bin/python -m bench planner            # ~25 min
    .venv/bin/python -m bench planner --quick    # ~6 min
"""

from __future__ import annotations

import argparse

from bench.report import RESULTS_DIR
from bench.scenario import Scenario
from bench.scenarios.planner.model import PdResult, PlannerBench, PlannerOptions, PlannerStepResult
from bench.scenarios.planner.pd import run_pd
from bench.scenarios.planner.step import run_step
from bench.scenarios.planner.text import planner_report

PLANNER_WORK = RESULTS_DIR / "planner-work"
TIMELINE = RESULTS_DIR / "planner-timeline.html"


class PlannerScenario(Scenario[PlannerOptions, PlannerBench],
                      name="planner", alias="bench.planner"):
    """SLA planner: a stepped load in apply mode; P/D against colocated at equal accelerators

    `pdctl controller` with simulated Llama-3-70B/H100 engines: (1) the planner in apply mode
    under an open-loop load stepping low -> high -> low, from 1 + 1 instances; (2) 1 prefill
    TP4 + 1 decode TP4 against 2 colocated TP4 engines under a mix of long and short prompts.
    Modelled time throughout."""

    def add_options(self, ap: argparse.ArgumentParser) -> None:
        ap.add_argument("--quick", action="store_true")
        ap.add_argument("--only", choices=["step", "pd"])
        ap.add_argument("--prefill-max-inflight", type=int, default=None,
                        help="routing.prefill_max_inflight in the stepped load (default 4; 0: "
                             "no router prefill queue)")

    def options(self, args: argparse.Namespace) -> PlannerOptions:
        o = PlannerOptions.defaults(args.quick)
        if args.prefill_max_inflight is not None:
            o.prefill_max_inflight = args.prefill_max_inflight
        o.only = args.only
        return o

    def defaults(self, quick: bool) -> PlannerOptions:
        return PlannerOptions.defaults(quick)

    def run(self, options: PlannerOptions) -> PlannerBench:
        """The stepped load (its chart written), then P/D against colocated; ``only`` one."""
        step = PlannerStepResult({}, [])
        if options.only != "pd":
            step = run_step(options, PLANNER_WORK / "step")
            RESULTS_DIR.mkdir(exist_ok=True)
            TIMELINE.write_text(step.chart)
        pd = run_pd(options, PLANNER_WORK / "pd") if options.only != "step" else PdResult()
        return PlannerBench(step, pd)

    def report(self, result: PlannerBench) -> str:
        return planner_report(result)

    def check(self, result: PlannerBench) -> str | None:
        """Failed requests in either half."""
        bad = []
        if result.step.failed:
            bad.append(f"stepped load: {result.step.failed} failed requests")
        if any(s.failed for s in result.pd.sides):
            bad.append("P/D vs colocated: failed requests")
        return "; ".join(bad) or None
