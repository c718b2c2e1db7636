"""Simulated engines (``pdctl engine-sim``): the command line of one."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from controller.config import Settings
from controller.launchers.base import Command, EngineKind, EventPorts, LaunchSpec
from controller.launchers.process import ProcessLauncher


class SimEngineKind(EngineKind):
    name = "sim"

    def __init__(self, settings: Settings) -> None:
        self._s = settings

    def argv(self, spec: LaunchSpec, port: int, host: str = "127.0.0.1") -> list[str]:
        s = self._s
        args = [
            sys.executable, "-m", "controller.engines.sim",
            "--host", host, "--port", str(port),
            "--role", spec.role.value,
            "--hardware", s.hardware.accelerator,
            "--model", s.model.profile_name,
            "--served-model-name", s.model.public_name,
            "--tp", str(spec.tp),
            "--link", s.hardware.kv_link,
            "--time-scale", str(s.sim.time_scale),
            "--kv-load-failure-policy", s.sim.kv_load_failure_policy,
            "--kv-lease-duration", str(s.kv.lease_s),
            "--startup-delay-s", str(s.sim.startup_delay_s),
            "--engine-id", spec.instance_id,
        ]
        # push mode (vLLM 0.32's NixlPushConnector): the controller's LaunchSpec.kv_mode
        if getattr(spec, "kv_mode", "pull") == "push":
            args += ["--kv-connector", "NixlPushConnector"]
        if s.model.max_model_len is not None:  # default: the preset's own context
            args += ["--max-model-len", str(s.model.max_model_len)]
        pool = getattr(s.pools, spec.role.value)
        for key, value in pool.engine_args.items():
            args += [f"--{key.replace('_', '-')}", str(value)]
        return args

    def kv_peer(self, spec: LaunchSpec, host: str, port: int, side_port: int
                ) -> dict[str, Any] | None:
        """A simulated engine's NIXL identity: its ``--engine-id`` and its HTTP port, which
        is also its KV side channel (``side_port`` is unused)."""
        advertised = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host  # wildcard bind
        return {"engine_id": spec.instance_id, "host": advertised, "port": port,
                "tp_size": spec.tp}

    def command(self, spec: LaunchSpec, host: str, port: int, side_port: int,
                devices: Sequence[str] | None = None, events: EventPorts | None = None
                ) -> Command:
        return Command(self.argv(spec, port, host) + (events.flags() if events else []))


class SimLauncher(ProcessLauncher):
    """Simulated engines as local processes on free ports."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(SimEngineKind(settings))
