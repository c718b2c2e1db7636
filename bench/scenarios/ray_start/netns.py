"""The ray_start scenario's private network namespace: Ray binds the host's interface unless
it runs in one, so the measurement runs inside ``unshare -n`` (as root) -- here when this
process is already in one, else re-executed there with its output relayed and its JSON result
read back, and every process it left found (by a mark in its environment) and killed."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import psutil

from bench.processes import FleetError, process_alive
from bench.report import ROOT
from bench.scenarios.ray_start.model import RayOptions, RayStartResult, from_json
from bench.scenarios.ray_start.procs import process_line
from bench.scenarios.ray_start.text import ray_failures

ANSI = re.compile(r"\x1b\[[0-9;]*m")  # Ray colours what its driver prints
RUN_MARK = "PDCTL_BENCH_RAY_RUN"  # in the environment of every process the run starts


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


def option_args(o: RayOptions) -> list[str]:
    """``o`` as command-line arguments (for the run re-executed in the namespace)."""
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
                    or p.environ().get(RUN_MARK) == run_id) and process_alive(p):
                out.append(p)
    return out


def relay(proc: subprocess.Popen[bytes], run_id: str, workdir: Path) -> None:
    """The namespaced run's output printed here until it exits; on Ctrl-C or an error, it is
    asked to stop (its own cleanup runs) and what it left is killed."""
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


def reexec(o: RayOptions, workdir: Path) -> tuple[RayStartResult, bool]:
    """The run in ``unshare -n``: its result, and whether it was clean."""
    if os.geteuid() != 0:
        raise FleetError("bench.ray_start runs Ray in a private network namespace "
                         "(unshare -n), which needs root")
    out = workdir / "result.json"
    run_id = uuid.uuid4().hex
    argv = ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$0" "$@"',
            sys.executable, "-m", "bench", "ray", "--json", str(out), "--workdir",
            str(workdir), *option_args(o)]
    print(f"bench.ray_start: in a private network namespace: unshare -n ... python -m "
          f"bench ray {' '.join(option_args(o))}", flush=True)
    proc = subprocess.Popen(argv, cwd=ROOT, env={**os.environ, RUN_MARK: run_id},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    relay(proc, run_id, workdir)
    left = marked(run_id, workdir)
    outer_left = [f"after the namespace exited: {process_line(p)}" for p in left]
    for p in left:
        with contextlib.suppress(psutil.Error):
            p.kill()
    if not out.exists():
        raise FleetError(f"python -m bench ray exited {proc.returncode} without a "
                         f"result; logs in {workdir}")
    res: RayStartResult = from_json(RayStartResult, json.loads(out.read_text()))
    res.leftovers += outer_left
    res.logs = str(workdir)
    return res, proc.returncode == 0 and not res.leftovers and not ray_failures(res)
