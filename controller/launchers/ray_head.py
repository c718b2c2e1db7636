"""A Ray head on this machine for ``ray.address: local`` (``pdctl lab --launcher ray``).

Started with ``ray start --head --block`` in a process group of its own -- so the Ctrl-C a
terminal sends the lab does not kill Ray before the controller has stopped its engines --
and stopped as a group (GCS, raylet, workers) when the launcher closes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from controller.config import Settings
from controller.errors import ConfigError
from controller.launchers.process import free_port, spawn, stop_group_sync, tail
from controller.token_file import ensure_token

READY_TIMEOUT_S = 120.0


def head_argv(settings: Settings, port: int) -> list[str]:
    r, hw = settings.ray, settings.hardware
    accel = settings.ray_accelerator
    argv = [str(Path(sys.executable).with_name("ray")), "start", "--head", "--block",
            "--port", str(port), "--include-dashboard", "false", "--disable-usage-stats",
            "--num-cpus", str(r.head_cpus or (os.cpu_count() or 1) * hw.share)]
    resources = dict(r.head_resources)
    if not resources and accel not in ("CPU", "GPU"):
        resources = {accel: float(hw.per_node * hw.share)}
    if resources:
        argv += ["--resources", json.dumps(resources)]
    if accel == "GPU" and settings.backend == "sim":
        # Simulated engines need no GPU: the head offers the configured fleet's accelerators
        # as logical GPUs (one node holding them all).
        argv += ["--num-gpus", str(hw.total_accelerators)]
    return argv


TOKEN_FILE = "ray-auth-token"


def ensure_local_token(state_dir: Path) -> None:
    """The local head runs in token mode, and Ray's ``ray start`` does not create a token: on
    a machine with none (no ``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or ~/.ray/auth_token)
    give the head, its workers and this driver one kept in the state directory (owner-only),
    through ``RAY_AUTH_TOKEN_PATH`` in this process's environment."""
    if os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH") \
            or (Path.home() / ".ray" / "auth_token").exists():
        return
    ensure_token(state_dir, TOKEN_FILE)
    os.environ["RAY_AUTH_TOKEN_PATH"] = str((state_dir / TOKEN_FILE).resolve())


class LocalHead:
    def __init__(self, settings: Settings) -> None:
        self.port = free_port()
        self.log = (settings.controller.state_dir / "logs" / "ray-head.log").resolve()
        # Token authentication on, whatever the environment says: the head may listen on
        # the host's interface (docs/ray.md).
        self.proc: subprocess.Popen[bytes] = spawn(head_argv(settings, self.port), self.log,
                                                   {"RAY_AUTH_MODE": "token"})
        self.address = f"127.0.0.1:{self.port}"

    def wait_started(self) -> None:
        """Until ``ray start`` reports the head up (it then blocks); raises ConfigError."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ConfigError(f"the local Ray head exited with status {self.proc.poll()}:\n"
                                  f"{tail(self.log, 20)}")
            if "Ray runtime started" in tail(self.log, 200):
                return
            time.sleep(0.2)
        self.stop()
        raise ConfigError(f"the local Ray head did not start within {READY_TIMEOUT_S:g} s "
                          f"(log {self.log})")

    def stop(self) -> None:
        stop_group_sync(self.proc, 10.0)
