"""The Ray launcher's cost: 64 simulated instances started and stopped by ``pdctl controller``
with ``launcher: local`` and with ``launcher: ray``, and what Ray itself costs on this machine.

Same controller config both times (16 prefill + 48 decode x TP1, simulated Llama-3-8B on H100
SXM, ``sim: {time_scale: 1.0, startup_delay_s: 0.5}``, 2 nodes x 32 accelerators) except the
launcher; all real processes on this machine:

- local: the controller starts every engine as a child process (``controller.engines.sim``);
- ray: a local Ray cluster (``ray.cluster_utils.Cluster``: a head offering 1 CPU and no
  accelerators, 2 worker nodes each offering 64 logical CPUs and 32 ``accel``), and the
  controller joins it with ``ray: {address: <the head>, accelerator_resource: accel,
  namespace: bench}``: each engine is a named detached ``ray::EngineHost`` actor in a
  STRICT_PACK placement group, running the same engine process as its child.

Measured, each launcher in turn (local first, then Ray):

- start: controller spawned -> every pool converged (``GET /api/v1/cluster``), with the
  controller's own up time and the instances' start times (``/instances``: ready - created),
  and the CPU seconds every process of the run spent meanwhile;
- steady state: CPU seconds (user + system, psutil) and memory (RSS, and PSS, which shares
  pages out fairly) of each kind of process over a fixed idle window (30 s) with every
  instance ready and no traffic: the controller, the engines, the ``ray::EngineHost``
  workers and each Ray system process (gcs_server, raylets, dashboard and its agents, runtime
  env agents, autoscaler and log monitors, idle workers);
- stop: the controller's SIGTERM -> controller exited, every engine process gone and, for
  Ray, every ``ray::EngineHost`` worker, named actor and placement group of the namespace gone.

Before the Ray controller starts, the same window is measured on the idle cluster (no
driver, no actor): Ray's fixed cost. Then this process joins the cluster as a driver (to read
the named actors and placement groups; its own CPU and memory are not counted). At the end
the cluster is shut down and the run checks that nothing it started is left (processes,
actors, placement groups), killing and reporting whatever is.

Ray binds the host's network interface unless it runs in a private network namespace, and
benchmarks send traffic to loopback only: the whole measurement runs inside ``unshare -n``
(as root), re-executed there as ``python -m bench.ray_start --json FILE`` when started
outside one; the result comes back as JSON. Inside it, this process is a child subreaper,
so every process the run starts stays its descendant and is accounted for.

    .venv/bin/python -m bench.ray_start                 # 16P + 48D, 30 s windows, ~4 min
    .venv/bin/python -m bench.ray_start --quick         # 4P + 12D, 10 s windows, ~1.5 min
    .venv/bin/python -m bench.ray_start --launchers ray --window 10 --keep
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import json
import logging
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import types
import typing
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench import cpu, stats
from bench.fleet import ControllerProc, Fleet, FleetError, interrupt_on_signals, start_controller
from bench.report import ROOT, finish, fmt, ratio, write_json
from bench.scale import instance_failures

TITLE = "Ray launcher: 64 simulated instances started and stopped, local vs Ray"
ABOUT = ("`pdctl controller` starts and stops 16 prefill + 48 decode TP1 simulated "
         "Llama-3-8B/H100 instances with `launcher: local` (child processes) and with "
         "`launcher: ray` (named detached actors in STRICT_PACK placement groups on a local "
         "`ray.cluster_utils.Cluster`: a head and 2 worker nodes x 32 `accel`), in a private "
         "network namespace. Reported: time to all ready and to all gone after SIGTERM, and "
         "the CPU and memory (RSS, PSS) of every kind of process over a 30 s idle window: "
         "the idle Ray cluster, then the controller, engines, `ray::EngineHost` workers and "
         "Ray's own processes with every instance ready. Leftovers are checked and reported.")

MODEL = "llama-3-8b"
HARDWARE = "h100-sxm"
ACCEL = "accel"
NAMESPACE = "bench"
ENGINE_MATCH = "controller.engines.sim"
INSTANCE_ID = re.compile(r"(prefill|decode)-[0-9]+")
RUN_MARK = "PDCTL_BENCH_RAY_RUN"  # in the environment of every process the run starts
PR_SET_CHILD_SUBREAPER = 36
MIB = 2**20
POLL_S = 0.25
ANSI = re.compile(r"\x1b\[[0-9;]*m")  # Ray colours what its driver prints

# Kinds of process, in the report's order; ``kind`` sorts a process into one.
ENGINES = "sim engines"
HOSTS = "ray::EngineHost workers"
CONTROLLER = "controller"
RAY_KINDS = ("gcs_server", "raylet", "dashboard (head)", "dashboard agent", "runtime env agent",
             "autoscaler monitor", "log monitor", "idle workers", "other ray workers")
KINDS = (CONTROLLER, ENGINES, HOSTS, *RAY_KINDS, "other")


@dataclass
class Options:
    prefill: int = 16
    decode: int = 48
    window: float = 30.0  # seconds of each idle CPU/memory window
    worker_nodes: int = 2
    node_accel: int = 32  # accel units each Ray worker node offers (= accelerators_per_node)
    node_cpus: int = 64  # logical CPUs each Ray worker node offers
    time_scale: float = 1.0
    startup_delay: float = 0.5  # sim.startup_delay_s
    start_timeout: float = 600.0  # controller.start_timeout_s, and the wait for all ready
    placement_timeout: float = 300.0  # ray.placement_timeout_s
    stop_timeout: float = 180.0  # SIGTERM -> everything gone, else reported as left
    launchers: tuple[str, ...] = ("local", "ray")
    keep: bool = False  # keep the work directory (logs, Ray session)

    @staticmethod
    def defaults(quick: bool) -> Options:
        if quick:
            return Options(prefill=4, decode=12, window=10.0)
        return Options()

    @property
    def instances(self) -> int:
        return self.prefill + self.decode


# ---- results ----------------------------------------------------------------------------

@dataclass
class Group:
    """One kind of process over a window: CPU seconds spent in it, memory at its end."""

    kind: str
    count: int  # processes at the window's end
    cpu_s: float
    cores: float  # cpu_s / window
    rss_mib: float  # summed over the processes
    pss_mib: float


@dataclass
class Usage:
    seconds: float
    machine_busy_cores: float  # the whole machine, anything else included
    groups: list[Group] = field(default_factory=list)  # by kind (KINDS)
    nodes: list[Group] = field(default_factory=list)  # Ray's own processes by node

    def get(self, kind: str) -> Group | None:
        return next((g for g in self.groups if g.kind == kind), None)

    def total(self, kinds: tuple[str, ...]) -> Group:
        gs = [g for g in self.groups if g.kind in kinds]
        return Group("total", sum(g.count for g in gs), round(sum(g.cpu_s for g in gs), 2),
                     round(sum(g.cores for g in gs), 3), round(sum(g.rss_mib for g in gs), 1),
                     round(sum(g.pss_mib for g in gs), 1))


@dataclass
class Start:
    seconds: float  # controller spawned -> every pool converged
    controller_up_s: float  # -> /healthz answered
    first_ready_s: float  # spawn -> the first instance ready (from its ready_at)
    instance_start_s_p50: float  # ready_at - created_at
    instance_start_s_max: float
    engine_processes: int
    host_processes: int  # ray::EngineHost workers
    actors: int  # named actors in the namespace (Ray)
    placement_groups: int  # of instances, not removed (Ray)
    cpu: Usage | None = None  # every process of the run, from spawn to converged


@dataclass
class Stop:
    seconds: float  # SIGTERM -> the last of the below
    controller_exit_s: float
    controller_exit_code: int | None
    engines_gone_s: float
    hosts_gone_s: float  # Ray only (NaN for local)
    actors_gone_s: float
    placement_groups_gone_s: float
    left: list[str] = field(default_factory=list)  # still there after stop_timeout


@dataclass
class LauncherRun:
    launcher: str
    start: Start | None = None
    idle: Usage | None = None  # every instance ready, no traffic
    stop: Stop | None = None
    failures: list[str] = field(default_factory=list)  # instance.failed events
    error: str | None = None


@dataclass
class RayStartResult:
    options: Options
    machine: str
    load_before: tuple[float, float, float]
    netns: str = ""
    load_after: tuple[float, float, float] | None = None
    local: LauncherRun | None = None
    ray: LauncherRun | None = None
    cluster_start_s: float = math.nan
    cluster_idle: Usage | None = None  # the idle cluster: no driver, no actor
    cluster_teardown_s: float = math.nan
    leftovers: list[str] = field(default_factory=list)  # killed after the run
    total_s: float = 0.0
    logs: str = ""


# ---- JSON back into the result (the run happens in another process) -----------------------

def from_json(tp: Any, v: Any) -> Any:
    """``v`` (as ``bench.report.jsonable`` wrote it) as an instance of the type ``tp``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if v is None:
            return None
        return from_json(next(a for a in args if a is not type(None)), v)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        return tp(**{f.name: from_json(hints[f.name], v[f.name])
                     for f in dataclasses.fields(tp) if f.name in v})
    if origin is list:
        return [from_json(args[0], x) for x in v]
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(from_json(args[0], x) for x in v)
        return tuple(from_json(a, x) for a, x in zip(args, v, strict=True))
    if origin is dict:
        return {k: from_json(args[1], x) for k, x in v.items()}
    if tp is float:
        return math.nan if v is None else float(v)
    return v


