"""The per-request hand-off decision (routing ``disagg_policy: slo``) against fixed prompt
length thresholds, on trace replays of a simulated P/D fleet.

Fleet (as ``bench cache``): llama-3.1-70b on h100-sxm, 4 prefill TP4 + 4 decode TP4 sim
engines in two sim host processes, time scale 0.5 (modelled time runs 2x wall), cache_aware
on both pools for every policy so that only the hand-off differs; a fresh fleet per run.

Workloads (``pdctl replay``, token-id prompts):

- the Mooncake conversation trace, 300 requests from 600 s (~12.2k-token prompts, ~350
  output tokens), at two rate scales. 1.5 (5.6 requests/s) asks ~156% of the prefill pool's
  modelled compute without prefix hits, ~78% of the whole fleet's: always-disaggregated
  must queue on the prefill pool while the decode pool's compute is there to take part of
  the prefills -- the case a per-request decision should win. 0.6 (2.2 requests/s) asks
  ~63% of the prefill pool: queues are short and the hand-off matters less.
- short prompts, short outputs: a synthetic trace (300 requests, prompts 64-768 tokens,
  outputs 16-96, Poisson at 8 per second, nothing shared) and 300 requests of the Azure
  LLM 2023 conversation trace from 600 s (~1.3k-token prompts, ~250 output tokens, ~5
  requests/s), where local prefill is cheap and disaggregating costs a transfer and a hop.

Policies: fixed thresholds (``disagg_min_prompt_tokens``) 0 (always disaggregated), 2k, 8k,
16k, 32k and 10,000,000 (always local), and ``slo``, interleaved per round at the higher load;
the best threshold there (by mean TTFT) then runs with always-disaggregated, always-local and
slo at the lower load, and always-local and slo on the short workloads. Per run: TTFT mean,
p50, p90, p99, gap p99, goodput; from the controller's request records: each decision, its
reason and its TTFT parts (saved to ``bench-results/handoff-records.json``). Goals: slo's
mean TTFT at the higher load at least 2x better than the best fixed threshold's; on the short
workloads never more than 10% worse than always-local's. ~14 min on 2 cores (15 runs of ~55
s); --quick ~7 min (100 requests, thresholds 0, 8k, local).

    .venv/bin/python -m bench handoff
    .venv/bin/python -m bench handoff --quick
    .venv/bin/python -m bench --only handoff        # and its section of BENCHMARKS.md
    .venv/bin/python -m bench handoff --limit 200 --high 2 --thresholds 0 8192 10000000
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from bench.report import RESULTS_DIR
from bench.scenario import Scenario, take_given
from bench.scenarios.handoff.model import (
    HIGH,
    LOCAL,
    SLO,
    HandoffOptions,
    HandoffResult,
    HandoffRun,
    Workload,
    threshold_policy,
)
from bench.scenarios.handoff.plan import workloads
from bench.scenarios.handoff.text import best_threshold, handoff_goals, handoff_text
from bench.scenarios.handoff.trace_run import (
    handoff_fleet_config,
    handoff_replay_argv,
    run_handoff_policy,
)

RECORDS = RESULTS_DIR / "handoff-records.json"


def later_policies(best: int | None) -> list[str]:
    """The lower load's policies: the best threshold, always-disagg, always-local, slo."""
    ts = [0, LOCAL] if best is None or best in (0, LOCAL) else [best, 0, LOCAL]
    return [*(threshold_policy(t) for t in ts), SLO]


