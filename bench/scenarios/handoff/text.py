"""The hand-off scenario's pure parts: the best fixed threshold, the goals, and the report
(the workloads, one row per run, the slo decisions' mix and what each side cost)."""

from __future__ import annotations

import math
import shlex
import statistics
from collections.abc import Callable

from bench.report import fmt, ratio
from bench.scenarios.cache.model import CACHE_HARDWARE as HARDWARE
from bench.scenarios.cache.model import DECODE, MODEL, PREFILL, TP
from bench.scenarios.handoff.model import (
    HIGH,
    LOCAL,
    LOW,
    SLO,
    HandoffResult,
    HandoffRun,
    Workload,
    policy_label,
    policy_threshold,
    threshold_policy,
)
from bench.scenarios.router.model import Goal

SHORT_MARGIN = 1.10  # slo's TTFT on a short workload: at most 10 % worse than always-local
HIGH_FACTOR = 2.0  # slo's mean TTFT at the higher load: at least 2x better than the best fixed


def run_of(runs: list[HandoffRun], workload: str, policy: str,
       get: Callable[[HandoffRun], float]) -> float:
    """A figure of ``policy``'s runs on ``workload``: the median over rounds (NaN: none)."""
    vals = [v for v in (get(r) for r in runs if r.workload == workload and r.policy == policy
                        and r.error is None) if not math.isnan(v)]
    return statistics.median(vals) if vals else math.nan


def best_threshold(runs: list[HandoffRun], workload: str = HIGH) -> int | None:
    """The fixed threshold with the lowest mean TTFT on ``workload`` (always-disagg and
    always-local included; a tie goes to the lower threshold); None when none finished."""
    means: dict[int, float] = {}
    for r in runs:
        t = policy_threshold(r.policy)
        if r.workload == workload and t is not None and r.error is None:
            means[t] = run_of(runs, workload, r.policy, lambda x: x.ttft_mean_ms)
    known = [(m, t) for t, m in means.items() if not math.isnan(m)]
    return min(known)[1] if known else None


def handoff_goals(res: HandoffResult) -> list[Goal]:
    runs, out = res.runs, []
    best = res.best_threshold
    slo_high = run_of(runs, HIGH, SLO, lambda r: r.ttft_mean_ms)
    if best is None:
        out.append(Goal(f"slo's mean TTFT at the higher load at least {HIGH_FACTOR:g}x better "
                        "than the best fixed threshold's", None, "no threshold run finished"))
    else:
        b = run_of(runs, HIGH, threshold_policy(best), lambda r: r.ttft_mean_ms)
        out.append(Goal(
            f"slo's mean TTFT at the higher load at least {HIGH_FACTOR:g}x better than the "
            f"best fixed threshold's ({policy_label(threshold_policy(best))})",
            None if math.isnan(b) or math.isnan(slo_high) else b >= HIGH_FACTOR * slo_high,
            f"{fmt(slo_high, ',.0f')} vs {fmt(b, ',.0f')} ms: {fmt(ratio(b, slo_high), '.2f')}x"))
    local = threshold_policy(LOCAL)
    for w in res.workloads:
        if not w.short:
            continue
        figs = [(name, run_of(runs, w.name, SLO, get), run_of(runs, w.name, local, get))
                for name, get in (("mean", lambda r: r.ttft_mean_ms),
                                  ("p90", lambda r: r.ttft_p90_ms),
                                  ("p99", lambda r: r.ttft_p99_ms))]
        known = [(n, s, loc) for n, s, loc in figs if not (math.isnan(s) or math.isnan(loc))]
        out.append(Goal(
            f"{w.name}: slo's TTFT (mean, p90, p99) never more than "
            f"{(SHORT_MARGIN - 1) * 100:.0f}% worse than always-local's",
            all(s <= SHORT_MARGIN * loc for _, s, loc in known) if known else None,
            ", ".join(f"{n} {fmt(s, ',.0f')} vs {fmt(loc, ',.0f')} ms "
                      f"({fmt((ratio(s, loc) - 1) * 100, '+.0f')}%)" for n, s, loc in figs)))
    bad = [f"{r.workload} {r.label} (round {r.round}): {r.failed} failed"
           + (f", run failed: {r.error[:80]}" if r.error else "")
           for r in runs if r.failed or r.error]
    out.append(Goal("0 failed requests (every run)", not bad if runs else None,
                    "; ".join(bad) if bad else f"{sum(r.requests for r in runs)} requests"))
    return out


def comparisons(res: HandoffResult) -> list[str]:
    """slo against every other policy on every workload: mean TTFT ratios (not goals)."""
    lines = ["slo's mean TTFT against each other policy's (other / slo: > 1 means slo is "
             "faster)"]
    for w in res.workloads:
        slo = run_of(res.runs, w.name, SLO, lambda r: r.ttft_mean_ms)
        others = sorted({r.policy for r in res.runs if r.workload == w.name and r.policy != SLO},
                        key=lambda p: policy_threshold(p) or 0)
        cells = [f"{policy_label(p)} "
                 f"{fmt(ratio(run_of(res.runs, w.name, p, lambda r: r.ttft_mean_ms), slo), '.2f')}x"
                 for p in others]
        lines.append(f"  {w.name}: " + (", ".join(cells) if cells else "n/a"))
    return lines


