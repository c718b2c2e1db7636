"""The processes of a ray_start run: every descendant of this process (a child subreaper),
sorted into kinds (controller, engines, EngineHost workers, each Ray system process), their CPU
between two snapshots and their memory (RSS, PSS), and whatever is left at the end killed."""

from __future__ import annotations

import contextlib
import ctypes
import math
import time
from dataclasses import dataclass

import psutil

from bench import cpu
from bench.fleet import SIM_ENGINE_MATCH
from bench.processes import process_alive
from bench.scenarios.ray_start.model import (
    HEAD_NODE,
    KIND_CONTROLLER,
    KIND_ENGINES,
    KIND_HOSTS,
    MIB,
    PROCESS_KINDS,
    RAY_KINDS,
    WORKER_NODES,
    Group,
    Usage,
)

PR_SET_CHILD_SUBREAPER = 36


def process_kind(p: psutil.Process) -> str:
    """Which kind of process ``p`` is (``PROCESS_KINDS``)."""
    name = p.name()
    cmd = " ".join(p.cmdline()) or name
    if SIM_ENGINE_MATCH in cmd:
        return KIND_ENGINES
    if "controller.cli" in cmd:
        return KIND_CONTROLLER
    if cmd.startswith("ray::EngineHost"):
        return KIND_HOSTS
    if name == "gcs_server":
        return "gcs_server"
    if name == "raylet":
        return "raylet"
    if cmd.startswith("ray::DashboardAgent"):
        return "dashboard agent"
    if cmd.startswith("ray::RuntimeEnvAgent"):
        return "runtime env agent"
    if "dashboard/dashboard.py" in cmd:
        return "dashboard (head)"
    if "autoscaler/_private/monitor.py" in cmd:
        return "autoscaler monitor"
    if "log_monitor.py" in cmd:
        return "log monitor"
    if cmd.startswith("ray::IDLE"):
        return "idle workers"
    if cmd.startswith("ray::") or "default_worker.py" in cmd:
        return "other ray workers"
    return "other"


def run_descendants() -> list[psutil.Process]:
    """Live processes under this one (a subreaper: orphans of the run stay here)."""
    with contextlib.suppress(psutil.Error):
        return [p for p in psutil.Process().children(recursive=True) if process_alive(p)]
    return []


def of_kind(*kinds: str) -> list[psutil.Process]:
    out = []
    for p in run_descendants():
        with contextlib.suppress(psutil.Error):
            if process_kind(p) in kinds:
                out.append(p)
    return out


def process_line(p: psutil.Process) -> str:
    """Pid and command line, for a report."""
    with contextlib.suppress(psutil.Error):
        return f"{p.pid} {(' '.join(' '.join(p.cmdline()).split()) or p.name())[:150]}"
    return f"{p.pid} (gone)"


@dataclass
class Snap:
    t: float
    machine_busy: float
    # (pid, created) -> kind, Ray node (HEAD_NODE, WORKER_NODES; "" outside Ray), CPU s
    procs: dict[tuple[int, float], tuple[str, str, float]]


def snap() -> Snap:
    procs: dict[tuple[int, float], tuple[str, str, float]] = {}
    kinds: dict[int, str] = {}
    heads: dict[int, bool] = {}  # raylet pid -> it is the head's
    found = run_descendants()
    for p in found:
        with contextlib.suppress(psutil.Error):
            kinds[p.pid] = process_kind(p)
            if kinds[p.pid] == "raylet":
                heads[p.pid] = "--head" in p.cmdline()
    for p in found:
        with contextlib.suppress(psutil.Error):
            k = kinds.get(p.pid, "other")
            node = ""
            if k in RAY_KINDS:
                raylet = p.pid if k == "raylet" else p.ppid()
                node = HEAD_NODE if heads.get(raylet, True) else WORKER_NODES
            procs[(p.pid, p.create_time())] = (k, node, cpu.process_seconds(p))
    return Snap(time.monotonic(), cpu.machine_times().busy, procs)


def usage_between(a: Snap, b: Snap, memory: bool = True) -> Usage:
    """CPU per kind (and per Ray node) between two snapshots (a process started in between
    counts from 0; one gone by ``b`` is lost), and memory now (the processes of ``b``)."""
    wall = b.t - a.t
    cpu_s: dict[str, float] = {}
    count: dict[str, int] = {}
    rss: dict[str, float] = {}
    pss: dict[str, float] = {}
    for key, (k, node, c) in b.procs.items():
        used = c - (a.procs[key][2] if key in a.procs else 0.0)
        m = None
        if memory:
            with contextlib.suppress(psutil.Error):
                m = psutil.Process(key[0]).memory_full_info()
        for label in (k, node) if node else (k,):
            cpu_s[label] = cpu_s.get(label, 0.0) + used
            count[label] = count.get(label, 0) + 1
            if m is not None:
                rss[label] = rss.get(label, 0.0) + m.rss
                pss[label] = pss.get(label, 0.0) + getattr(m, "pss", math.nan)

    def group(k: str) -> Group:
        return Group(k, count[k], round(cpu_s[k], 2), round(cpu_s[k] / wall, 3),
                     round(rss.get(k, math.nan) / MIB, 1), round(pss.get(k, math.nan) / MIB, 1))

    return Usage(round(wall, 1), round((b.machine_busy - a.machine_busy) / wall, 2),
                 [group(k) for k in PROCESS_KINDS if k in count],
                 [group(k) for k in (HEAD_NODE, WORKER_NODES) if k in count])


def idle_window(seconds: float, what: str) -> Usage:
    """CPU and memory of every kind of process over ``seconds`` of waiting."""
    print(f"  measuring {what} for {seconds:g} s", flush=True)
    a = snap()
    time.sleep(seconds)
    return usage_between(a, snap())


def become_subreaper() -> None:
    """Orphans of the run become this process's children (not init's): still ours to see."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def kill_left(what: str) -> list[str]:
    """SIGKILL every live process still under this one; what they were."""
    left = run_descendants()
    out = [f"{what}: {process_line(p)}" for p in left]
    for p in left:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(left, timeout=10)
    return out
