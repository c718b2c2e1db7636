"""The ray_start scenario's report and verdict: start and stop times of both launchers side
by side, CPU and memory per kind of process over the idle windows, the ratios, and what
failed or was left (never a timing)."""

from __future__ import annotations

import math

from bench.fleet import SIM_HARDWARE, SIM_MODEL_8B
from bench.report import fmt, ratio
from bench.scenarios.ray_start.model import (
    ACCEL,
    KIND_CONTROLLER,
    KIND_ENGINES,
    KIND_HOSTS,
    PROCESS_KINDS,
    RAY_KINDS,
    Group,
    LauncherRun,
    RayOptions,
    RayStartResult,
    Usage,
)

READY = "all ready after spawn (s)"
GONE = "all gone after SIGTERM (s)"


def ray_failures(res: RayStartResult) -> list[str]:
    """What went wrong: a launcher that did not bring every instance up or did not stop
    cleanly, processes/actors/placement groups left. Never a timing."""
    out = []
    for run in (res.local, res.ray):
        if run is None:
            continue
        if run.error:
            out.append(f"{run.launcher}: {run.error.splitlines()[0][:200]}")
        elif run.start is None:
            out.append(f"{run.launcher}: instances not all ready")
        if run.stop is not None and run.stop.left:
            out.append(f"{run.launcher}: {len(run.stop.left)} left after stop")
        elif run.stop is None:
            out.append(f"{run.launcher}: not stopped")
    if res.leftovers:
        out.append(f"{len(res.leftovers)} left after the run")
    return out


def each(g: Group | None, attr: str) -> float:
    """``g.<attr>`` per process (NaN without processes)."""
    if g is None or not g.count:
        return math.nan
    return float(getattr(g, attr)) / g.count


def times(a: float, b: float) -> str:
    """``a / b`` as ``2.50x``, or ``n/a``."""
    r = ratio(a, b)
    return "n/a" if math.isnan(r) else f"{r:.2f}x"


def group_row(label: str, g: Group, per: bool = False) -> str:
    rss, pss = (fmt(each(g, "rss_mib"), "9.1f"), fmt(each(g, "pss_mib"), "9.1f")) if per \
        else ("", "")
    return (f"  {label:<30} {g.count:>4} {g.cpu_s:>8.2f} {g.cores:>7.3f} "
            f"{fmt(g.rss_mib, '9.1f')} {fmt(g.pss_mib, '9.1f')} {rss:>9} {pss:>9}").rstrip()


def usage_table(title: str, u: Usage, kinds: tuple[str, ...], totals: dict[str, tuple[str, ...]]
                ) -> list[str]:
    other = u.machine_busy_cores - u.total(PROCESS_KINDS).cores
    out = [f"{title} ({u.seconds} s; machine {u.machine_busy_cores} cores busy, "
           f"{max(0.0, other):.2f} of them outside this run)"]
    for k in kinds:
        g = u.get(k)
        if g is not None:
            out.append(group_row(k, g, per=g.count > 1))
    for label, ks in totals.items():
        out.append(group_row(label, u.total(ks)))
    for g in u.nodes:
        out.append(group_row(g.kind, g))
    return out


def timings(run: LauncherRun | None) -> dict[str, float]:
    """The start and stop times of one launcher, by report label (NaN where missing)."""
    s = run.start if run is not None else None
    t = run.stop if run is not None else None
    nan = math.nan
    return {
        READY: s.seconds if s else nan,
        "  controller up (s)": s.controller_up_s if s else nan,
        "  first instance ready (s)": s.first_ready_s if s else nan,
        "  instance start p50 (s)": s.instance_start_s_p50 if s else nan,
        "  instance start max (s)": s.instance_start_s_max if s else nan,
        "  CPU s, every process": s.cpu.total(PROCESS_KINDS).cpu_s if s and s.cpu else nan,
        GONE: t.seconds if t else nan,
        "  controller exited (s)": t.controller_exit_s if t else nan,
        "  engine processes gone (s)": t.engines_gone_s if t else nan,
        "  EngineHost workers gone (s)": t.hosts_gone_s if t else nan,
        "  named actors gone (s)": t.actors_gone_s if t else nan,
        "  placement groups gone (s)": t.placement_groups_gone_s if t else nan,
    }