# ---- processes of the run ----------------------------------------------------------------

def kind(p: psutil.Process) -> str:
    """Which kind of process ``p`` is (``KINDS``)."""
    name = p.name()
    cmd = " ".join(p.cmdline()) or name
    if ENGINE_MATCH in cmd:
        return ENGINES
    if "controller.cli" in cmd:
        return CONTROLLER
    if cmd.startswith("ray::EngineHost"):
        return HOSTS
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


def _alive(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def descendants() -> list[psutil.Process]:
    """Live processes under this one (a subreaper: orphans of the run stay here)."""
    with contextlib.suppress(psutil.Error):
        return [p for p in psutil.Process().children(recursive=True) if _alive(p)]
    return []


def of_kind(*kinds: str) -> list[psutil.Process]:
    out = []
    for p in descendants():
        with contextlib.suppress(psutil.Error):
            if kind(p) in kinds:
                out.append(p)
    return out


def describe(p: psutil.Process) -> str:
    with contextlib.suppress(psutil.Error):
        return f"{p.pid} {(' '.join(' '.join(p.cmdline()).split()) or p.name())[:150]}"
    return f"{p.pid} (gone)"


HEAD_NODE, WORKER_NODES = "ray on the head node", "ray on the worker nodes"


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
    found = descendants()
    for p in found:
        with contextlib.suppress(psutil.Error):
            kinds[p.pid] = kind(p)
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
    return Snap(time.monotonic(), cpu.machine().busy, procs)


def usage(a: Snap, b: Snap, memory: bool = True) -> Usage:
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
                 [group(k) for k in KINDS if k in count],
                 [group(k) for k in (HEAD_NODE, WORKER_NODES) if k in count])


