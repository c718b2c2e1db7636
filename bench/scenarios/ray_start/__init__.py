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
(as root), re-executed there as ``python -m bench ray --json FILE`` when started
outside one; the result comes back as JSON. Inside it, this process is a child subreaper,
so every process the run starts stays its descendant and is accounted for.

    .venv/bin/python -m bench ray                 # 16P + 48D, 30 s windows, ~4 min
    .venv/bin/python -m bench ray --quick         # 4P + 12D, 10 s windows, ~1.5 min
    .venv/bin/python -m bench ray --launchers ray --window 10 --keep
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
from pathlib import Path

from bench.processes import FleetError
from bench.report import write_json
from bench.scenario import Scenario, take_given
from bench.scenarios.ray_start.measure import measure
from bench.scenarios.ray_start.model import ACCEL, RayOptions, RayStartResult
from bench.scenarios.ray_start.netns import loopback_up, private_netns, reexec
from bench.scenarios.ray_start.text import ray_failures, ray_start_report


def run_in_netns(o: RayOptions) -> RayStartResult:
    """The measurement in a private network namespace: here when this process is in one,
    else re-executed in one (``unshare -n``, root) and its JSON result read back."""
    workdir = Path(tempfile.mkdtemp(prefix="pdctl-bench-ray-"))
    if private_netns():
        if not loopback_up():
            subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
        res = measure(o, workdir)
        clean = not res.leftovers and not ray_failures(res)
    else:
        res, clean = reexec(o, workdir)
    if clean and not o.keep:
        shutil.rmtree(workdir, ignore_errors=True)
        res.logs = ""
    return res


class RayStartScenario(Scenario[RayOptions, RayStartResult], name="ray", alias="bench.ray_start"):
    """Ray launcher: 64 simulated instances started and stopped, local vs Ray

    `pdctl controller` starts and stops 16 prefill + 48 decode TP1 simulated Llama-3-8B/H100
    instances with `launcher: local` (child processes) and with `launcher: ray` (named detached
    actors in STRICT_PACK placement groups on a local `ray.cluster_utils.Cluster`: a head and 2
    worker nodes x 32 `accel`), in a private network namespace. Reported: time to all ready and
    to all gone after SIGTERM, and the CPU and memory (RSS, PSS) of every kind of process over
    a 30 s idle window: the idle Ray cluster, then the controller, engines, `ray::EngineHost`
    workers and Ray's own processes with every instance ready. Leftovers are checked and
    reported."""

    def add_options(self, ap: argparse.ArgumentParser) -> None:
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
        ap.add_argument("--startup-delay", type=float,
                        help="sim.startup_delay_s (default 0.5)")
        ap.add_argument("--start-timeout", type=float, help="controller.start_timeout_s "
                                                            "(default 600)")
        ap.add_argument("--placement-timeout", type=float, help="ray.placement_timeout_s "
                                                                "(default 300)")
        ap.add_argument("--stop-timeout", type=float, help="seconds after SIGTERM before what "
                                                           "is left is reported (default 180)")
        ap.add_argument("--launchers", nargs="+", choices=["local", "ray"],
                        help="which launchers to measure (default both)")
        ap.add_argument("--keep", action="store_true", help="keep the work directory")
        ap.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)  # set by the re-exec

    def options(self, args: argparse.Namespace) -> RayOptions:
        o = RayOptions.defaults(args.quick)
        take_given(o, args, ("prefill", "decode", "window", "worker_nodes", "node_accel",
                             "node_cpus", "time_scale", "startup_delay", "start_timeout",
                             "placement_timeout", "stop_timeout"))
        if args.launchers:
            o.launchers = tuple(args.launchers)
        o.keep = args.keep
        return o

    def defaults(self, quick: bool) -> RayOptions:
        return RayOptions.defaults(quick)

    def run(self, options: RayOptions) -> RayStartResult:
        return run_in_netns(options)

    def run_from(self, args: argparse.Namespace) -> RayStartResult | None:
        """With ``--workdir`` (the run re-executed in the namespace): measure here and hand
        the result back as JSON only; the process that started this one reports it."""
        if args.workdir is None:
            return self.run(self.options(args))
        if not private_netns():
            raise FleetError("--workdir is for the run inside a private network namespace")
        write_json(args.json, measure(self.options(args), args.workdir))
        return None

    def report(self, result: RayStartResult) -> str:
        return ray_start_report(result)

    def check(self, result: RayStartResult) -> str | None:
        """What failed or was left (never a timing)."""
        return "; ".join(ray_failures(result)) or None