def header_lines(res: RayStartResult) -> list[str]:
    o = res.options
    return [f"fleet: {o.prefill} prefill + {o.decode} decode x TP1, sim {SIM_MODEL_8B} on "
            f"{SIM_HARDWARE} (time_scale {o.time_scale}, startup_delay_s {o.startup_delay}), "
            f"config {o.worker_nodes} nodes x {o.node_accel}; ray: head (1 CPU, no {ACCEL}) + "
            f"{o.worker_nodes} worker nodes x ({o.node_cpus} CPUs, {o.node_accel} {ACCEL}), "
            f"ray.cluster_utils.Cluster, 150 MiB object store per node",
            f"machine: {res.machine}; load average "
            f"{' '.join(f'{x:.2f}' for x in res.load_before)} before, "
            f"{' '.join(f'{x:.2f}' for x in res.load_after or ())} after; network "
            f"namespace {res.netns}", ""]


def start_stop_lines(res: RayStartResult) -> list[str]:
    """Both launchers' times side by side, what was up when ready, and the starts' CPU."""
    o, runs = res.options, (res.local, res.ray)
    ta, tb = timings(res.local), timings(res.ray)
    out = [f"{o.instances} instances: start and stop         local       ray  ray/local"]
    for label, a in ta.items():
        b = tb[label]
        out.append(f"  {label:<34} {fmt(a, '7.2f')}   {fmt(b, '7.2f')}   "
                   f"{fmt(ratio(b, a), '7.2f')}")
    for run in runs:
        if run is not None and run.start is not None:
            s = run.start
            extra = (f", ray::EngineHost workers {s.host_processes}, named actors {s.actors}, "
                     f"placement groups {s.placement_groups}") if run.launcher == "ray" else ""
            out.append(f"  {run.launcher} when ready: engine processes {s.engine_processes}"
                       f"{extra}")
    out.append(f"  ray cluster (head + {o.worker_nodes} workers): started in "
               f"{fmt(res.cluster_start_s, '')} s, shut down in "
               f"{fmt(res.cluster_teardown_s, '')} s (neither in the times above)")
    for run in runs:
        if run is not None and run.start is not None and run.start.cpu is not None:
            u = run.start.cpu
            parts = ", ".join(f"{g.kind} {g.cpu_s:.1f}" for g in u.groups if g.cpu_s >= 0.05)
            out.append(f"  CPU s during the {run.launcher} start ({u.seconds} s, machine "
                       f"{u.machine_busy_cores} cores busy): {parts}")
    return out


def idle_lines(res: RayStartResult) -> list[str]:
    """CPU and memory per kind of process: the idle cluster, then each launcher's fleet."""
    n, lo, ry = res.options.instances, res.local, res.ray
    out = ["", "CPU and memory over an idle window: CPU s, cores (= CPU s / window), RSS and "
               "PSS MiB summed at its end, and per process",
           f"  {'process':<30} {'n':>4} {'CPU s':>8} {'cores':>7} {'RSS MiB':>9} "
           f"{'PSS MiB':>9} {'RSS/proc':>9} {'PSS/proc':>9}"]
    if res.cluster_idle is not None:
        out += usage_table("ray cluster idle: no driver, no actor", res.cluster_idle,
                           RAY_KINDS, {"ray total": RAY_KINDS})
    if ry is not None and ry.idle is not None:
        out += usage_table(f"ray launcher, {n} instances ready, no traffic", ry.idle,
                           (*RAY_KINDS, KIND_HOSTS, KIND_ENGINES, KIND_CONTROLLER),
                           {"ray system total": RAY_KINDS,
                            "ray total (system + hosts)": (*RAY_KINDS, KIND_HOSTS),
                            "all": PROCESS_KINDS})
    if lo is not None and lo.idle is not None:
        out += usage_table(f"local launcher, {n} instances ready, no traffic",
                           lo.idle, (KIND_ENGINES, KIND_CONTROLLER), {"all": PROCESS_KINDS})
    return out