def window(seconds: float, what: str) -> Usage:
    print(f"  measuring {what} for {seconds:g} s", flush=True)
    a = snap()
    time.sleep(seconds)
    return usage(a, snap())


def become_subreaper() -> None:
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def kill_left(what: str) -> list[str]:
    """SIGKILL every live process still under this one; what they were."""
    left = descendants()
    out = [f"{what}: {describe(p)}" for p in left]
    for p in left:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(left, timeout=10)
    return out


# ---- the private network namespace ---------------------------------------------------------

def interfaces() -> set[str]:
    """This process's network interfaces (``/proc/self/net/dev`` follows the process's
    network namespace; ``/sys/class/net`` shows the one sysfs was mounted in)."""
    with open("/proc/self/net/dev") as f:
        return {line.split(":", 1)[0].strip() for line in f.readlines()[2:] if ":" in line}


def private_netns() -> bool:
    return interfaces() == {"lo"}


def loopback_up() -> bool:
    import socket  # noqa: PLC0415

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", 0))
        except OSError:
            return False
    return True


# ---- the controller ----------------------------------------------------------------------

def controller_config(o: Options, launcher: str, address: str = "") -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "backend": "sim",
        "launcher": launcher,
        "model": {"name": MODEL},
        "hardware": {"accelerator": HARDWARE, "accelerators_per_node": o.node_accel,
                     "nodes": o.worker_nodes},
        "pools": {"prefill": {"size": o.prefill, "tp": 1},
                  "decode": {"size": o.decode, "tp": 1}},
        "sim": {"time_scale": o.time_scale, "startup_delay_s": o.startup_delay},
        "controller": {"start_timeout_s": o.start_timeout, "tick_s": 0.5},
    }
    if launcher == "ray":
        cfg["ray"] = {"address": address, "accelerator_resource": ACCEL,
                      "namespace": NAMESPACE, "placement_timeout_s": o.placement_timeout}
    return cfg


def ray_state() -> tuple[list[str], list[str]]:
    """Named actors of the namespace, and the instances' placement groups not removed (this
    process is a driver of the cluster)."""
    import ray  # noqa: PLC0415
    from ray.util import placement_group_table  # noqa: PLC0415

    actors = sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                    if a["namespace"] == NAMESPACE)
    groups = sorted(str(g.get("name")) for g in placement_group_table().values()
                    if g.get("state") != "REMOVED" and INSTANCE_ID.fullmatch(str(g.get("name"))))
    return actors, groups


