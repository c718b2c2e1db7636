"""The planner scenario's report: the stepped load's planner intervals as a table, recovery
after each step, accelerator-seconds and pool changes; then P/D against colocated per setup
and rate, the SLOs and the advisor's verdict."""

from __future__ import annotations

import math

from bench.report import fmt
from bench.scenarios.planner.model import PdResult, PlannerBench, PlannerOptions, PlannerStepResult


def step_lines(s: PlannerStepResult) -> list[str]:
    o = s.options
    lines = [
        f"Stepped load ({o['low']:g} -> {o['high']:g} -> {o['low']:g} modelled requests/s, "
        f"{o['phases']} intervals of {o['interval_s']:g} wall s, time scale "
        f"{o['step_scale']:g}; targets TTFT p95 {o['ttft_ms']:g} ms, gap p95 "
        f"{o['itl_ms']:g} ms; {o['nodes'] * 8} H100 in the cluster): "
        f"{s.requests} requests, {s.failed} failed.",
        "",
        "| t (wall s) | rate obs | rate pred | prefill | decode | rec. P | rec. D | TTFT p95 ms "
        "| gap p95 ms | |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for iv in s.intervals:
        lines.append(
            f"| {iv.t:.0f} | {fmt(iv.rate, '.1f')} | {fmt(iv.predicted, '.1f')} | {iv.prefill} "
            f"| {iv.decode} | {iv.rec_prefill} | {iv.rec_decode} | {fmt(iv.ttft_p95_ms, '.0f')} "
            f"| {fmt(iv.gap_p95_ms, '.1f')} | {'applied' if iv.applied else iv.hold or ''} |")
    rec = ", ".join("not within the run" if r is None else f"{r:g}"
                    for r in s.recovered_after)
    saved = 1 - s.accel_seconds / s.fixed_accel_seconds if s.fixed_accel_seconds else math.nan
    return lines + [
        "",
        f"Intervals after each step (up, down) until TTFT p95 and gap p95 were both under "
        f"target: {rec}.",
        f"Accelerator-seconds: {s.accel_seconds:,.0f} used against {s.fixed_accel_seconds:,.0f}"
        f" for a fixed fleet of the peak ({s.peak_accelerators} accelerators) over the same "
        f"{s.duration_s:.0f} s: {saved:.0%} fewer.",
        "Pool changes (all by the planner): " + "; ".join(
            f"{c['t']:.0f} s {c['pool']} {c['from']}->{c['to']}" for c in s.changes),
        "Timeline chart: `bench-results/planner-timeline.html`."]


def pd_lines(pd: PdResult) -> list[str]:
    lines = [
        "P/D against colocated at 8 H100 (20 % prompts 3,000-7,600 tokens, 80 % 100-300, "
        "150-300 output tokens, all streamed; modelled ms):",
        "",
        "| setup | req/s | TTFT short p50 / p99 | TTFT long p50 / p99 | gap p99 / p99.9 "
        "| worst gap p50 / p99 | mean ITL p50 | goodput TTFT+worst gap | goodput TTFT+mean ITL "
        "| failed |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for x in pd.sides:
        lines.append(
            f"| {x.setup} | {x.rate:g} | {fmt(x.ttft_short_p50, '.0f')} / "
            f"{fmt(x.ttft_short_p99, '.0f')} | {fmt(x.ttft_long_p50, '.0f')} / "
            f"{fmt(x.ttft_long_p99, '.0f')} | {fmt(x.gap_p99, '.1f')} / {fmt(x.gap_p999, '.1f')}"
            f" | {fmt(x.worst_gap_p50, '.0f')} / {fmt(x.worst_gap_p99, '.0f')} | "
            f"{fmt(x.mean_itl_p50, '.1f')} | {fmt(x.goodput_worst_gap, '.2f')} | "
            f"{fmt(x.goodput_mean_itl, '.2f')} | {x.failed} |")
    adv, slo = pd.advisor, PlannerOptions()
    return lines + [
        "", f"SLOs: TTFT <= {slo.slo_ttft_ms:g} ms and worst gap <= "
        f"{slo.slo_worst_gap_ms:g} ms; TTFT <= {slo.slo_ttft_ms:g} ms and "
        f"mean ITL <= {slo.slo_mean_itl_ms:g} ms (goodput: such requests per "
        "modelled second).",
        f"Advisor on the P/D run's traffic: **{adv.get('decision')}** — "
        + "; ".join(adv.get("reasons", []))]


def planner_report(res: PlannerBench) -> str:
    return "\n".join([*step_lines(res.step), "", *pd_lines(res.pd)])