def ratio_lines(res: RayStartResult, lo: Usage, ry: Usage) -> list[str]:
    """Ray against local over the idle windows: the whole run, per instance, Ray's own."""
    ta, tb = timings(res.local), timings(res.ray)
    la, ra = lo.total(PROCESS_KINDS), ry.total(PROCESS_KINDS)
    rsys, hosts = ry.total(RAY_KINDS), ry.get(KIND_HOSTS)
    le, re_ = lo.get(KIND_ENGINES), ry.get(KIND_ENGINES)
    out = ["", "ratios (ray / local, idle window, every process of the run)",
           f"  start {times(tb[READY], ta[READY])}, stop {times(tb[GONE], ta[GONE])}, "
           f"CPU {times(ra.cpu_s, la.cpu_s)} "
           f"({ra.cores:.3f} vs {la.cores:.3f} cores), RSS "
           f"{times(ra.rss_mib, la.rss_mib)} "
           f"({ra.rss_mib:.0f} vs {la.rss_mib:.0f} MiB), PSS "
           f"{times(ra.pss_mib, la.pss_mib)} "
           f"({ra.pss_mib:.0f} vs {la.pss_mib:.0f} MiB)"]
    if hosts is not None:
        out.append(f"  per instance on Ray: its ray::EngineHost worker "
                   f"{fmt(each(hosts, 'rss_mib'), '.1f')} MiB RSS / "
                   f"{fmt(each(hosts, 'pss_mib'), '.1f')} MiB PSS and "
                   f"{fmt(each(hosts, 'cores') * 1000, '.2f')} millicores, beside its "
                   f"engine's {fmt(each(re_, 'rss_mib'), '.1f')} MiB RSS / "
                   f"{fmt(each(re_, 'pss_mib'), '.1f')} MiB PSS and "
                   f"{fmt(each(re_, 'cores') * 1000, '.2f')} millicores (a local engine: "
                   f"{fmt(each(le, 'rss_mib'), '.1f')} MiB RSS / "
                   f"{fmt(each(le, 'pss_mib'), '.1f')} MiB PSS, "
                   f"{fmt(each(le, 'cores') * 1000, '.2f')} millicores)")
    if res.cluster_idle is not None:
        idle_sys = res.cluster_idle.total(RAY_KINDS)
        out.append(f"  Ray's processes: idle cluster {idle_sys.rss_mib:.0f} MiB RSS, "
                   f"{idle_sys.cores:.3f} cores; with the {res.options.instances} actors "
                   f"{rsys.rss_mib:.0f} MiB, {rsys.cores:.3f} cores, plus the workers "
                   f"{fmt(hosts.rss_mib if hosts else None, '.0f')} MiB, "
                   f"{fmt(hosts.cores if hosts else None, '.3f')} cores")
    return out


def failure_lines(res: RayStartResult, o: RayOptions) -> list[str]:
    out = [""]
    for run in (res.local, res.ray):
        if run is None:
            continue
        if run.error:
            out.append(f"{run.launcher}: FAILED: {run.error}")
        if run.failures:
            out.append(f"{run.launcher}: instance failures: {len(run.failures)}: "
                       f"{'; '.join(run.failures[:3])}")
        if run.stop is not None and run.stop.left:
            out.append(f"{run.launcher}: left {o.stop_timeout:g} s after SIGTERM: "
                       f"{'; '.join(run.stop.left[:5])}")
    out.append("leftovers after the run (processes, actors, placement groups; killed): "
               + ("; ".join(res.leftovers[:8]) if res.leftovers else "none"))
    why = "; ".join(ray_failures(res)) or None
    out.append(f"verdict: {'FAILED: ' + why if why else 'ok'}; total run time {res.total_s} s"
               + (f"; logs {res.logs}" if res.logs else ""))
    return out


def ray_start_report(res: RayStartResult) -> str:
    lo, ry = res.local, res.ray
    out = header_lines(res) + start_stop_lines(res) + idle_lines(res)
    if lo is not None and ry is not None and lo.idle is not None and ry.idle is not None:
        out += ratio_lines(res, lo.idle, ry.idle)
    out += failure_lines(res, res.options)
    return "\n".join(out)