def wait_ready(o: Options, ctl: ControllerProc, fleet: Fleet, t_spawn: float,
               on_ray: bool) -> tuple[float, float]:
    """Until every pool converged: (seconds since spawn, controller up seconds)."""
    up_at: float | None = None
    last = time.monotonic()
    while True:
        fleet.check_alive()
        ready: dict[str, int] = {}
        with contextlib.suppress(httpx.HTTPError, ValueError, OSError):
            ready = ctl.ready()
            up_at = up_at or time.monotonic()
            if ctl.converged():
                now = time.monotonic()
                return now - t_spawn, up_at - t_spawn
        now = time.monotonic()
        if now - t_spawn > o.start_timeout + 30:
            raise FleetError(f"not all ready after {now - t_spawn:.0f} s: {ready}; "
                             f"log {ctl.log_path}")
        if now - last >= 10:
            extra = f", ray::EngineHost workers {len(of_kind(HOSTS))}" if on_ray else ""
            print(f"  ... {now - t_spawn:5.1f} s: ready {ready or '-'}, engine processes "
                  f"{len(of_kind(ENGINES))}{extra}", flush=True)
            last = now
        time.sleep(POLL_S)


def wait_started(o: Options, run: LauncherRun, ctl: ControllerProc, fleet: Fleet,
                 t_spawn: float, before: Snap) -> Start:
    on_ray = run.launcher == "ray"
    seconds, up = wait_ready(o, ctl, fleet, t_spawn, on_ray)
    start_cpu = usage(before, snap(), memory=False)
    starts: list[float] = []
    first = math.nan
    with contextlib.suppress(httpx.HTTPError, ValueError, KeyError, TypeError):
        ready = [i for i in ctl.get("/instances") if i.get("ready_at")
                 and i.get("state") == "ready"]
        starts = [i["ready_at"] - i["created_at"] for i in ready]
        # the controller's clock is time.monotonic, the same (system-wide) clock as ours
        first = min(i["ready_at"] for i in ready) - t_spawn
    actors, groups = ray_state() if on_ray else ([], [])
    start = Start(round(seconds, 1), round(up, 1), round(first, 1),
                  round(stats.median(starts), 1),
                  round(max(starts or [math.nan]), 1), len(of_kind(ENGINES)),
                  len(of_kind(HOSTS)), len(actors), len(groups), start_cpu)
    print(f"  {run.launcher}: {o.instances} instances ready in {start.seconds} s "
          f"(controller up {start.controller_up_s} s)", flush=True)
    return start


def stop_fleet(o: Options, run: LauncherRun, ctl: ControllerProc) -> None:
    """SIGTERM to the controller; when each thing it ran is gone."""
    on_ray = run.launcher == "ray"
    gone: dict[str, float] = {}
    checks: dict[str, Callable[[], bool]] = {
        "controller": lambda: ctl.proc.poll() is not None,
        "engines": lambda: not of_kind(ENGINES),
    }
    if on_ray:
        checks["hosts"] = lambda: not of_kind(HOSTS)
        checks["actors"] = lambda: not ray_state()[0]
        checks["groups"] = lambda: not ray_state()[1]
    t0 = time.monotonic()
    ctl.proc.send_signal(signal.SIGTERM)
    while len(gone) < len(checks) and time.monotonic() - t0 < o.stop_timeout:
        for name, ok in checks.items():
            if name not in gone:
                with contextlib.suppress(Exception):
                    if ok():
                        gone[name] = time.monotonic() - t0
        time.sleep(0.05)
    left = [f"{kind(p)}: {describe(p)}" for p in of_kind(CONTROLLER, ENGINES, HOSTS)]
    if on_ray:
        with contextlib.suppress(Exception):
            actors, groups = ray_state()
            left += [f"actor {a}" for a in actors] + [f"placement group {g}" for g in groups]

    def at(name: str) -> float:
        return round(gone[name], 2) if name in gone else math.nan

    run.stop = Stop(round(max(gone.values()), 2) if len(gone) == len(checks) else math.nan,
                    at("controller"), ctl.proc.poll(), at("engines"), at("hosts"),
                    at("actors"), at("groups"), left)
    print(f"  {run.launcher}: stopped in {fmt(run.stop.seconds, '')} s; left: "
          f"{len(left)}", flush=True)


