"""Cache-aware routing on a trace: pdctl's policies and vllm-router's cache_aware replaying a
slice of the Mooncake conversation trace on a simulated P/D fleet; and the router's CPU per
request against prompt length.

The slice (default: 600 requests from 600 s into ../shared/traces/mooncake_conversation.jsonl,
~183 s of trace at 3.3 requests/s, prompts ~12k tokens on average) is replayed with
``pdctl replay --text-prompts`` (each token id a 4-byte text piece, so vllm-router's text
matching and the engines' token blocks see the same sharing) on a fresh simulated fleet per
policy: llama-3.1-70b on h100-sxm, 4 prefill TP4 + 4 decode TP4 engines in two sim host
processes, time scale 0.5. At the trace's rate the slice asks ~97% of the prefill pool's
compute, so round robin queues. Policies, interleaved per round: pdctl's round_robin,
least_loaded and cache_aware (both pools), and vllm-router 0.1.17 (``--vllm-pd-disaggregation
--policy cache_aware``) in front of the same kind of fleet.

Per policy: the prefill engines' prefix hit rate against the slice's bound (one LRU cache of
the pool's KV capacity replaying the slice's hash ids), TTFT p50/p90/p99, goodput, refusals
and errors, KV bytes pulled per request, the router's CPU per request; then the goals. The
CPU sweep: the controller alone in front of instant engines (``bench/instant_engine.py``),
round_robin against cache_aware at 1k, 4k, 12k and 32k tokens, and its rate at 12k.

    .venv/bin/python -m bench cache                 # ~15 min on 2 cores
    .venv/bin/python -m bench cache --quick         # 120 requests per policy, ~5 min
    .venv/bin/python -m bench cache --limit 300 --rate-scale 1.2 --no-sweep
    .venv/bin/python -m bench cache --policies cache_aware vllm-router

vllm-router 0.1.17 lives in its own venv (``make bench-router`` creates it).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from bench.processes import FleetError
from bench.scenario import Scenario, take_given
from bench.scenarios.cache.model import (
    CACHE_POLICIES,
    MIXED_POLICIES,
    CacheOptions,
    CacheResult,
    PolicyRun,
    Sweep,
)
from bench.scenarios.cache.plan import slice_facts
from bench.scenarios.cache.sweep import measure_sweep
from bench.scenarios.cache.text import cache_text, goals
from bench.scenarios.cache.trace_run import replay_argv, run_policy, vllm_router_argv
from bench.scenarios.router.model import INSTALL_HINT


def vllm_router_binary(path: Path | None) -> str | None:
    if path is None:
        return None
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise FleetError(f"vllm-router not found at {path}. Install vllm-router 0.1.17 in its "
                         f"own venv:\n    {INSTALL_HINT}\nor pass --vllm-router PATH (or "
                         "--policies without vllm-router).")
    return str(path)


class CacheScenario(Scenario[CacheOptions, CacheResult], name="cache", alias="bench.cache"):
    """Cache-aware routing on the Mooncake conversation trace

    A slice of `mooncake_conversation.jsonl` replayed (`pdctl replay --text-prompts`) on a fresh
    simulated fleet per policy (llama-3.1-70b, h100-sxm, 4 prefill TP4 + 4 decode TP4, time
    scale 0.5): pdctl's round_robin, least_loaded and cache_aware on both pools, and vllm-router
    0.1.17's cache_aware, interleaved. Prefix hit rate (the prefill engines' counters) against
    the slice's LRU bound, TTFT, goodput, failures, KV bytes per request and router CPU per
    request; then the controller's CPU per request against prompt length (instant engines,
    round_robin vs cache_aware) and its rate at 12k tokens."""

    def add_options(self, ap: argparse.ArgumentParser) -> None:
        ap.add_argument("--trace", type=Path, help="the Mooncake trace (default: "
                        "../shared/traces/mooncake_conversation.jsonl)")
        ap.add_argument("--start-s", type=float, help="the slice's start (default 600)")
        ap.add_argument("--limit", type=int, help="the slice's requests (default 600, quick 120)")
        ap.add_argument("--rate-scale", type=float, help="the trace's rate times (default 1)")
        ap.add_argument("--time-scale", type=float,
                        help="the sim engines' and the replay's time scale (default 0.5)")
        ap.add_argument("--ttft-ms", type=float, help="goodput's TTFT target (modelled ms, "
                        "default 3000)")
        ap.add_argument("--gap-ms", type=float, help="goodput's gap p99 target (modelled ms, "
                        "default 150)")
        ap.add_argument("--rounds", type=int, help="interleaved rounds (default 1)")
        ap.add_argument("--policies", nargs="+", choices=CACHE_POLICIES + MIXED_POLICIES,
                        help="default: the first four (cache_aware/least_loaded: cache_aware "
                             "on the prefill pool, least_loaded on the decode pool)")
        ap.add_argument("--sim-processes", type=int, help="sim host processes (default 2)")
        ap.add_argument("--vllm-router", type=Path, help="the vllm-router executable "
                        "(default .bench/venv-router/bin/vllm-router)")
        ap.add_argument("--no-sweep", action="store_true", help="skip the router CPU sweep")
        ap.add_argument("--sweep-requests", type=int, help="requests per sweep cell")
        ap.add_argument("--quick", action="store_true",
                        help="smoke run: 120 requests per policy, a short sweep")

    def options(self, args: argparse.Namespace) -> CacheOptions:
        o = CacheOptions.defaults(args.quick)
        take_given(o, args, ["trace", "start_s", "limit", "rate_scale", "time_scale", "ttft_ms",
                             "gap_ms", "rounds", "sim_processes", "vllm_router",
                             "sweep_requests"])
        if args.policies:
            o.policies = tuple(args.policies)
        o.sweep = not args.no_sweep
        return o

    def defaults(self, quick: bool) -> CacheOptions:
        return CacheOptions.defaults(quick)

    def run(self, options: CacheOptions) -> CacheResult:
        o = options
        router_bin = vllm_router_binary(o.vllm_router) if "vllm-router" in o.policies else None
        facts = slice_facts(o)
        workdir = Path(tempfile.mkdtemp(prefix="pdctl-bench-cache-"))
        print(f"cache: {facts.requests} requests, {facts.span_s:.0f} s of trace "
              f"({facts.rate:.2f}/s), prefill pool {facts.prefill_utilization:.0%} busy "
              f"without hits; hit-rate bound {facts.bound_prefill:.3f} (prefill pool), "
              f"{facts.bound_fleet:.3f} (fleet); work directory {workdir}", flush=True)
        runs: list[PolicyRun] = []
        for rnd in range(1, o.rounds + 1):
            for policy in o.policies:
                runs.append(run_policy(o, rnd, policy, router_bin, workdir))
        sweep = measure_sweep(o, workdir) if o.sweep else Sweep(error="skipped (--no-sweep)")
        argv = {"replay": replay_argv(o, "URL", Path("replay.json"))}
        if router_bin:
            argv["vllm-router"] = vllm_router_argv(
                router_bin, {"prefill": ["P1", "P2", "P3", "P4"],
                             "decode": ["D1", "D2", "D3", "D4"]}, 0)
        res = CacheResult(o, facts.requests, facts.span_s, facts.rate, facts.prompt_mean,
                          facts.prompt_max, facts.prefill_utilization, facts.bound_prefill,
                          facts.bound_fleet, facts.bound_infinite, facts.capacity_prefill,
                          facts.capacity_fleet, runs, sweep, [], argv, str(workdir))
        res.goals = goals(res)
        return res

    def report(self, result: CacheResult) -> str:
        return cache_text(result)

    def check(self, result: CacheResult) -> str | None:
        failed = [f"{r.policy} (round {r.round})" for r in result.runs if r.error]
        if result.sweep.error and not result.sweep.error.startswith("skipped"):
            failed.append("the CPU sweep")
        return f"runs that did not finish: {', '.join(failed)}" if failed else None
