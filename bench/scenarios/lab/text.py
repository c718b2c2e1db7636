"""The lab scenario's report: per profile, each metric for the three setups with the
disagg/colocated ratio and the simulator's error; each setup's counts, CPU, the controller's
TTFT accounting and slowest requests; then idle CPU, failures and the calibration."""

from __future__ import annotations

from bench.report import ratio
from bench.scenarios.lab.model import LAB_SETUPS, PROFILES, LabResult, ProfileResult

METRICS = (("ttft_p50_ms", "TTFT p50 ms"), ("ttft_p99_ms", "TTFT p99 ms"),
           ("itl_p50_ms", "ITL p50 ms"), ("itl_p99_ms", "ITL p99 ms"),
           ("req_per_s", "req/s"), ("output_tok_per_s", "out tok/s"),
           ("ttft_p50_long_ms", "TTFT p50 long"), ("ttft_p50_short_ms", "TTFT p50 short"))


def fmt_sig(x: float | None) -> str:
    """``x`` with fewer decimals as it grows; ``-`` for None and NaN."""
    if x is None or x != x:
        return "-"
    return f"{x:.2f}" if abs(x) < 10 else f"{x:.1f}" if abs(x) < 1000 else f"{x:.0f}"


def fmt_ratio(a: float | None, b: float | None) -> str:
    r = ratio(a, b)
    return "-" if r != r else f"{r:.2f}"


def metric_lines(got: dict[str, ProfileResult | None]) -> list[str]:
    """Each metric for the three setups, their ratios and the simulator's error."""
    lines = [f"  {'metric':<16}{'disagg':>10}{'colocated':>11}{'sim':>10}"
             f"{'disagg/colo':>13}{'sim/real':>10}{'sim err %':>11}"]
    for key, label in METRICS:
        v: dict[str, float | None] = {
            s: (getattr(g, key) if g is not None else None) for s, g in got.items()}
        e = ratio(v["sim"], v["disagg"])
        err = "-" if e != e else f"{100 * (e - 1):+.0f}"
        lines.append(f"  {label:<16}{fmt_sig(v['disagg']):>10}{fmt_sig(v['colocated']):>11}"
                     f"{fmt_sig(v['sim']):>10}{fmt_ratio(v['disagg'], v['colocated']):>13}"
                     f"{fmt_ratio(v['sim'], v['disagg']):>10}{err:>11}")
    return lines


def setup_lines(s: str, g: ProfileResult) -> list[str]:
    """One setup's run of a profile: counts, CPU, router medians, lease counters, the tail."""
    parts = "; ".join(f"{path}: " + " ".join(
        f"{k.removesuffix('_ms')} {v:.0f}" for k, v in d.items() if k != "n")
        + f" (n={d['n']:.0f})" for path, d in g.router.items())
    lines = [f"  {s:<10} {g.requests_ok} ok, {g.requests_errored} errors, "
             f"{g.n_long} long / {g.n_short} short; CPU "
             f"{g.cpu.get('user_pct', 0):.0f}% user "
             f"{g.cpu.get('system_pct', 0):.0f}% sys "
             f"{g.cpu.get('idle_pct', 0):.0f}% idle, "
             f"load {g.cpu.get('load_avg_1m', 0):.1f}, "
             f"our processes {g.cpu.get('our_cores_busy', 0):.2f} cores; "
             f"router medians ms: {parts}"]
    if g.lease is not None:
        lines.append(f"  {'':<10} prefill KV lease counters after this profile "
                     f"(cumulative): expired {g.lease['expired']:g}, read after "
                     f"expiry {g.lease['after_expiry']:g}")
    for r in g.tail:
        lines.append(f"  {'':<10} slow: {r['path']} {r['prompt_tokens']} tok, TTFT "
                     f"{r['ttft_ms']:.0f} = queue {r['queue_ms']:.0f} + prefill "
                     f"{r['prefill_ms']:.0f} + transfer {r['transfer_ms']:.0f} + "
                     f"decode_sched {r['decode_sched_ms']:.0f} + overhead "
                     f"{r['overhead_ms']:.0f} ms, retries {r['retries']} ({r['id']})")
    return lines


def comparison_table(res: LabResult) -> str:
    lines = []
    for profile in PROFILES:
        got = {s: (res.setups[s].profiles.get(profile) if s in res.setups else None)
               for s in LAB_SETUPS}
        lines.append(f"\n{profile}" + (f" ({res.options.streams} streams)"
                                        if profile == "concurrent" else ""))
        lines += metric_lines(got)
        for s, g in got.items():
            if g is not None:
                lines += setup_lines(s, g)
    idle = [f"{s}: {res.setups[s].idle_cpu['system_pct']:.0f}% sys, "
            f"{res.setups[s].idle_cpu['idle_pct']:.0f}% idle, our processes "
            f"{res.setups[s].idle_cpu['our_cores_busy']:.2f} cores busy"
            for s in LAB_SETUPS if s in res.setups and "system_pct" in res.setups[s].idle_cpu]
    if idle:
        lines.append("\nidle, engines up, no traffic: " + "; ".join(idle))
    failed = [f"{s}: {r.error}" for s, r in res.setups.items() if r.error]
    if failed:
        lines.append("\nFAILED setups: " + "; ".join(failed))
    taken = [f"{s} from {r.taken_from}" for s, r in res.setups.items() if r.taken_from]
    if taken:
        lines.append("\nnot run now: " + ", ".join(taken))
    return "\n".join(lines)


def lab_report(res: LabResult) -> str:
    out = [comparison_table(res).lstrip("\n")]
    if res.calibration:
        out.append("\ncpu-lab constants that reproduce the real P/D synchronous ITL p50 and "
                   "prefill median (pdctl_api/profiles.py): " + ", ".join(
                       f"{k} {v:.3g}" for k, v in res.calibration.items()))
    out.append(f"\ntotal {res.total_s / 60:.1f} min; guidellm outputs and logs in "
               f"{res.options.work}")
    return "\n".join(out)
