"""The pieces a benchmark or an integration test starts: a ``pdctl controller``
(``start_controller`` -> ``ControllerProc``, its API called with its token), simulated and
instant engines' command lines, and the simulated fleets' shared choices (models, accelerator).

Processes are started, watched and stopped by ``bench.processes``; the benchmarks' scenarios
and ``tests/integration/harness.py`` both start their controllers here.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.processes import FleetError, ProcessFleet, spawn_in
from bench.report import ROOT
from controller.launchers.process import free_port, signal_group, tail

# The simulated fleets' model and accelerator: an 8B model where the router's or the
# launcher's cost is measured, a 70B one where the fleet's size and the planner are.
SIM_MODEL_8B = "llama-3-8b"
SIM_MODEL_70B = "llama-3-70b"
SIM_HARDWARE = "h100-sxm"
SIM_ENGINE_MATCH = "controller.engines.sim"  # on the command line of every sim engine process


def healthy(url: str, path: str = "/health", timeout_s: float = 2.0) -> bool:
    """Whether ``url + path`` answers 200."""
    try:
        return httpx.get(url + path, timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False


def sim_engine_argv(port: int, role: str, model: str, hardware: str = SIM_HARDWARE,
                    tp: int = 1, time_scale: float = 1.0) -> list[str]:
    """``python -m controller.engines.sim`` for one engine."""
    return [sys.executable, "-m", "controller.engines.sim", "--port", str(port), "--role", role,
            "--model", model, "--hardware", hardware, "--tp", str(tp),
            "--time-scale", str(time_scale)]


def instant_engine_argv(prefill_port: int, decode_port: int, model: str) -> list[str]:
    """``python -m bench.instant_engine``: a prefill and a decode port that answer at once."""
    return [sys.executable, "-m", "bench.instant_engine", "--prefill-port", str(prefill_port),
            "--decode-port", str(decode_port), "--model", model]


# ---- the controller ----------------------------------------------------------------------

@dataclass
class ControllerProc:
    """A running ``pdctl controller``: its process, URL, state directory and log, and calls
    to its API with its token."""

    proc: subprocess.Popen[bytes]
    url: str
    state_dir: Path
    log_path: Path
    argv: list[str] = field(default_factory=list)

    @property
    def token(self) -> str:
        return (self.state_dir / "token").read_text().strip()

    def api(self, method: str, path: str, body: Any = None, token: str | None = "default",
            timeout_s: float = 30.0, params: dict[str, Any] | None = None) -> httpx.Response:
        """``/api/v1`` + ``path``; ``token``: "default" (the controller's), None, or another."""
        headers = {}
        if token is not None:
            headers["Authorization"] = f"Bearer {self.token if token == 'default' else token}"
        return httpx.request(method, f"{self.url}/api/v1{path}", json=body, headers=headers,
                             params=params, timeout=timeout_s)

    def get(self, path: str, **params: Any) -> Any:
        r = self.api("GET", path, params=params or None)
        r.raise_for_status()
        return r.json()

    def healthz(self, timeout_s: float = 2.0) -> dict[str, Any]:
        r = httpx.get(f"{self.url}/healthz", timeout=timeout_s)
        r.raise_for_status()
        data: dict[str, Any] = r.json()
        return data

    def ready(self) -> dict[str, int]:
        """Ready instances per role, from ``/healthz``."""
        return dict(self.healthz().get("ready", {}))

    def metrics_text(self, timeout_s: float = 30.0) -> str:
        return httpx.get(f"{self.url}/metrics", timeout=timeout_s).text

    def wait(self, pred: Callable[[], bool], timeout: float, what: str,
             interval: float = 0.2) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pred():
                return
            time.sleep(interval)
        raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n"
                             f"{json.dumps(self.get('/cluster')['pools'], indent=1)}")

    def converged(self) -> bool:
        pools = self.get("/cluster")["pools"]
        return all(p["converged"] for p in pools.values())

    def wait_converged(self, timeout: float = 60.0) -> None:
        self.wait(self.converged, timeout, "pools to converge")

    def instance_failures(self) -> list[str]:
        """Instances the controller failed during this session (audit log), with the reason
        and, for an engine that exited, the last line of its log."""
        try:
            out = []
            for e in self.get("/events", kind="instance.failed", limit=1000):
                line = f"{e['target']}: {e['detail']}"
                if "exited" in str(e["detail"]):
                    log = self.state_dir / "logs" / f"{e['target']}.log"
                    with contextlib.suppress(OSError):
                        last = [ln for ln in log.read_text(errors="replace").splitlines() if ln]
                        line += f" [log: {last[-1][:160] if last else ''}]"
                out.append(line)
            return out
        except (OSError, httpx.HTTPError, ValueError, KeyError, TypeError):
            return ["(events unavailable)"]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, grace_s: float = 30.0) -> int:
        """SIGTERM (the controller stops its engines), SIGKILL to its group after
        ``grace_s``; its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        signal_group(self.proc, signal.SIGKILL)  # anything left in its group
        return self.proc.returncode


def source_of(pdctl_root: Path | None) -> str:
    """Where the controller's code comes from: this checkout, or ``pdctl_root``, with its
    commit (and whether ``controller/`` there differs from that commit)."""
    root = (pdctl_root or ROOT).resolve()
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--",
                            "controller"], capture_output=True, text=True).stdout.strip()
    what = "this checkout" if pdctl_root is None else str(root)
    changes = " + uncommitted changes in controller/" if dirty else ""
    return f"{what} (commit {head or '?'}{changes})"


def controller_package(pdctl_root: Path | None) -> Path:
    """Where ``import controller`` resolves for a controller started with ``pdctl_root`` (as
    ``start_controller`` starts it): a check that another tree really is the one that runs."""
    env = {**os.environ, "PYTHONPATH": str(pdctl_root)} if pdctl_root else None
    out = subprocess.run([sys.executable, "-c", "import controller; print(controller.__file__)"],
                         cwd=pdctl_root, env=env, capture_output=True, text=True, check=True)
    return Path(out.stdout.strip()).parent


def write_controller_config(workdir: Path, config: dict[str, Any], file: str
                            ) -> tuple[dict[str, Any], Path]:
    """``config`` written to ``workdir/file``, its ``controller`` section given a free
    ``port`` and ``state_dir`` = ``workdir/state`` unless it names them: that section, and
    the file."""
    workdir.mkdir(parents=True, exist_ok=True)
    ctl_cfg = dict(config.get("controller") or {})
    ctl_cfg.setdefault("port", free_port())
    ctl_cfg.setdefault("state_dir", str(workdir / "state"))
    cfg_path = workdir / file
    cfg_path.write_text(yaml.safe_dump({**config, "controller": ctl_cfg}, sort_keys=False))
    return ctl_cfg, cfg_path


def start_controller(workdir: Path, config: dict[str, Any], *, name: str = "controller",
                     fleet: ProcessFleet | None = None, pdctl_root: Path | None = None,
                     log_level: str | None = None, wait: str = "up", timeout_s: float = 30.0,
                     env: dict[str, str] | None = None, config_file: str | None = None,
                     args: list[str] | None = None) -> ControllerProc:
    """Write ``config`` to ``workdir/<name>.yaml`` (or ``workdir/<config_file>``) and run
    ``pdctl controller`` on it.

    ``config["controller"]`` gets a free ``port`` and ``state_dir`` = ``workdir/state``
    unless it names them. ``pdctl_root``: run the controller's code from that source tree
    (this interpreter, ``PYTHONPATH`` = it, started in it) instead of this checkout.
    ``wait``: "up" (``/healthz`` answers), "converged" (also every pool converged) or "none".
    ``args``: more command-line flags.
    With ``fleet`` the process is one of the fleet's (stopped with it); its log is
    ``workdir/<name>.log``.
    """
    ctl_cfg, cfg_path = write_controller_config(workdir, config, config_file or f"{name}.yaml")
    argv = [sys.executable, "-m", "controller.cli", "controller", "--config", str(cfg_path)]
    if log_level:
        argv += ["--log-level", log_level]
    argv += args or []
    env = {"PYTHONUNBUFFERED": "1", **(env or {})}
    cwd = None
    if pdctl_root is not None:
        env["PYTHONPATH"] = str(pdctl_root.resolve())
        cwd = pdctl_root.resolve()  # ``-m`` puts the working directory first on sys.path
    log_path = workdir / f"{name}.log"
    if fleet is not None:
        popen = fleet.start(name, argv, env, cwd, log=log_path).popen
    else:
        popen = spawn_in(cwd, argv, log_path, env)
    ctl = ControllerProc(popen, f"http://127.0.0.1:{ctl_cfg['port']}",
                         Path(ctl_cfg["state_dir"]), log_path, argv)
    if wait == "none":
        return ctl
    _wait_up(ctl, timeout_s)
    if wait == "converged":
        try:
            ctl.wait_converged()
        except BaseException:
            ctl.stop()  # a controller whose pools never converged is not left running
            raise
    return ctl


def _wait_up(ctl: ControllerProc, timeout_s: float) -> None:
    """Until ``/healthz`` answers; ``FleetError`` (the controller stopped) when it exits or
    does not answer in ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        if ctl.proc.poll() is not None:
            raise FleetError(f"controller exited {ctl.proc.returncode}:\n"
                             f"{tail(ctl.log_path, 40)}")
        try:
            if httpx.get(f"{ctl.url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            ctl.stop()
            raise FleetError(f"controller did not come up in {timeout_s:.0f} s:\n"
                             f"{tail(ctl.log_path, 40)}")
        time.sleep(0.1)
