"""The lab scenario's setups started: a controller per setup (fresh state, no Prometheus),
the real vLLM engines it starts (disagg), two plain colocated vLLM servers behind an
``external`` controller (colocated), or the simulated lab (sim); then warmed up."""

from __future__ import annotations

import functools
import shlex
import shutil
import time
from pathlib import Path
from typing import Any

import httpx

from bench.fleet import ControllerProc, free_port, healthy, start_controller
from bench.processes import ProcessFleet, wait_until
from bench.scenarios.lab.model import OFFLINE, LabOptions, SetupResult, note
from controller.cli.serve import cpu_lab_defaults
from controller.config import deep_merge, load_settings
from controller.launchers.base import LaunchSpec
from controller.launchers.vllm import VllmLauncher
from controller.models import Role


def lab_config(model_dir: Path) -> dict[str, Any]:
    cfg = cpu_lab_defaults(model_dir.resolve())
    cfg["backend"] = "vllm"
    return cfg


def start_lab_controller(fleet: ProcessFleet, o: LabOptions, cfg: dict[str, Any],
                         name: str) -> ControllerProc:
    """A controller for setup ``name``: a fresh state directory (no desired state left from
    an earlier run), no Prometheus, the config checked before anything starts."""
    state = o.work / f"state-{name}"
    shutil.rmtree(state, ignore_errors=True)
    cfg = deep_merge(cfg, {"controller": {"port": free_port(), "state_dir": str(state)},
                           "prometheus": {"enabled": False}})
    load_settings(None, **cfg)  # refuse a bad config here
    # The controller (and the sim engines it starts) may run from ``pdctl_root``: a pinned
    # copy of the code keeps a benchmark apart from edits in progress in a shared tree.
    return start_controller(o.work, cfg, name=f"{name}-controller", fleet=fleet,
                            pdctl_root=o.pdctl_root, env=OFFLINE, wait="up", timeout_s=60)


def wait_pools(ctl: ControllerProc, want: dict[str, int], fleet: ProcessFleet,
               timeout_s: float) -> float:
    """Until the controller reports ``want`` ready instances per role; seconds it took."""
    seen: list[Any] = []

    def ready() -> bool:
        inst = ctl.get("/instances")
        seen[:] = [inst]
        return all(sum(1 for i in inst if i["role"] == r and i["state"] == "ready") >= n
                   for r, n in want.items())

    def progress(elapsed: float) -> str:
        states = ", ".join(f"{i['id']} {i['state']}" for i in (seen[0] if seen else []))
        return f"engines starting ({elapsed:.0f} s): {states}"

    return wait_until("engines", ready, timeout_s, fleet, interval_s=1.0, progress=progress)


def start_colocated_engines(fleet: ProcessFleet, model_dir: Path, work: Path) -> list[str]:
    """Two plain vLLM servers, one per core, exactly the launcher's flags and environment
    except the NixlConnector (``--kv-transfer-config``) and its side-channel variables."""
    settings = load_settings(None, **lab_config(model_dir))
    launcher = VllmLauncher(settings)
    urls = []
    for core in range(2):
        spec = LaunchSpec(f"colo-{core}", Role.DECODE, 1, (core,), work / f"colo-{core}.log")
        port = free_port()
        argv = launcher.argv(spec, port)
        i = argv.index("--kv-transfer-config")
        del argv[i:i + 2]
        env = {k: v for k, v in launcher.env(spec, 0).items()
               if not k.startswith("VLLM_NIXL_")}
        note(f"  core {core}: {' '.join(f'{k}={v}' for k, v in env.items() if 'CPU' in k)} "
             f"{shlex.join(argv[1:])}")
        fleet.start(f"colo-{core}", argv, env, log=spec.log_path)
        urls.append(f"http://127.0.0.1:{port}")
    return urls


def start_setup(name: str, o: LabOptions, fleet: ProcessFleet,
                result: SetupResult) -> ControllerProc:
    """Setup ``name`` started and ready: its controller; the seconds its engines took to
    become ready go into ``result`` as soon as they are known."""
    if name == "disagg":
        ctl = start_lab_controller(fleet, o, lab_config(o.model_dir), name)
        result.engines_ready_s = wait_pools(ctl, {"prefill": 1, "decode": 1}, fleet,
                                            o.start_timeout)
        return ctl
    if name == "colocated":
        urls = start_colocated_engines(fleet, o.model_dir, o.work)
        t0 = time.monotonic()
        for u in urls:
            wait_until(f"colocated vLLM {u}", functools.partial(healthy, u), o.start_timeout,
                       fleet, interval_s=1.0,
                       progress=lambda s: f"waiting for the colocated engines ({s:.0f} s)")
        result.engines_ready_s = time.monotonic() - t0
        cfg = deep_merge(lab_config(o.model_dir), {
            "backend": "external",
            "pools": {"prefill": {"size": 0, "urls": []},
                      "decode": {"size": 2, "urls": urls}}})
        cfg.pop("vllm")
        ctl = start_lab_controller(fleet, o, cfg, name)
        wait_pools(ctl, {"decode": 2}, fleet, 120)
        return ctl
    cfg = deep_merge(lab_config(o.model_dir), {
        "backend": "sim", "sim": {"time_scale": 1.0, "startup_delay_s": 0.5}})
    cfg.pop("vllm")
    ctl = start_lab_controller(fleet, o, cfg, name)
    result.engines_ready_s = wait_pools(ctl, {"prefill": 1, "decode": 1}, fleet, 120)
    return ctl


def warm_up(base: str, n: int = 2) -> None:
    """First requests of a fresh engine (and a first NIXL transfer) are slow; keep them out."""
    with httpx.Client(base_url=base, timeout=600) as c:
        for i in range(n):
            for prompt in ("warm up " * 4, "warm up the prefill and decode path " * 70):
                r = c.post("/v1/completions", json={"model": "lab-tiny", "prompt": f"{i} {prompt}",
                                                    "max_tokens": 8, "ignore_eos": True})
                r.raise_for_status()
