"""Real vLLM OpenAI servers as local processes, KV cache over NIXL (NixlConnector).

One server per instance with its own HTTP port and NIXL side-channel port. Prefill instances
are ``kv_producer``s, decode instances ``kv_consumer``s. On a CPU host (``hardware`` is a
``cpu-*`` profile) each instance is pinned to the cores it was placed on
(``VLLM_CPU_OMP_THREADS_BIND``, one core per TP rank) with ``vllm.cpu_kv_cache_gib`` of KV
cache; when ``hardware.share`` lets instances outnumber cores, the extra instances are pinned
to cores that already run one -- correct, but every instance on a shared core is slowed. On a
GPU host the placed GPUs are given through ``CUDA_VISIBLE_DEVICES``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from controller.config import Settings
from controller.errors import ConfigError
from controller.launchers.base import Command, EngineKind, EventPorts, LaunchSpec
from controller.launchers.process import ProcessLauncher
from controller.models import Role
from controller.sizing.cpu_features import CPU_NIXL_EXTRA

KV_ROLE = {Role.PREFILL: "kv_producer", Role.DECODE: "kv_consumer"}


ENTRY = Path(__file__).with_name("vllm_entry.py")


def kv_transfer_config(role: Role, settings: Settings) -> dict[str, Any]:
    return {
        "kv_connector": "NixlConnector",
        "kv_role": KV_ROLE[role],
        "kv_buffer_device": "cpu" if settings.hardware.is_cpu else "cuda",
        "kv_load_failure_policy": settings.vllm.kv_load_failure_policy,
        # Both roles: the prefill holds blocks this long, the decode heartbeats at 1/6 of it.
        "kv_connector_extra_config": {
            **(CPU_NIXL_EXTRA if settings.hardware.is_cpu else {}),
            **settings.vllm.kv_connector_extra_config,
            "kv_lease_duration": settings.kv.lease_s},
    }


def engine_flags(engine_args: dict[str, Any]) -> list[str]:
    """``{max_num_seqs: 256, enable_prefix_caching: true}`` -> vLLM command-line flags."""
    out: list[str] = []
    for key, value in engine_args.items():
        flag = f"--{key.replace('_', '-')}"
        if value is True:
            out.append(flag)
        elif value is False or value is None:
            continue
        else:
            out += [flag, value if isinstance(value, str) else json.dumps(value)]
    return out


class VllmEngineKind(EngineKind):
    """vLLM's OpenAI server with NixlConnector, for one instance."""

    name = "vllm"

    def __init__(self, settings: Settings) -> None:
        if settings.model.path is None:
            raise ConfigError("backend vllm needs model.path (a model directory; "
                              "`pdctl make-model DIR` writes the lab model)")
        self._s = settings

    def argv(self, spec: LaunchSpec, port: int, host: str = "127.0.0.1") -> list[str]:
        s, v = self._s, self._s.vllm
        args = [
            # vLLM's OpenAI server, after one log line naming its CPU attention kernel.
            v.python or sys.executable, str(ENTRY),
            "--model", str(Path(s.model.path or ".").resolve()),
            "--served-model-name", s.model.public_name,
            "--host", host, "--port", str(port),
            "--tensor-parallel-size", str(spec.tp),
            "--block-size", str(s.kv_block_size),
            "--enable-per-request-metrics",
            "--disable-uvicorn-access-log",
            "--kv-transfer-config", json.dumps(kv_transfer_config(spec.role, s)),
        ]
        if s.engine_dtype:
            args += ["--dtype", s.engine_dtype]
        if v.max_model_len:
            args += ["--max-model-len", str(v.max_model_len)]
        if v.enforce_eager:
            args.append("--enforce-eager")
        if not s.hardware.is_cpu:
            args += ["--gpu-memory-utilization", str(v.gpu_memory_utilization)]
        pool = getattr(s.pools, spec.role.value)
        return args + engine_flags(pool.engine_args)

    def env(self, spec: LaunchSpec, side_port: int, host: str = "127.0.0.1",
            devices: Sequence[str] | None = None) -> dict[str, str]:
        """``host``: the address peers reach this engine's NIXL side channel on (never vLLM's
        own guess, which can be another interface); ``devices``: the GPUs Ray assigned, else
        the placed ``spec.accelerators``."""
        s = self._s
        env = {
            "VLLM_NIXL_SIDE_CHANNEL_HOST": host,
            "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side_port),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "PYTHONUNBUFFERED": "1",
        }
        placed = [str(a) for a in spec.accelerators]
        if s.hardware.is_cpu:
            env["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(placed)
            env["VLLM_CPU_KVCACHE_SPACE"] = str(s.vllm.cpu_kv_cache_gib)
        else:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(placed if devices is None else devices)
        return {**env, **s.vllm.extra_env}

    def command(self, spec: LaunchSpec, host: str, port: int, side_port: int,
                devices: Sequence[str] | None = None, events: EventPorts | None = None
                ) -> Command:
        argv = self.argv(spec, port, host) + (events.flags() if events else [])
        return Command(argv, self.env(spec, side_port, host, devices), self._s.engine_nice)


class VllmLauncher(ProcessLauncher):
    """vLLM engines as local processes."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(VllmEngineKind(settings))

    def argv(self, spec: LaunchSpec, port: int) -> list[str]:
        assert isinstance(self.engine, VllmEngineKind)
        return self.engine.argv(spec, port)

    def env(self, spec: LaunchSpec, side_port: int) -> dict[str, str]:
        assert isinstance(self.engine, VllmEngineKind)
        return self.engine.env(spec, side_port)
