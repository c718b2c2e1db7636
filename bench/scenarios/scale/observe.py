"""What the scale scenario watches outside the load: CPU snapshots of the controller, the
engines, this client and everything else on the machine; the idle fleet's CPU; and the
fleet's start, from the controller's spawn until every instance is ready."""

from __future__ import annotations

import contextlib
import math
import os
import time
from dataclasses import dataclass

import httpx
import psutil

from bench import cpu, stats
from bench.fleet import SIM_ENGINE_MATCH, ControllerProc
from bench.processes import FleetError, ProcessFleet
from bench.scenarios.scale.model import FleetStart, IdleCpu, ScaleOptions


@dataclass
class CpuSnap:
    t: float
    ctl: float
    engines: dict[int, float]
    client: float
    machine_busy: float
    ctl_fds: int
    others: dict[int, tuple[str, float]]


def cpu_snap(ctl: ControllerProc, fleet: ProcessFleet) -> CpuSnap:
    ctl_ps = psutil.Process(ctl.proc.pid)
    engine_pids = fleet.descendants(SIM_ENGINE_MATCH)
    engines = {}
    for pid in engine_pids:
        with contextlib.suppress(psutil.Error):
            engines[pid] = cpu.process_seconds(psutil.Process(pid))
    fds = 0
    with contextlib.suppress(psutil.Error):
        fds = ctl_ps.num_fds()
    ours = {ctl.proc.pid, os.getpid(), *engine_pids}
    others = {}
    for p in psutil.process_iter(["pid", "cmdline", "name"]):
        if p.pid in ours:
            continue
        with contextlib.suppress(psutil.Error):
            cmd = " ".join(p.info["cmdline"] or [p.info["name"] or "?"])
            others[p.pid] = (cmd[:90], cpu.process_seconds(p))
    return CpuSnap(time.monotonic(), cpu.process_seconds(ctl_ps), engines, cpu.self_seconds(),
                   cpu.machine_times().busy, fds, others)


def top_others(a: CpuSnap, b: CpuSnap, wall: float, n: int = 4) -> list[str]:
    """The busiest processes that are not this benchmark's, over the window."""
    used = [(c - a.others.get(pid, ("", 0.0))[1], cmd) for pid, (cmd, c) in b.others.items()]
    used.sort(reverse=True)
    return [f"{u / wall:.2f} cores: {cmd}" for u, cmd in used[:n] if u / wall >= 0.01]


def idle_cpu(ctl: ControllerProc, fleet: ProcessFleet, seconds: float) -> IdleCpu:
    """Controller and engine CPU with the whole fleet ready and no requests: the cost of
    health checks and engine /metrics polling."""
    a = cpu_snap(ctl, fleet)
    time.sleep(seconds)
    b = cpu_snap(ctl, fleet)
    wall = b.t - a.t
    return IdleCpu(round(wall, 1), round((b.ctl - a.ctl) / wall, 3),
                   round(sum(b.engines[p] - a.engines.get(p, 0.0) for p in b.engines) / wall, 3))


def wait_fleet(o: ScaleOptions, ctl: ControllerProc, fleet: ProcessFleet,
               t_spawn: float) -> FleetStart:
    """Until every instance is ready (progress every 10 s): how long the fleet took."""
    want = {"prefill": o.prefill, "decode": o.decode}
    deadline = t_spawn + o.start_timeout + 30
    up_at: float | None = None
    last_print = 0.0
    while True:
        fleet.check_alive()
        ready: dict[str, int] = {}
        with contextlib.suppress(httpx.HTTPError, ValueError):
            ready = ctl.ready()
            up_at = up_at or time.monotonic()
        fleet.note_descendants()
        now = time.monotonic()
        if all(ready.get(k, 0) >= v for k, v in want.items()):
            break
        if now > deadline:
            raise FleetError(f"fleet not ready after {now - t_spawn:.0f} s: {ready}; "
                             f"log: {ctl.log_path}")
        if now - last_print > 10:
            print(f"  ... {now - t_spawn:5.1f} s: ready {ready or '-'}, engine processes "
                  f"{len(fleet.descendants(SIM_ENGINE_MATCH))}", flush=True)
            last_print = now
        time.sleep(0.25)
    t_ready = time.monotonic()
    starts: list[float] = []
    with contextlib.suppress(httpx.HTTPError, ValueError, KeyError, TypeError):
        starts = [i["ready_at"] - i["created_at"] for i in ctl.get("/instances")
                  if i.get("ready_at")]
    return FleetStart(round(t_ready - t_spawn, 1), round((up_at or t_ready) - t_spawn, 1),
                      stats.median(starts), max(starts or [math.nan]),
                      len(fleet.descendants(SIM_ENGINE_MATCH)))