def measure_launcher(o: Options, run: LauncherRun, workdir: Path, address: str = "") -> None:
    """Start, the idle window, stop; what failed recorded in ``run``."""
    fleet = Fleet(workdir)
    ctl: ControllerProc | None = None
    try:
        try:
            before = snap()
            t_spawn = time.monotonic()
            ctl = start_controller(workdir, controller_config(o, run.launcher, address),
                                   fleet=fleet, log_level="warning", wait="none")
            run.start = wait_started(o, run, ctl, fleet, t_spawn, before)
            run.idle = window(o.window, f"{run.launcher}: {o.instances} instances ready, idle")
        except Exception as exc:  # noqa: BLE001 - recorded; the run goes on to stop, report
            run.error = f"{type(exc).__name__}: {exc}"[:2000]
            print(f"  {run.launcher}: FAILED: {run.error}", flush=True)
        if ctl is not None:
            with contextlib.suppress(Exception):
                run.failures = instance_failures(ctl)
            stop_fleet(o, run, ctl)
    finally:  # also on Ctrl-C: SIGTERM to the controller (it stops its engines), then SIGKILL
        fleet.stop(grace_s=30)


# ---- the run, inside the namespace -------------------------------------------------------

def measure(o: Options, workdir: Path) -> RayStartResult:
    """Everything, in this (private) network namespace; stops all it started."""
    from bench.report import machine  # noqa: PLC0415

    res = RayStartResult(o, machine()[0], os.getloadavg(),
                         netns=f"{os.readlink('/proc/self/ns/net')}, interfaces "
                               f"{sorted(interfaces())}", logs=str(workdir))
    t_all = time.monotonic()
    become_subreaper()
    os.environ.setdefault(RUN_MARK, uuid.uuid4().hex)
    # Ray's sessions, sockets and its "current cluster" file under the work directory.
    os.environ["RAY_TMPDIR"] = str(workdir)
    print(f"bench.ray_start: {o.prefill}P + {o.decode}D x TP1 ({MODEL}, {HARDWARE}), "
          f"launchers {', '.join(o.launchers)}; {res.netns}; logs in {workdir}", flush=True)
    try:
        if "local" in o.launchers:
            res.local = LauncherRun("local")
            measure_launcher(o, res.local, workdir / "local")
            res.leftovers += kill_left("after the local launcher")
        if "ray" in o.launchers:
            measure_ray(o, res, workdir)
    finally:
        res.leftovers += kill_left("after the run")
        res.load_after = os.getloadavg()
        res.total_s = round(time.monotonic() - t_all, 1)
    return res


def measure_ray(o: Options, res: RayStartResult, workdir: Path) -> None:
    import ray  # noqa: PLC0415
    from ray.cluster_utils import Cluster  # noqa: PLC0415

    # Ray's Node (of Cluster) and ray.init each install a SIGTERM handler that exits at once
    # (sys.exit); ours (interrupt_on_signals: KeyboardInterrupt) stops everything in order.
    ours = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

    def our_signals() -> None:
        for sig, handler in ours.items():
            if callable(handler):
                signal.signal(sig, handler)

    res.ray = LauncherRun("ray")
    cluster: Any = None
    try:
        t0 = time.monotonic()
        # As tests/ray: the head offers no accelerators, so the engines land on the workers.
        cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 1, "include_dashboard": False})
        for _ in range(o.worker_nodes):
            cluster.add_node(num_cpus=o.node_cpus, resources={ACCEL: o.node_accel})
        cluster.wait_for_nodes()
        our_signals()
        res.cluster_start_s = round(time.monotonic() - t0, 1)
        print(f"  ray cluster at {cluster.address} up in {res.cluster_start_s} s (head + "
              f"{o.worker_nodes} x {o.node_accel} {ACCEL}, {o.node_cpus} CPUs)", flush=True)
        time.sleep(2.0)  # the agents settle
        res.cluster_idle = window(o.window, "the idle ray cluster (no driver, no actor)")
        ray.init(address=cluster.address, namespace="bench-probe", log_to_driver=False,
                 logging_level=logging.WARNING)
        our_signals()
        measure_launcher(o, res.ray, workdir / "ray", cluster.address)
    except Exception as exc:
        res.ray.error = res.ray.error or f"{type(exc).__name__}: {exc}"[:2000]
        print(f"  ray: FAILED: {res.ray.error}", flush=True)
    finally:
        t1 = time.monotonic()
        with contextlib.suppress(Exception):
            actors, groups = ray_state()
            res.leftovers += [f"actor {a}" for a in actors]
            res.leftovers += [f"placement group {g}" for g in groups]
        with contextlib.suppress(Exception):
            ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
        deadline = time.monotonic() + 15
        while descendants() and time.monotonic() < deadline:
            time.sleep(0.1)
        res.cluster_teardown_s = round(time.monotonic() - t1, 1)
        print(f"  ray cluster shut down in {res.cluster_teardown_s} s", flush=True)