class HandoffScenario(Scenario[HandoffOptions, HandoffResult], name="handoff",
                      alias="bench.handoff"):
    """The hand-off decision: per request (slo) against fixed thresholds

    The Mooncake conversation trace (300 requests) at two rate scales and two short-prompt
    loads (a synthetic one and the Azure conversation trace) replayed on a fresh simulated
    fleet per policy (llama-3.1-70b, h100-sxm, 4 prefill TP4 + 4 decode TP4, cache_aware on
    both pools, time scale 0.5): fixed `disagg_min_prompt_tokens` thresholds (0, 2k, 8k,
    16k, 32k, always local) and the per-request `disagg_policy: slo`. TTFT mean/p90/p99, gap
    p99, goodput; the slo decisions' reasons and what each side cost, from the controller's
    request records."""

    def add_options(self, ap: argparse.ArgumentParser) -> None:
        ap.add_argument("--trace", type=Path, help="the Mooncake trace (default: "
                        "../shared/traces/mooncake_conversation.jsonl)")
        ap.add_argument("--azure", type=Path, help="the Azure trace (default: "
                        "../shared/traces/azure_llm_2023_conv.csv)")
        ap.add_argument("--start-s", type=float, help="the Mooncake slice's start (default 600)")
        ap.add_argument("--limit", type=int, help="its requests (default 300, quick 100)")
        ap.add_argument("--high", type=float, help="the higher load's rate scale (default 1.5)")
        ap.add_argument("--low", type=float, help="the lower load's rate scale (default 0.6)")
        ap.add_argument("--azure-limit", type=int, help="the Azure slice's requests (default "
                        "300, quick 100)")
        ap.add_argument("--synth-requests", type=int, help="the synthetic short load's "
                        "requests (default 300, quick 100)")
        ap.add_argument("--synth-rate", type=float, help="its requests per second (default 8)")
        ap.add_argument("--time-scale", type=float, help="the sim engines' and the replay's "
                        "time scale (default 0.5)")
        ap.add_argument("--ttft-ms", type=float, help="TTFT target (modelled ms, default 3000)")
        ap.add_argument("--gap-ms", type=float, help="gap p99 target (modelled ms, default 150)")
        ap.add_argument("--thresholds", type=int, nargs="+", help="fixed thresholds swept at "
                        "the higher load (default 0 2048 8192 16384 32768 10000000)")
        ap.add_argument("--rounds", type=int, help="interleaved rounds (default 1)")
        ap.add_argument("--sim-processes", type=int, help="sim host processes (default 2)")
        ap.add_argument("--quick", action="store_true", help="smoke run: 100 requests per "
                        "workload, thresholds 0, 8k and always local")

    def options(self, args: argparse.Namespace) -> HandoffOptions:
        o = HandoffOptions.defaults(args.quick)
        take_given(o, args, ["trace", "azure", "start_s", "limit", "high", "low",
                             "azure_limit", "synth_requests", "synth_rate", "time_scale",
                             "ttft_ms", "gap_ms", "rounds", "sim_processes"])
        if args.thresholds:
            o.thresholds = tuple(args.thresholds)
        return o

    def defaults(self, quick: bool) -> HandoffOptions:
        return HandoffOptions.defaults(quick)

    def run(self, options: HandoffOptions) -> HandoffResult:
        o = options
        workdir = Path(tempfile.mkdtemp(prefix="pdctl-bench-handoff-"))
        loads = workloads(o, workdir)
        for w in loads:
            print(f"handoff: {w.name}: {w.limit} requests at {w.rate:.2f}/s, prompts mean "
                  f"{w.prompt_mean:,.0f}, outputs {w.output_mean:,.0f}; prefill pool "
                  f"{w.prefill_util:.0%} busy without hits, fleet {w.fleet_util:.0%}",
                  flush=True)
        print(f"handoff: work directory {workdir}", flush=True)
        runs: list[HandoffRun] = []
        saved: dict[str, list[dict[str, Any]]] = {}

        def one(w: Workload, rnd: int, policy: str) -> None:
            run, recs = run_handoff_policy(o, w, rnd, policy, workdir)
            runs.append(run)
            saved[f"{w.name} | {run.label} | round {rnd}"] = recs

        high = next(w for w in loads if w.name == HIGH)
        for rnd in range(1, o.rounds + 1):
            for policy in [*(threshold_policy(t) for t in o.thresholds), SLO]:
                one(high, rnd, policy)
        best = best_threshold(runs)
        print(f"handoff: best fixed threshold at the higher load: {best}", flush=True)
        for rnd in range(1, o.rounds + 1):
            for w in loads:
                if w.name == HIGH:
                    continue
                policies = ([threshold_policy(LOCAL), SLO] if w.short
                            else later_policies(best))
                for policy in policies:
                    one(w, rnd, policy)
        RESULTS_DIR.mkdir(exist_ok=True)
        RECORDS.write_text(json.dumps(saved, indent=None, separators=(",", ":")))
        argv = {"replay": handoff_replay_argv(o, high, "URL", Path("replay.json"))}
        res = HandoffResult(o, loads, runs, best, [], str(RECORDS), argv, str(workdir))
        res.handoff_goals = handoff_goals(res)
        print(f"handoff: controller config of the slo runs: {handoff_fleet_config(o, SLO)}",
              flush=True)
        return res

    def report(self, result: HandoffResult) -> str:
        return handoff_text(result)

    def check(self, result: HandoffResult) -> str | None:
        failed = [f"{r.workload} {r.label} (round {r.round})" for r in result.runs if r.error]
        return f"runs that did not finish: {', '.join(failed)}" if failed else None
