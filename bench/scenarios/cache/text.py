"""The cache scenario's report: the slice and its bounds, one row per policy run, the goals,
and the router CPU sweep."""

from __future__ import annotations

import math
import os
import shlex
import statistics
from collections.abc import Callable

from bench.report import fmt, ratio
from bench.scenarios.cache.model import (
    CACHE_HARDWARE,
    CPU_SWEEP_TOKENS,
    MODEL,
    RATE_TOKENS,
    SWEEP_POLICIES,
    TP,
    CacheResult,
    PolicyRun,
    Sweep,
)
from bench.scenarios.router.model import Goal


def _median(runs: list[PolicyRun], get: Callable[[PolicyRun], float]) -> float:
    vals = [v for v in (get(r) for r in runs if r.error is None) if not math.isnan(v)]
    return statistics.median(vals) if vals else math.nan


def of(runs: list[PolicyRun], policy: str, get: Callable[[PolicyRun], float]) -> float:
    """A figure of ``policy``'s runs, the median over rounds (NaN when none finished)."""
    return _median([r for r in runs if r.policy == policy], get)


def sweep_ratio(sweep: Sweep, tokens: int) -> float:
    cells = {c.policy: c.cpu_us_per_request for c in sweep.cells if c.tokens == tokens}
    return ratio(cells.get("cache_aware"), cells.get("round_robin"))


def goals(res: CacheResult) -> list[Goal]:
    runs, s = res.runs, res.sweep
    ca = "cache_aware"
    hit = of(runs, ca, lambda r: r.hit_rate)
    out = [Goal(f"cache_aware's prefill hit rate >= 90% of the slice's bound with {what}'s "
                "KV capacity", None if math.isnan(hit) else hit >= 0.9 * bound,
                f"{fmt(hit, '.3f')} vs {bound:.3f}: {fmt(ratio(hit, bound) * 100, '.0f')}%")
           for what, bound in (("the whole fleet", res.bound_fleet),
                               ("the prefill pool", res.bound_prefill))]
    p90 = {p: of(runs, p, lambda r: r.ttft_p90_ms) for p in res.options.policies}
    rr, vr, mine = p90.get("round_robin", math.nan), p90.get("vllm-router", math.nan), p90.get(
        ca, math.nan)
    out.append(Goal("cache_aware's TTFT p90 at least 2x better than round_robin's",
                    None if math.isnan(rr) or math.isnan(mine) else rr >= 2 * mine,
                    f"{fmt(mine, ',.0f')} vs {fmt(rr, ',.0f')} ms: "
                    f"{fmt(ratio(rr, mine), '.2f')}x"))
    out.append(Goal("cache_aware's TTFT p90 better than vllm-router's cache_aware",
                    None if math.isnan(vr) or math.isnan(mine) else mine < vr,
                    f"{fmt(mine, ',.0f')} vs {fmt(vr, ',.0f')} ms"))
    g = {p: of(runs, p, lambda r: r.goodput_per_s) for p in res.options.policies}
    gl, gm = g.get("least_loaded", math.nan), g.get(ca, math.nan)
    out.append(Goal("cache_aware's goodput not lower than least_loaded's",
                    None if math.isnan(gl) or math.isnan(gm) else gm >= gl,
                    f"{fmt(gm, '.3f')} vs {fmt(gl, '.3f')} requests/s"))
    bad = [f"{r.policy} (round {r.round}): {r.refused} refused, {r.failed} failed"
           + (f", run failed: {r.error[:80]}" if r.error else "")
           for r in runs if r.refused or r.failed or r.error]
    out.append(Goal("0 refused or failed requests (every policy)", not bad if runs else None,
                    "; ".join(bad) if bad else f"{sum(r.requests for r in runs)} requests"))
    ratios = {t: sweep_ratio(s, t) for t in CPU_SWEEP_TOKENS}
    known = [v for v in ratios.values() if not math.isnan(v)]
    out.append(Goal("controller CPU per request, cache_aware / round_robin <= 2x at every "
                    "length", (max(known) <= 2.0) if known else None,
                    ", ".join(f"{t // 1024}k {fmt(v, '.2f')}x" for t, v in ratios.items())))
    rate = next((c for c in s.rate if c.policy == ca), None)
    need = 10 * res.slice_rate
    out.append(Goal(f"controller's max rate at {RATE_TOKENS // 1024}k tokens (cache_aware) >= "
                    "10x the slice's rate",
                    None if rate is None else rate.rps >= need,
                    "not measured" if rate is None else
                    f"{rate.rps:.1f} requests/s measured (client, engines and controller on "
                    f"{os.cpu_count()} cores) vs {need:.1f} needed; CPU-bound ceiling "
                    f"{fmt(rate.cpu_bound_rps, '.0f')}/s on one core"))
    return out