# ---- the run, from outside the namespace ---------------------------------------------------

def option_args(o: Options) -> list[str]:
    return ["--prefill", str(o.prefill), "--decode", str(o.decode), "--window", str(o.window),
            "--worker-nodes", str(o.worker_nodes), "--node-accel", str(o.node_accel),
            "--node-cpus", str(o.node_cpus), "--time-scale", str(o.time_scale),
            "--startup-delay", str(o.startup_delay), "--start-timeout", str(o.start_timeout),
            "--placement-timeout", str(o.placement_timeout),
            "--stop-timeout", str(o.stop_timeout), "--launchers", *o.launchers,
            *(["--keep"] if o.keep else [])]


def marked(run_id: str, workdir: Path) -> list[psutil.Process]:
    """Live processes of a run, found by its mark in their environment or its work
    directory on their command line."""
    out = []
    for p in psutil.process_iter(["cmdline"]):
        if p.pid == os.getpid():
            continue
        with contextlib.suppress(psutil.Error):
            if (str(workdir) in " ".join(p.info["cmdline"] or [])
                    or p.environ().get(RUN_MARK) == run_id) and _alive(p):
                out.append(p)
    return out


def run_ray_start(o: Options) -> RayStartResult:
    """The measurement in a private network namespace: here when this process is in one,
    else re-executed in one (``unshare -n``, root) and its JSON result read back."""
    workdir = Path(tempfile.mkdtemp(prefix="pdctl-bench-ray-"))
    if private_netns():
        if not loopback_up():
            subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
        res = measure(o, workdir)
        clean = not res.leftovers and not failed(res)
    else:
        res, clean = reexec(o, workdir)
    if clean and not o.keep:
        shutil.rmtree(workdir, ignore_errors=True)
        res.logs = ""
    return res


def reexec(o: Options, workdir: Path) -> tuple[RayStartResult, bool]:
    if os.geteuid() != 0:
        raise FleetError("bench.ray_start runs Ray in a private network namespace "
                         "(unshare -n), which needs root")
    out = workdir / "result.json"
    run_id = uuid.uuid4().hex
    argv = ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$0" "$@"',
            sys.executable, "-m", "bench.ray_start", "--json", str(out), "--workdir",
            str(workdir), *option_args(o)]
    print(f"bench.ray_start: in a private network namespace: unshare -n ... python -m "
          f"bench.ray_start {' '.join(option_args(o))}", flush=True)
    proc = subprocess.Popen(argv, cwd=ROOT, env={**os.environ, RUN_MARK: run_id},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    assert proc.stdout is not None
    try:
        for raw in proc.stdout:
            line = ANSI.sub("", raw.decode(errors="replace").rstrip())
            if "network_util.cc" not in line:  # Ray: no route to 8.8.8.8, as intended
                print(line, flush=True)
        proc.wait()
    except BaseException:
        proc.send_signal(signal.SIGTERM)  # its own cleanup runs
        try:
            rest = proc.communicate(timeout=120)[0]
            print(rest.decode(errors="replace").rstrip(), flush=True)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for p in marked(run_id, workdir):
            with contextlib.suppress(psutil.Error):
                p.kill()
        raise
    left = marked(run_id, workdir)
    outer_left = [f"after the namespace exited: {describe(p)}" for p in left]
    for p in left:
        with contextlib.suppress(psutil.Error):
            p.kill()
    if not out.exists():
        raise FleetError(f"python -m bench.ray_start exited {proc.returncode} without a "
                         f"result; logs in {workdir}")
    res: RayStartResult = from_json(RayStartResult, json.loads(out.read_text()))
    res.leftovers += outer_left
    res.logs = str(workdir)
    return res, proc.returncode == 0 and not res.leftovers and not failed(res)


# ---- report ------------------------------------------------------------------------------

def failed(res: RayStartResult) -> list[str]:
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


def check(res: RayStartResult) -> str | None:
    """Why the run is a failure, or None."""
    return "; ".join(failed(res)) or None


def _row(label: str, g: Group, per: bool = False) -> str:
    rss, pss = (fmt(each(g, "rss_mib"), "9.1f"), fmt(each(g, "pss_mib"), "9.1f")) if per \
        else ("", "")
    return (f"  {label:<30} {g.count:>4} {g.cpu_s:>8.2f} {g.cores:>7.3f} "
            f"{fmt(g.rss_mib, '9.1f')} {fmt(g.pss_mib, '9.1f')} {rss:>9} {pss:>9}").rstrip()


def usage_table(title: str, u: Usage, kinds: tuple[str, ...], totals: dict[str, tuple[str, ...]]
                ) -> list[str]:
    other = u.machine_busy_cores - u.total(KINDS).cores
    out = [f"{title} ({u.seconds} s; machine {u.machine_busy_cores} cores busy, "
           f"{max(0.0, other):.2f} of them outside this run)"]
    for k in kinds:
        g = u.get(k)
        if g is not None:
            out.append(_row(k, g, per=g.count > 1))
    for label, ks in totals.items():
        out.append(_row(label, u.total(ks)))
    for g in u.nodes:
        out.append(_row(g.kind, g))
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


READY = "all ready after spawn (s)"
GONE = "all gone after SIGTERM (s)"


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
        "  CPU s, every process": s.cpu.total(KINDS).cpu_s if s and s.cpu else nan,
        GONE: t.seconds if t else nan,
        "  controller exited (s)": t.controller_exit_s if t else nan,
        "  engine processes gone (s)": t.engines_gone_s if t else nan,
        "  EngineHost workers gone (s)": t.hosts_gone_s if t else nan,
        "  named actors gone (s)": t.actors_gone_s if t else nan,
        "  placement groups gone (s)": t.placement_groups_gone_s if t else nan,
    }


