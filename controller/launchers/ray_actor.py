"""The Ray actor that hosts one engine instance on a Ray node.

``RayLauncher`` creates one named, detached ``EngineHost`` per instance inside a placement
group. The actor picks the node's IP and four free ports there (HTTP, NIXL's side
channel, KV events and their replay), asks the engine kind for the
command line, and runs it as a child process in its own process group (with
``PR_SET_PDEATHSIG``, so a dying actor takes its engine along). Ray kills only an actor's
direct children when it removes the actor; vLLM starts grandchildren, so ``stop`` signals the
whole process group before the actor goes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from controller.launchers.base import EngineKind, EventPorts, LaunchSpec
from controller.launchers.process import free_ports, spawn, tail


class EngineHost:
    """One engine process on this Ray node; every method answers at once."""

    def __init__(self, spec: LaunchSpec) -> None:
        self.spec = spec
        self.proc: subprocess.Popen[bytes] | None = None
        self.info: dict[str, Any] = {}

    def start(self, engine: EngineKind, accelerator: str) -> dict[str, Any]:
        import ray  # noqa: PLC0415 - only ever imported inside a Ray worker

        ctx = ray.get_runtime_context()
        host = ray.util.get_node_ip_address()
        port, side, publish, replay = free_ports(host, 4)
        events = EventPorts(publish, replay)
        spec = self.spec
        devices = _devices(accelerator, spec, ctx.get_accelerator_ids())
        cmd = engine.command(spec, host, port, side, devices, events)
        self.proc = spawn(cmd.argv, spec.log_path, cmd.env, nice=cmd.nice)
        self.info = {
            "instance_id": spec.instance_id, "role": spec.role.value, "tp": spec.tp,
            "url": f"http://{host}:{port}", "node_ip": host, "node_id": ctx.get_node_id(),
            "pid": self.proc.pid, "side_channel": f"{host}:{side}",
            "kv_events": list(events.endpoints(host)),
            "kv_mode": spec.kv_mode, "kv_peer": engine.kv_peer(spec, host, port, side),
            "devices": devices or [], "log": str(spec.log_path),
            "actor_pid": os.getpid()}
        return self.describe()

    def describe(self) -> dict[str, Any]:
        """What runs here, and the engine's exit status once it has ended (else None)."""
        return {**self.info, "exit_code": self.proc.poll() if self.proc else None}

    def stop(self, grace_s: float) -> int | None:
        """SIGTERM the engine's process group, SIGKILL it after ``grace_s``; its status."""
        if self.proc is None:
            return None
        self._signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        self._signal(signal.SIGKILL)  # grandchildren that ignored SIGTERM go too
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        return self.proc.poll()

    def _signal(self, sig: int) -> None:
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def log_tail(self, lines: int) -> str:
        return tail(Path(self.info.get("log", self.spec.log_path)), lines)


def _devices(accelerator: str, spec: LaunchSpec, assigned: dict[str, list[str]]
             ) -> list[str] | None:
    """The devices the engine may use on this node: the GPUs Ray assigned to the actor; on a
    CPU node, cores by the controller's placement folded onto this node's cores (a
    one-node cluster pins exactly as the local launcher does); else None."""
    if accelerator == "GPU":
        return [str(g) for g in assigned.get("GPU", [])]
    if accelerator == "CPU":
        cores = os.cpu_count() or 1
        return [str(a % cores) for a in spec.accelerators]
    return None