def run_rows(res: CacheResult) -> list[str]:
    hdr = (f"{'policy':13} {'rnd':>3} {'ok':>5} {'429':>4} {'fail':>4} {'hit rate':>8} "
           f"{'/bound':>6} {'TTFT p50':>9} {'p90':>8} {'p99':>8} {'gap p99':>7} "
           f"{'goodput/s':>9} {'KV MB/req':>9} {'router CPU us/req':>17} {'idle %':>6} "
           f"{'lag s':>6}")
    lines = [hdr]
    for r in res.runs:
        if r.error:
            lines.append(f"{r.policy:13} {r.round:>3} FAILED: {r.error}")
            continue
        lines.append(
            f"{r.policy:13} {r.round:>3} {r.ok:>5} {r.refused:>4} {r.failed:>4} "
            f"{fmt(r.hit_rate, '8.3f')} {fmt(ratio(r.hit_rate, res.bound_prefill), '6.2f')} "
            f"{fmt(r.ttft_p50_ms, '9,.0f')} {fmt(r.ttft_p90_ms, '8,.0f')} "
            f"{fmt(r.ttft_p99_ms, '8,.0f')} {fmt(r.gap_p99_ms, '7.0f')} "
            f"{fmt(r.goodput_per_s, '9.3f')} {fmt(r.kv_bytes_per_request / 1e6, '9.0f')} "
            f"{fmt(r.router_cpu_us_per_request, '17,.0f')} {fmt(r.router_idle_cpu_pct, '6.1f')} "
            f"{r.sim_lag_s:6.1f}")
    return lines


def extra_rows(res: CacheResult) -> list[str]:
    lines = ["per run: decode engines' own hit rate (before pulling), the client's "
             "usage.prompt_tokens_details.cached_tokens share, pdctl's predicted share, "
             "KV pulls, wall seconds"]
    for r in res.runs:
        if r.error:
            continue
        dec = ratio(r.decode_hits, r.decode_queries)
        lines.append(f"  {r.policy:13} round {r.round}: decode {fmt(dec, '.3f')}, client "
                     f"{fmt(r.client_cached_share, '.3f')}, predicted "
                     f"{fmt(r.predicted_share, '.3f')}, pulls {r.kv_pulls:.0f}, "
                     f"{fmt(r.wall_s, '.0f')} s")
        for reason, n in r.failed_by_reason.items():
            lines.append(f"      failed: {n} x {reason}")
    return lines