def report(res: RayStartResult) -> str:
    o = res.options
    lo, ry = res.local, res.ray
    out = [f"fleet: {o.prefill} prefill + {o.decode} decode x TP1, sim {MODEL} on {HARDWARE} "
           f"(time_scale {o.time_scale}, startup_delay_s {o.startup_delay}), config "
           f"{o.worker_nodes} nodes x {o.node_accel}; ray: head (1 CPU, no {ACCEL}) + "
           f"{o.worker_nodes} worker nodes x ({o.node_cpus} CPUs, {o.node_accel} {ACCEL}), "
           f"ray.cluster_utils.Cluster, 150 MiB object store per node",
           f"machine: {res.machine}; load average {' '.join(f'{x:.2f}' for x in res.load_before)}"
           f" before, {' '.join(f'{x:.2f}' for x in res.load_after or ())} after; network "
           f"namespace {res.netns}", ""]

    ta, tb = timings(lo), timings(ry)
    out.append(f"{o.instances} instances: start and stop         local       ray  ray/local")
    for label, a in ta.items():
        b = tb[label]
        out.append(f"  {label:<34} {fmt(a, '7.2f')}   {fmt(b, '7.2f')}   "
                   f"{fmt(ratio(b, a), '7.2f')}")
    for run in (lo, ry):
        if run is not None and run.start is not None:
            s = run.start
            extra = (f", ray::EngineHost workers {s.host_processes}, named actors {s.actors}, "
                     f"placement groups {s.placement_groups}") if run.launcher == "ray" else ""
            out.append(f"  {run.launcher} when ready: engine processes {s.engine_processes}"
                       f"{extra}")
    out.append(f"  ray cluster (head + {o.worker_nodes} workers): started in "
               f"{fmt(res.cluster_start_s, '')} s, shut down in "
               f"{fmt(res.cluster_teardown_s, '')} s (neither in the times above)")
    for run in (lo, ry):
        if run is not None and run.start is not None and run.start.cpu is not None:
            u = run.start.cpu
            parts = ", ".join(f"{g.kind} {g.cpu_s:.1f}" for g in u.groups if g.cpu_s >= 0.05)
            out.append(f"  CPU s during the {run.launcher} start ({u.seconds} s, machine "
                       f"{u.machine_busy_cores} cores busy): {parts}")

    out += ["", "CPU and memory over an idle window: CPU s, cores (= CPU s / window), RSS and "
                "PSS MiB summed at its end, and per process",
            f"  {'process':<30} {'n':>4} {'CPU s':>8} {'cores':>7} {'RSS MiB':>9} "
            f"{'PSS MiB':>9} {'RSS/proc':>9} {'PSS/proc':>9}"]
    if res.cluster_idle is not None:
        out += usage_table("ray cluster idle: no driver, no actor", res.cluster_idle,
                           RAY_KINDS, {"ray total": RAY_KINDS})
    if ry is not None and ry.idle is not None:
        out += usage_table(f"ray launcher, {o.instances} instances ready, no traffic", ry.idle,
                           (*RAY_KINDS, HOSTS, ENGINES, CONTROLLER),
                           {"ray system total": RAY_KINDS,
                            "ray total (system + hosts)": (*RAY_KINDS, HOSTS),
                            "all": KINDS})
    if lo is not None and lo.idle is not None:
        out += usage_table(f"local launcher, {o.instances} instances ready, no traffic",
                           lo.idle, (ENGINES, CONTROLLER), {"all": KINDS})

    if lo is not None and ry is not None and lo.idle is not None and ry.idle is not None:
        la, ra = lo.idle.total(KINDS), ry.idle.total(KINDS)
        rsys, hosts = ry.idle.total(RAY_KINDS), ry.idle.get(HOSTS)
        le, re_ = lo.idle.get(ENGINES), ry.idle.get(ENGINES)
        n = o.instances
        out += ["", "ratios (ray / local, idle window, every process of the run)",
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
                       f"{idle_sys.cores:.3f} cores; with the {n} actors {rsys.rss_mib:.0f} "
                       f"MiB, {rsys.cores:.3f} cores, plus the workers "
                       f"{fmt(hosts.rss_mib if hosts else None, '.0f')} MiB, "
                       f"{fmt(hosts.cores if hosts else None, '.3f')} cores")

    out.append("")
    for run in (lo, ry):
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
    why = check(res)
    out.append(f"verdict: {'FAILED: ' + why if why else 'ok'}; total run time {res.total_s} s"
               + (f"; logs {res.logs}" if res.logs else ""))
    return "\n".join(out)


