"""One launcher of the ray_start scenario measured: the controller started with it, until
every pool converged (with the instances' start times and the CPU spent meanwhile), the idle
window, then SIGTERM until the controller, the engines and -- for Ray -- the EngineHost
workers, named actors and placement groups are gone."""

from __future__ import annotations

import contextlib
import math
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from bench import stats
from bench.fleet import SIM_HARDWARE, SIM_MODEL_8B, ControllerProc, start_controller
from bench.processes import FleetError, ProcessFleet
from bench.report import fmt
from bench.scenarios.ray_start.model import (
    ACCEL,
    KIND_CONTROLLER,
    KIND_ENGINES,
    KIND_HOSTS,
    NAMESPACE,
    LauncherRun,
    RayOptions,
    StartTimes,
    StopTimes,
)
from bench.scenarios.ray_start.procs import (
    Snap,
    idle_window,
    of_kind,
    process_kind,
    process_line,
    snap,
    usage_between,
)

POLL_S = 0.25


def launcher_config(o: RayOptions, launcher: str, address: str = "") -> dict[str, Any]:
    """The controller's config: the same fleet whatever the launcher."""
    cfg: dict[str, Any] = {
        "backend": "sim",
        "launcher": launcher,
        "model": {"name": SIM_MODEL_8B},
        "hardware": {"accelerator": SIM_HARDWARE, "accelerators_per_node": o.node_accel,
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

    from controller.launchers.ray import INSTANCE_ID  # noqa: PLC0415 - beside Ray's imports

    actors = sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                    if a["namespace"] == NAMESPACE)
    groups = sorted(str(g.get("name")) for g in placement_group_table().values()
                    if g.get("state") != "REMOVED" and INSTANCE_ID.fullmatch(str(g.get("name"))))
    return actors, groups


def wait_converged_since(o: RayOptions, ctl: ControllerProc, fleet: ProcessFleet,
                         t_spawn: float, on_ray: bool) -> tuple[float, float]:
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
            extra = f", ray::EngineHost workers {len(of_kind(KIND_HOSTS))}" if on_ray else ""
            print(f"  ... {now - t_spawn:5.1f} s: ready {ready or '-'}, engine processes "
                  f"{len(of_kind(KIND_ENGINES))}{extra}", flush=True)
            last = now
        time.sleep(POLL_S)


def wait_started(o: RayOptions, run: LauncherRun, ctl: ControllerProc, fleet: ProcessFleet,
                 t_spawn: float, before: Snap) -> StartTimes:
    """Until every pool converged: the start's times, processes, actors and CPU."""
    on_ray = run.launcher == "ray"
    seconds, up = wait_converged_since(o, ctl, fleet, t_spawn, on_ray)
    start_cpu = usage_between(before, snap(), memory=False)
    starts: list[float] = []
    first = math.nan
    with contextlib.suppress(httpx.HTTPError, ValueError, KeyError, TypeError):
        ready = [i for i in ctl.get("/instances") if i.get("ready_at")
                 and i.get("state") == "ready"]
        starts = [i["ready_at"] - i["created_at"] for i in ready]
        # the controller's clock is time.monotonic, the same (system-wide) clock as ours
        first = min(i["ready_at"] for i in ready) - t_spawn
    actors, groups = ray_state() if on_ray else ([], [])
    start = StartTimes(round(seconds, 1), round(up, 1), round(first, 1),
                       round(stats.median(starts), 1),
                       round(max(starts or [math.nan]), 1), len(of_kind(KIND_ENGINES)),
                       len(of_kind(KIND_HOSTS)), len(actors), len(groups), start_cpu)
    print(f"  {run.launcher}: {o.instances} instances ready in {start.seconds} s "
          f"(controller up {start.controller_up_s} s)", flush=True)
    return start


def stop_fleet(o: RayOptions, run: LauncherRun, ctl: ControllerProc) -> None:
    """SIGTERM to the controller; when each thing it ran is gone."""
    on_ray = run.launcher == "ray"
    gone: dict[str, float] = {}
    checks: dict[str, Callable[[], bool]] = {
        "controller": lambda: ctl.proc.poll() is not None,
        "engines": lambda: not of_kind(KIND_ENGINES),
    }
    if on_ray:
        checks["hosts"] = lambda: not of_kind(KIND_HOSTS)
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
    left = [f"{process_kind(p)}: {process_line(p)}"
            for p in of_kind(KIND_CONTROLLER, KIND_ENGINES, KIND_HOSTS)]
    if on_ray:
        with contextlib.suppress(Exception):
            actors, groups = ray_state()
            left += [f"actor {a}" for a in actors] + [f"placement group {g}" for g in groups]

    def at(name: str) -> float:
        return round(gone[name], 2) if name in gone else math.nan

    run.stop = StopTimes(
        round(max(gone.values()), 2) if len(gone) == len(checks) else math.nan,
        at("controller"), ctl.proc.poll(), at("engines"), at("hosts"), at("actors"),
        at("groups"), left)
    print(f"  {run.launcher}: stopped in {fmt(run.stop.seconds, '')} s; left: "
          f"{len(left)}", flush=True)


def measure_launcher(o: RayOptions, run: LauncherRun, workdir: Path,
                     address: str = "") -> None:
    """Start, the idle window, stop; what failed recorded in ``run``."""
    fleet = ProcessFleet(workdir)
    ctl: ControllerProc | None = None
    try:
        try:
            before = snap()
            t_spawn = time.monotonic()
            ctl = start_controller(workdir, launcher_config(o, run.launcher, address),
                                   fleet=fleet, log_level="warning", wait="none")
            run.start = wait_started(o, run, ctl, fleet, t_spawn, before)
            run.idle = idle_window(o.window,
                                   f"{run.launcher}: {o.instances} instances ready, idle")
        except Exception as exc:  # noqa: BLE001 - recorded; the run goes on to stop, report
            run.error = f"{type(exc).__name__}: {exc}"[:2000]
            print(f"  {run.launcher}: FAILED: {run.error}", flush=True)
        if ctl is not None:
            with contextlib.suppress(Exception):
                run.failures = ctl.instance_failures()
            stop_fleet(o, run, ctl)
    finally:  # also on Ctrl-C: SIGTERM to the controller (it stops its engines), then SIGKILL
        fleet.stop(grace_s=30)