def workload_lines(res: HandoffResult) -> list[str]:
    lines = [f"{'workload':15} {'trace':29} {'slice':>16} {'req/s':>6} {'prompt':>7} "
             f"{'output':>6} {'prefill pool':>12} {'fleet':>6}"]
    for w in res.workloads:
        sl = f"{w.limit} from {w.start_s:g} s"
        lines.append(f"{w.name:15} {w.trace.name[:29]:29} {sl:>16} {fmt(w.rate, '6.2f')} "
                     f"{fmt(w.prompt_mean, '7,.0f')} {fmt(w.output_mean, '6.0f')} "
                     f"{fmt(w.prefill_util * 100, '11.0f')}% {fmt(w.fleet_util * 100, '5.0f')}%"
                     f"  (rate scale {w.rate_scale:g})")
    return lines


def handoff_rows(res: HandoffResult, w: Workload) -> list[str]:
    lines = []
    for r in res.runs:
        if r.workload != w.name:
            continue
        if r.error:
            lines.append(f"  {r.label:15} {r.round:>3} FAILED: {r.error}")
            continue
        lines.append(
            f"  {r.label:15} {r.round:>3} {r.ok:>4} {r.failed:>4} {fmt(r.ttft_mean_ms, '9,.0f')} "
            f"{fmt(r.ttft_p50_ms, '8,.0f')} {fmt(r.ttft_p90_ms, '8,.0f')} "
            f"{fmt(r.ttft_p99_ms, '8,.0f')} {fmt(r.gap_p99_ms, '7,.0f')} {r.goodput:>5} "
            f"{fmt(r.goodput_per_s, '9.3f')} {r.disaggregated:>6}/{r.local:<5} "
            f"{r.sim_lag_s:6.1f}")
    return lines


def runs_table(res: HandoffResult) -> list[str]:
    hdr = (f"  {'policy':15} {'rnd':>3} {'ok':>4} {'fail':>4} {'TTFT mean':>9} {'p50':>8} "
           f"{'p90':>8} {'p99':>8} {'gap p99':>7} {'good':>5} {'goodput/s':>9} "
           f"{'disagg/local':>12} {'lag s':>6}")
    out: list[str] = []
    for w in res.workloads:
        out += [f"{w.name} (rate scale {w.rate_scale:g})", hdr, *handoff_rows(res, w), ""]
    return out


def by_class_lines(res: HandoffResult) -> list[str]:
    lines = ["mean TTFT by the trace's prompt length (modelled ms)"]
    for r in res.runs:
        if r.error or r.workload not in (HIGH, LOW) or not r.ttft_mean_by_class:
            continue
        cells = ", ".join(f"{c} {v:,.0f}" for c, v in r.ttft_mean_by_class.items())
        lines.append(f"  {r.workload:13} {r.label:15} round {r.round}: {cells}")
    return lines


def decision_lines(res: HandoffResult) -> list[str]:
    lines = ["slo's decisions (the controller's request records): counts by reason, then per "
             "decision the means of prompt and uncached tokens, TTFT and its parts, and the "
             "estimates the decision weighed (modelled ms)"]
    for r in res.runs:
        if r.error or r.policy != SLO:
            continue
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(r.reasons.items(), key=lambda x: -x[1]))
        lines.append(f"  {r.workload} round {r.round}: {kinds}")
        for d, m in r.by_decision.items():
            lines.append(
                f"    {d:13} n {m['n']:.0f}: prompt {fmt(m['prompt_tokens'], ',.0f')}, "
                f"uncached {fmt(m['uncached'], ',.0f')}, TTFT {fmt(m['ttft_ms'], ',.0f')} "
                f"(queue {fmt(m['queue_ms'], ',.0f')}, prefill {fmt(m['prefill_ms'], ',.0f')}, "
                f"transfer {fmt(m['transfer_ms'], ',.0f')}); estimated local "
                f"{fmt(m['est_local_ms'], ',.0f')}, disaggregated "
                f"{fmt(m['est_disagg_ms'], ',.0f')}")
    return lines


def handoff_text(res: HandoffResult) -> str:
    o = res.options
    best = res.best_threshold
    swept = ", ".join(policy_label(threshold_policy(t)) for t in o.thresholds)
    out = [
        f"fleet: sim {MODEL} {HARDWARE}, {PREFILL} prefill TP{TP} + {DECODE} decode TP{TP}, "
        f"{o.sim_processes} sim host processes, time scale {o.time_scale:g}; cache_aware on "
        "both pools for every policy; each run on a fresh fleet (cold caches); token-id "
        "prompts (`pdctl replay`)",
        f"routing targets the slo decision reads: TTFT {o.ttft_ms:g} ms, gap {o.gap_ms:g} ms "
        "(modelled; the controller's targets.ttft_p95_ms / gap_p99_ms in wall ms); goodput: "
        "requests within both, per modelled second; every time below is modelled ms",
        "prefill pool / fleet: the workload's prefill work without prefix hits over the "
        "prefill pool's modelled time / every engine's", "", *workload_lines(res), "",
        *runs_table(res),
        f"fixed thresholds swept at the higher load: {swept}; best by mean TTFT: "
        + (policy_label(threshold_policy(best)) + f" ({best:,} tokens)" if best is not None
           else "none finished"), "",
        *comparisons(res), "", *by_class_lines(res), "", *decision_lines(res), "",
        "goals", *(g.line() for g in res.handoff_goals)]
    if res.argv:
        out.append("")
        out += [f"{k}: {shlex.join(v)}" for k, v in res.argv.items()]
    if res.records_file:
        out.append(f"records (decision, reason, TTFT parts per request): {res.records_file}")
    out.append(f"logs: {res.workdir}")
    return "\n".join(out)