def sweep_lines(res: CacheResult) -> list[str]:
    s, o = res.sweep, res.options
    lines = ["router CPU per request against prompt length: pdctl controller (external "
             "backend) in front of an instant engine pair, text prompts, 4 tokens streamed, "
             f"closed loop at concurrency {o.sweep_concurrency}, {o.sweep_requests} requests "
             "per cell; the controller process's CPU (user + system) over the cell / requests. "
             "The instant engines publish no KV events: cache_aware's block index stays empty, "
             "but it tokenizes and hashes every prompt to look it up (the cost shown), and "
             "never finds a hit."]
    if s.error:
        lines.append(f"sweep FAILED: {s.error}")
    hdr = f"{'tokens':>7} | " + " | ".join(f"{p + ' us/req':>20}" for p in SWEEP_POLICIES)
    lines.append(hdr + f" | {'cache_aware/round_robin':>23}")
    for t in CPU_SWEEP_TOKENS:
        cells = {c.policy: c for c in s.cells if c.tokens == t}
        if not cells:
            continue
        row = " | ".join(fmt(cells[p].cpu_us_per_request if p in cells else None, "20,.0f")
                         for p in SWEEP_POLICIES)
        lines.append(f"{t:>7} | {row} | {fmt(sweep_ratio(s, t), '22.2f')}x")
    errs = sum(c.errors for c in s.cells)
    lines.append(f"errors in the sweep: {errs}")
    for c in s.rate:
        lines.append(f"max rate, {c.tokens} tokens, {c.policy}: {c.rps:.1f} requests/s at "
                     f"concurrency {c.concurrency} (errors {c.errors}; controller "
                     f"{c.controller_cpu_us_per_request:,.0f} us/request: one core of it "
                     f"alone would serve {fmt(c.cpu_bound_rps, ',.0f')}/s)")
    return lines


def cache_text(res: CacheResult) -> str:
    o = res.options
    out = [
        f"trace {o.trace.name}: {res.slice_requests} requests from {o.start_s:g} s "
        f"({res.slice_span_s:.0f} s of trace at rate scale {o.rate_scale:g}: "
        f"{res.slice_rate:.2f} requests/s; prompts mean {res.slice_prompt_mean:,.0f}, max "
        f"{res.slice_prompt_max:,} tokens), text prompts (`pdctl replay --text-prompts`)",
        f"fleet: sim {MODEL} {CACHE_HARDWARE}, 4 prefill TP{TP} + 4 decode TP{TP}, "
        f"{o.sim_processes} sim host processes, time scale {o.time_scale:g} (modelled time "
        f"runs {1 / o.time_scale:g}x wall); each run on a fresh fleet (cold caches)",
        f"prefill work the slice asks without hits: {res.prefill_utilization:.0%} of the "
        "prefill pool's modelled time",
        f"hit-rate bound (one LRU cache, the slice's hash ids in order; disaggregated requests "
        f"only): {res.bound_prefill:.3f} with the prefill pool's capacity "
        f"({res.capacity_blocks_prefill:,} blocks of 512 tokens), {res.bound_fleet:.3f} with "
        f"the whole fleet's ({res.capacity_blocks_fleet:,}), {res.bound_infinite:.3f} "
        "unlimited",
        f"goodput: requests with TTFT <= {o.ttft_ms:g} ms and own gap p99 <= {o.gap_ms:g} ms "
        "(modelled), per modelled second; times below are modelled ms (client wall ms / "
        "time scale)",
        "hit rate: the prefill engines' vllm:prefix_cache_hits_total / "
        "vllm:prefix_cache_queries_total growth over the run (tokens; a disaggregated "
        "request's prefill lookup); /bound: against the prefill pool's bound; KV MB/req: "
        "decode engines' vllm:nixl_bytes_transferred_sum growth / ok requests; router CPU: "
        "the controller's (or vllm-router's) process CPU over the replay / requests, idle %: "
        "its CPU share of a core in 2 s before; lag s: engines' pdctl_sim_lag_seconds_total "
        "(modelled time the engines ran late: the machine could not keep up)",
        "", *run_rows(res), "", *extra_rows(res), "", "goals", *(g.line() for g in res.goals),
        "", *sweep_lines(res)]
    if res.argv:
        out.append("")
        out += [f"{k}: {shlex.join(v)}" for k, v in res.argv.items()]
    out.append(f"logs: {res.workdir}")
    return "\n".join(out)
