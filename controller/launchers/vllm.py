"""Real vLLM OpenAI servers as local processes, KV cache over NIXL (NixlConnector, or
NixlPushConnector for a pool in KV push mode).

One server per instance with its own HTTP port and NIXL side-channel port. Prefill instances
are ``kv_producer``s, decode instances ``kv_consumer``s; each one's NIXL engine id is its
instance id (``Launched.kv_peer`` names it with its side channel, for push-mode decode
hops). On a CPU host (``hardware`` is a ``cpu-*`` profile) each instance is pinned to the
cores it was placed on (``VLLM_CPU_OMP_THREADS_BIND``, one core per TP rank) with
``vllm.cpu_kv_cache_gib`` of KV cache; when ``hardware.share`` lets instances outnumber
cores, the extra instances are pinned to cores that already run one -- correct, but every
instance on a shared core is slowed. On a GPU host the placed GPUs are given through
``CUDA_VISIBLE_DEVICES``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
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
KV_CONNECTOR = {"pull": "NixlConnector", "push": "NixlPushConnector"}
NIXL_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.nixl"

# Why a pool may not take KV push on CPU hardware (``hardware.is_cpu``) unless
# ``vllm.push_on_cpu`` says so: what the real lab showed (tests/engine, CI, bench.handoff_lab).
PUSH_ON_CPU_REFUSAL: str | None = (
    "vLLM 0.32's CPU build is not reliable with NixlPushConnector on shared cores: on a "
    "2-vCPU host its prefill worker hung in execute_model ('RPC call to execute_model timed "
    "out' after 5 minutes, the engine then died) and its prefill-to-decode push handshake "
    "timed out ('push_handshake_failed' after vLLM's fixed 5 s), leaving decode requests "
    "waiting for KV that never came; set vllm.push_on_cpu: true to run it anyway")

PUSH_CHECK_TIMEOUT_S = 30.0  # locating vLLM and reading its source: well under a second
_push_checked: dict[str, str | None] = {}  # interpreter -> why it has no push (None: it has)
_push_lock = threading.Lock()


ENTRY = Path(__file__).with_name("vllm_entry.py")


def push_refusal(settings: Settings) -> str | None:
    """Why vLLM engines cannot run KV push here, or None: refused on CPU hardware (unless
    ``vllm.push_on_cpu``), and where the installed vLLM has no NixlPushConnector."""
    if settings.hardware.is_cpu and not settings.vllm.push_on_cpu \
            and PUSH_ON_CPU_REFUSAL is not None:
        return PUSH_ON_CPU_REFUSAL
    return installed_push_refusal(settings.vllm.python or sys.executable)


def installed_push_refusal(python: str) -> str | None:
    """Whether the vLLM of interpreter ``python`` ships NixlPushConnector in its NIXL
    connector package (``NIXL_MODULE``): None, or why not. Checked once per interpreter, in a
    child process that locates the package without importing it (importing vLLM takes many
    seconds on a loaded CPU host) and reads its source; a check that could not run is not
    remembered."""
    with _push_lock:
        if python in _push_checked:
            return _push_checked[python]
        rel = NIXL_MODULE.split(".", 1)[1].replace(".", "/")
        code = ("import importlib.util, pathlib\n"
                "spec = importlib.util.find_spec('vllm')\n"
                "if spec is None or not spec.submodule_search_locations:\n"
                "    print('NOVLLM')\n"
                "else:\n"
                f"    d = pathlib.Path(list(spec.submodule_search_locations)[0]) / {rel!r}\n"
                "    text = ''.join(p.read_text(errors='replace') for p in d.glob('*.py'))\n"
                "    print('PUSH', 'class NixlPushConnector' in text)")
        try:
            done = subprocess.run([python, "-c", code], capture_output=True, text=True,
                                  timeout=PUSH_CHECK_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"could not check the installed vLLM for NixlPushConnector ({exc})"
        if "PUSH True" in done.stdout:
            why = None
        elif "PUSH False" in done.stdout:
            why = (f"the installed vLLM ({python}) has no NixlPushConnector in {NIXL_MODULE} "
                   "(vLLM 0.32 or later has it)")
        elif "NOVLLM" in done.stdout:
            why = f"no vLLM is installed for {python}"
        else:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            why = f"the installed vLLM ({python}) has no {NIXL_MODULE}: {last}"
        _push_checked[python] = why
        return why


def kv_transfer_config(role: Role, settings: Settings, kv_mode: str = "pull",
                       engine_id: str | None = None) -> dict[str, Any]:
    """vLLM's ``--kv-transfer-config`` for one instance: NixlConnector (``pull``) or
    NixlPushConnector (``push``), with ``engine_id`` (its instance id: a restarted instance
    gets a new id, hence a new NIXL identity) where given."""
    return {
        "kv_connector": KV_CONNECTOR[kv_mode],
        **({"engine_id": engine_id} if engine_id is not None else {}),
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
    """vLLM's OpenAI server with NixlConnector (or NixlPushConnector), for one instance."""

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
            "--kv-transfer-config", json.dumps(kv_transfer_config(
                spec.role, s, spec.kv_mode, spec.instance_id)),
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

    def kv_peer(self, spec: LaunchSpec, host: str, port: int, side_port: int
                ) -> dict[str, Any] | None:
        """Its NIXL identity: the engine id (the instance id) and its side channel."""
        return {"engine_id": spec.instance_id, "host": host, "port": side_port,
                "tp_size": spec.tp}


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
