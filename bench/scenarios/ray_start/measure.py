"""The ray_start run inside the private network namespace: the local launcher measured, then
a local Ray cluster started, its idle cost measured, the Ray launcher measured on it, and the
cluster shut down; whatever is left afterwards killed and reported."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.fleet import SIM_HARDWARE, SIM_MODEL_8B
from bench.report import machine_lines
from bench.scenarios.ray_start.launchers import measure_launcher, ray_state
from bench.scenarios.ray_start.model import ACCEL, LauncherRun, RayOptions, RayStartResult
from bench.scenarios.ray_start.netns import RUN_MARK, interfaces
from bench.scenarios.ray_start.procs import (
    become_subreaper,
    idle_window,
    kill_left,
    run_descendants,
)


def measure(o: RayOptions, workdir: Path) -> RayStartResult:
    """Everything, in this (private) network namespace; stops all it started."""
    res = RayStartResult(o, machine_lines()[0], os.getloadavg(),
                         netns=f"{os.readlink('/proc/self/ns/net')}, interfaces "
                               f"{sorted(interfaces())}", logs=str(workdir))
    t_all = time.monotonic()
    become_subreaper()
    os.environ.setdefault(RUN_MARK, uuid.uuid4().hex)
    # Ray's sessions, sockets and its "current cluster" file under the work directory.
    os.environ["RAY_TMPDIR"] = str(workdir)
    print(f"bench.ray_start: {o.prefill}P + {o.decode}D x TP1 ({SIM_MODEL_8B}, "
          f"{SIM_HARDWARE}), launchers {', '.join(o.launchers)}; {res.netns}; logs in "
          f"{workdir}", flush=True)
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


def start_cluster(o: RayOptions, res: RayStartResult, our_signals: Callable[[], None]) -> Any:
    """A local Ray cluster: a head and ``o.worker_nodes`` workers, up; its start time in
    ``res``."""
    from ray.cluster_utils import Cluster  # noqa: PLC0415

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
    return cluster


def tear_down(res: RayStartResult, cluster: Any) -> None:
    """Actors and placement groups left recorded, the driver and the cluster shut down
    (waiting up to 15 s for its processes); the time it took in ``res``."""
    import ray  # noqa: PLC0415

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
    while run_descendants() and time.monotonic() < deadline:
        time.sleep(0.1)
    res.cluster_teardown_s = round(time.monotonic() - t1, 1)
    print(f"  ray cluster shut down in {res.cluster_teardown_s} s", flush=True)


def measure_ray(o: RayOptions, res: RayStartResult, workdir: Path) -> None:
    import ray  # noqa: PLC0415

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
        cluster = start_cluster(o, res, our_signals)
        time.sleep(2.0)  # the agents settle
        res.cluster_idle = idle_window(o.window, "the idle ray cluster (no driver, no actor)")
        ray.init(address=cluster.address, namespace="bench-probe", log_to_driver=False,
                 logging_level=logging.WARNING)
        our_signals()
        measure_launcher(o, res.ray, workdir / "ray", cluster.address)
    except Exception as exc:
        res.ray.error = res.ray.error or f"{type(exc).__name__}: {exc}"[:2000]
        print(f"  ray: FAILED: {res.ray.error}", flush=True)
    finally:
        tear_down(res, cluster)
