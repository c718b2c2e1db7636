"""The soak's report."""

from __future__ import annotations

from bench.scenarios.soak.model import SoakResult


def soak_report(res: SoakResult, problems: list[str]) -> str:
    o = res.options
    mem, fds = res.memory(), res.descriptors()
    lines = [
        f"fleet: sim llama-3-8b h100-sxm, {o.prefill}P + {o.decode}D TP1 to start, an engine "
        f"process each, KV lease 6 s, planner apply every {o.planner_interval:g} s; load "
        f"{o.rate:g} req/s Poisson for {o.duration:g} s, half streamed; a fault every "
        f"{o.fault_every:g} s; wall {res.wall_s:g} s",
        "",
        f"requests {res.requests:,}: ok {res.ok:,}, clear errors "
        f"{sum(res.clear_errors.values()):,} {dict(sorted(res.clear_errors.items()))}, lost "
        f"{res.lost_total} {res.lost or ''}",
    ]
    for kind, samples in res.lost_samples.items():
        lines.append(f"  lost '{kind}', e.g. {samples[0][:160]}")
    lines += ["", "faults (seconds into the load):"]
    lines += [f"  {f.t:7.1f}  {f.kind:13s} {f.target}: {f.detail}" for f in res.faults]
    lines += [
        "",
        f"planner pool changes applied: {res.planner_changes}; instances failed (and "
        f"replaced): {len(res.instance_failures)}",
        f"controller RSS MB: first fifth {mem['first']:g}, last fifth {mem['last']:g} "
        f"({mem['ratio']:g}x), peak {mem['peak']:g}; file descriptors {fds['first']:g} -> "
        f"{fds['last']:g} (peak {fds['peak']:g}); {len(res.samples)} samples",
        f"KV handles held after the lease: {res.kv_handles_left or 'none'}; processes left: "
        f"{res.processes_left}",
        "",
        "verdict: " + ("; ".join(problems) if problems else
                       "0 requests lost, nothing held, nothing left"
                       + ("" if o.duration < 600 else ", memory and descriptors flat")),
    ]
    if res.logs:
        lines.append(f"logs: {res.logs}")
    return "\n".join(lines)