# ---- entry points ----------------------------------------------------------------------

def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--quick", action="store_true", help="smoke run: 4P+12D, 10 s windows")
    ap.add_argument("--prefill", type=int, help="prefill instances (default 16; quick 4)")
    ap.add_argument("--decode", type=int, help="decode instances (default 48; quick 12)")
    ap.add_argument("--window", type=float, help="seconds of each idle window (default 30; "
                                                 "quick 10)")
    ap.add_argument("--worker-nodes", type=int, help="Ray worker nodes (default 2)")
    ap.add_argument("--node-accel", type=int, help=f"{ACCEL} per Ray worker node, also "
                                                   "accelerators_per_node (default 32)")
    ap.add_argument("--node-cpus", type=int, help="logical CPUs per Ray worker node "
                                                  "(default 64)")
    ap.add_argument("--time-scale", type=float, help="sim.time_scale (default 1.0)")
    ap.add_argument("--startup-delay", type=float, help="sim.startup_delay_s (default 0.5)")
    ap.add_argument("--start-timeout", type=float, help="controller.start_timeout_s "
                                                        "(default 600)")
    ap.add_argument("--placement-timeout", type=float, help="ray.placement_timeout_s "
                                                            "(default 300)")
    ap.add_argument("--stop-timeout", type=float, help="seconds after SIGTERM before what is "
                                                       "left is reported (default 180)")
    ap.add_argument("--launchers", nargs="+", choices=["local", "ray"],
                    help="which launchers to measure (default both)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)  # set by the re-exec


def options_from(args: argparse.Namespace) -> Options:
    o = Options.defaults(args.quick)
    for name in ("prefill", "decode", "window", "worker_nodes", "node_accel", "node_cpus",
                 "time_scale", "startup_delay", "start_timeout", "placement_timeout",
                 "stop_timeout"):
        if getattr(args, name) is not None:
            setattr(o, name, getattr(args, name))
    if args.launchers:
        o.launchers = tuple(args.launchers)
    o.keep = args.keep
    return o


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.ray_start",
                                 description=__doc__.split("\n\n")[0])
    add_arguments(ap)
    ap.add_argument("--json", type=Path, default=ROOT / "bench-results" / "ray.json")
    args = ap.parse_args(argv)
    o = options_from(args)
    try:
        with interrupt_on_signals():
            if args.workdir is not None:  # re-executed in the namespace: write the JSON only
                if not private_netns():
                    print("bench.ray_start: --workdir is for the run inside a private network "
                          "namespace", file=sys.stderr)
                    return 2
                res = measure(o, args.workdir)
                write_json(args.json, res)
                return 0
            res = run_ray_start(o)
    except FleetError as exc:
        print(f"bench.ray_start: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted; every process started here has been stopped", file=sys.stderr)
        return 130
    return finish(report(res), res, args.json, check(res))


if __name__ == "__main__":
    sys.exit(main())
