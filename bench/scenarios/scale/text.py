"""The scale scenario's report: one labelled row per figure -- the fleet and its start, the
workload, rates and errors, client and controller latencies, where the CPU went, peaks,
instance failures and the cleanup."""

from __future__ import annotations

from bench.fleet import SIM_HARDWARE, SIM_MODEL_70B
from bench.report import fmt
from bench.scenarios.scale.model import (
    DECODE_TP,
    PER_NODE,
    PREFILL_TP,
    ControllerView,
    CpuUse,
    IdleCpu,
    ScaleResult,
    Summary,
    processes_phrase,
)

Rows = list[tuple[str, str]]


def failures_line(lines: list[str]) -> str:
    if not lines:
        return "none"
    kinds: dict[str, int] = {}
    for ln in lines:
        why = ln.split(": ", 1)[-1].split(" [log")[0]
        kinds[why] = kinds.get(why, 0) + 1
    logs = [ln.split(" [log: ", 1)[1].rstrip("]") for ln in lines if " [log: " in ln]
    return (f"{len(lines)}: " + "; ".join(f"{n} x {k!r}" for k, n in kinds.items())
            + (f"; last log line of an exited engine: {logs[0]!r}" if logs else ""))


def fleet_rows(res: ScaleResult) -> Rows:
    o, f = res.options, res.fleet
    rows: Rows = [
        ("fleet", f"{o.prefill} prefill x TP{PREFILL_TP} + {o.decode} decode x TP{DECODE_TP}"
                  f" on {res.nodes} nodes x {PER_NODE} ({SIM_MODEL_70B}, {SIM_HARDWARE}, "
                  f"time_scale {o.time_scale}, engine nice {o.engine_nice}, "
                  f"{processes_phrase(o.sim_processes)}; modelled prefill capacity "
                  f"~{res.modelled_prefill_capacity_rps:.0f} req/s)")]
    if f is not None:
        rows.append(("fleet start (all ready)",
                     f"{f.fleet_start_s} s (controller up {f.controller_up_s} s; instance "
                     f"start p50 {fmt(f.instance_start_s_p50, '.1f')} s, max "
                     f"{fmt(f.instance_start_s_max, '.1f')} s)"))
    rows.append(("workload", f"{'poisson' if o.poisson else 'constant'} arrivals, prompts "
                             f"{o.prompt_tokens[0]}-{o.prompt_tokens[1]} tok, max_tokens "
                             f"{o.max_tokens}, {int(o.stream_share * 100)}% streamed, timeout "
                             f"{o.timeout} s"))
    return rows


def client_rows(s: Summary) -> Rows:
    return [
        ("offered / sent / achieved", f"{s.offered_rps} / {s.sent_rps} / "
                                      f"{s.achieved_rps} req/s over {s.window_s} s"),
        ("errors", f"{s.error_total} of {s.arrivals_in_window} "
                   f"({fmt(s.error_share * 100, '.2f')}%) {s.errors or ''}"),
        *(("  sample", f"{k}: {v[0][:150]}") for k, v in s.error_samples.items()),
        ("client TTFT p50 / p99", f"{fmt(s.client_ttft_ms_p50, '')} / "
                                  f"{fmt(s.client_ttft_ms_p99, '')} ms  "
                                  f"(streamed, n={s.streamed_ok})"),
        ("client e2e p50 / p99", f"{fmt(s.client_e2e_ms_p50, '')} / "
                                 f"{fmt(s.client_e2e_ms_p99, '')} ms  (non-streamed)")]


def controller_rows(cv: ControllerView | None, s: Summary) -> Rows:
    if cv is None:
        return [("controller metrics", "n/a (scrape failed)")]
    return [
        ("controller TTFT p50 / p99", f"{fmt(cv.ttft_ms_p50, '')} / "
                                      f"{fmt(cv.ttft_ms_p99, '')} ms "
                                      "(pdctl_ttft_seconds, buckets)"),
        ("controller TTFT parts (mean)", " ".join(
            f"{k} {v}" for k, v in cv.ttft_parts_mean_ms.items()) + " ms"),
        ("metrics delta interval",
         f"window +{fmt(cv.start_s, '')} s .. +{cv.end_s} s of a {s.window_s} s "
         f"window (controller /metrics answered in {cv.scrape_latency_s} s)"),
        ("routing decision p50 / p99", cv.routing_decision)]


def cpu_rows(c: CpuUse | None, s: Summary, i: IdleCpu) -> Rows:
    if c is None:
        return []
    return [
        ("controller CPU", f"{c.controller_cores} cores, "
                           f"{c.controller_cpu_ms_per_req} ms per completed req "
                           f"({fmt(c.controller_cpu_ms_per_handled, '')} ms per "
                           f"request it recorded); idle with the fleet: "
                           f"{i.controller_cores} cores, so "
                           f"{c.controller_cpu_ms_per_req_above_idle} ms/req above "
                           "idle"),
        ("engines CPU (all)", f"{c.engines_cores} cores, {c.engines_cpu_ms_per_req} "
                              f"ms per completed req; idle: {i.engines_cores} cores, "
                              f"so {c.engines_cpu_ms_per_req_above_idle} ms/req above "
                              "idle"),
        ("client CPU", f"{c.client_cores} cores, {c.client_cpu_ms_per_req} ms/req; "
                       f"send lag p50/p99 {fmt(s.send_lag_ms_p50, '')} / "
                       f"{fmt(s.send_lag_ms_p99, '')} ms"),
        ("machine CPU", f"{c.machine_busy_cores} of {c.machine_cores} cores busy; "
                        f"other processes {c.other_cores} cores"),
        *(("  other", line) for line in c.top_other_processes)]


def scale_report(res: ScaleResult) -> str:
    s, i = res.summary, res.idle
    rows = fleet_rows(res)
    if s is not None and i is not None:
        c, cv = s.cpu, s.controller
        rows += [*client_rows(s), *controller_rows(cv, s), *cpu_rows(c, s, i),
                 ("paths (controller)", f"{cv.requests_by_path if cv else 'n/a'}"),
                 ("peaks", f"in-flight {s.peak_inflight}, controller fds "
                           f"{s.controller_peak_fds}, min ready during run "
                           f"{s.ready_min_during_run}, engine processes exited in window "
                           f"{c.engines_exited_in_window if c else 'n/a'}")]
    rows.append(("instance failures", failures_line(res.instance_failures)))
    if res.cleanup is not None:
        k = res.cleanup
        rows.append(("cleanup", f"stop_s {k.stop_s}, controller_exit {k.controller_exit}, "
                                f"engines_left_after_sigterm {k.engines_left_after_sigterm}, "
                                f"processes_tracked {k.processes_tracked}, "
                                f"engine_processes_left {k.engine_processes_left}"))
    width = max(len(k) for k, _ in rows)
    out = [f"{k:<{width}}  {v}" for k, v in rows]
    out.append(f"total run time {res.total_s} s")
    return "\n".join(out)
