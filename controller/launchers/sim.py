"""Simulated engines (``pdctl engine-sim``) as local processes on free ports."""

from __future__ import annotations

import sys

from controller.config import Settings
from controller.launchers.base import Launched, LaunchSpec
from controller.launchers.process import ProcessLauncher, free_port, spawn


class SimLauncher(ProcessLauncher):
    name = "sim"

    def __init__(self, settings: Settings) -> None:
        super().__init__()
        self._s = settings

    def argv(self, spec: LaunchSpec, port: int) -> list[str]:
        s = self._s
        args = [
            sys.executable, "-m", "controller.engines.sim",
            "--host", "127.0.0.1", "--port", str(port),
            "--role", spec.role.value,
            "--hardware", s.hardware.accelerator,
            "--model", s.model.name,
            "--served-model-name", s.model.public_name,
            "--tp", str(spec.tp),
            "--link", s.hardware.kv_link,
            "--time-scale", str(s.sim.time_scale),
            "--kv-load-failure-policy", s.sim.kv_load_failure_policy,
            "--kv-lease-duration", str(s.kv.lease_s),
            "--startup-delay-s", str(s.sim.startup_delay_s),
            "--engine-id", spec.instance_id,
        ]
        pool = getattr(s.pools, spec.role.value)
        for key, value in pool.engine_args.items():
            args += [f"--{key.replace('_', '-')}", str(value)]
        return args

    async def start(self, spec: LaunchSpec) -> Launched:
        port = free_port()
        proc = spawn(self.argv(spec, port), spec.log_path)
        self._track(proc)
        return Launched(url=f"http://127.0.0.1:{port}", handle={"proc": proc, "log": spec.log_path,
                                                               "pid": proc.pid})
