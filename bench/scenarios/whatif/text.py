"""The what-if benchmark's report."""

from __future__ import annotations

import math

from bench.scenarios.whatif.model import WhatIfResult


def _fid_ms(v: float) -> str:
    return "-" if math.isnan(v) else f"{v:,.0f}" if v >= 100 else f"{v:.1f}"


def _pct(v: float) -> str:
    return "-" if math.isnan(v) else f"{v:+.0%}"


def live_side(r: WhatIfResult) -> str:
    o = r.options
    if o.lab_model_dir is not None:
        return "the real CPU lab (vLLM, KV over NIXL) through the real controller"
    push = ", KV push" if o.kv_mode == "push" else ""
    return (f"the live simulated fleet through the real controller (sim.time_scale "
            f"{o.time_scale:g}{push})")


def whatif_report(r: WhatIfResult) -> str:
    o, s = r.options, r.speed
    lines = [
        f"Discrete-event run: {s.requests:,} requests of {o.trace.name} "
        f"({s.trace_s / 60:.1f} min of trace) on {o.speed_prefill} prefill + "
        f"{o.speed_decode} decode instances (TP1, {s.events:,} events): "
        f"{s.wall_s:.1f} s on one core ({s.trace_s / s.wall_s:,.0f}x the trace's time); "
        f"TTFT p50 {_fid_ms(s.ttft_p50_ms)} ms, {s.within_share:.1%} within targets.",
    ]
    if o.skip_fidelity:
        return "\n".join(lines)
    if r.error:
        return "\n".join(lines + [f"Fidelity: the live run failed: {r.error}"])
    lines += [
        "",
        f"Fidelity: {r.fidelity_requests} requests from {o.fidelity_start_s:g} s, "
        f"{o.fidelity_prefill} prefill + {o.fidelity_decode} decode (TP1), {live_side(r)} "
        f"({r.live_wall_s:.0f} s; {r.live_failed} failed) against the discrete-event run "
        f"({r.des_wall_s:.2f} s). Modelled ms:",
        "",
        "| part | live p50 | DES p50 | error | live p90 | DES p90 | error |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for f in r.fidelity:
        lines.append(f"| {f.part} | {_fid_ms(f.live_p50)} | {_fid_ms(f.des_p50)} | "
                     f"{_pct(f.p50_error)} | {_fid_ms(f.live_p90)} | {_fid_ms(f.des_p90)} | "
                     f"{_pct(f.p90_error)} |")
    return "\n".join(lines)
