"""The vLLM engines' command line: the NixlConnector config both roles get, and the CPU
defaults that keep the real P/D path working (float32, no NIXL worker threads) and the rest of
the host responsive (niceness 19)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from controller.config import Settings, load_settings
from controller.errors import ConfigError
from controller.launchers.base import LaunchSpec
from controller.launchers.process import spawn, stop_group
from controller.launchers.vllm import VllmLauncher, kv_transfer_config
from controller.models import Role

CPU = {"accelerator": "cpu-lab", "kv_link": "host-memory"}
ONE_CORE = {"prefill": {"tp": 1}, "decode": {"tp": 1}}  # pools that fit the CPU lab


def settings(tmp_path: Path, **over: object) -> Settings:
    return load_settings(None, backend="vllm", model={"name": "lab-tiny", "path": str(tmp_path)},
                         **{"pools": ONE_CORE, **over})


def test_cpu_engines_get_the_lease_and_no_nixl_worker_threads(tmp_path: Path) -> None:
    s = settings(tmp_path, hardware=CPU, kv={"lease_s": 45})
    for role, kv_role in ((Role.PREFILL, "kv_producer"), (Role.DECODE, "kv_consumer")):
        cfg = kv_transfer_config(role, s)
        assert cfg["kv_role"] == kv_role and cfg["kv_buffer_device"] == "cpu"
        assert cfg["kv_connector_extra_config"] == {"num_threads": 0, "kv_lease_duration": 45}
    argv = VllmLauncher(s).argv(LaunchSpec("prefill-1", Role.PREFILL, 1, (0,),
                                           tmp_path / "log"), 8100)
    assert argv[1].endswith("vllm_entry.py")
    assert argv[argv.index("--dtype") + 1] == "float32"
    assert argv[argv.index("--block-size") + 1] == "128"
    sent = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert sent["kv_connector_extra_config"]["kv_lease_duration"] == 45


def test_operator_settings_win_and_gpu_hosts_keep_vllm_defaults(tmp_path: Path) -> None:
    s = settings(tmp_path, hardware=CPU,
                 vllm={"kv_connector_extra_config": {"num_threads": 2}, "dtype": "bfloat16"})
    assert kv_transfer_config(Role.DECODE, s)["kv_connector_extra_config"] == {
        "num_threads": 2, "kv_lease_duration": 30}
    assert s.engine_dtype == "bfloat16"
    gpu = settings(tmp_path)
    assert kv_transfer_config(Role.DECODE, gpu)["kv_connector_extra_config"] == {
        "kv_lease_duration": 30}
    argv = VllmLauncher(gpu).argv(LaunchSpec("d", Role.DECODE, 1, (0,), tmp_path / "l"), 1)
    assert "--dtype" not in argv and argv[argv.index("--block-size") + 1] == "16"


def test_the_lease_is_set_in_one_place(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="kv.lease_s"):
        settings(tmp_path, vllm={"kv_connector_extra_config": {"kv_lease_duration": 5}})


def test_cpu_engines_run_at_niceness_19_unless_told(tmp_path: Path) -> None:
    assert settings(tmp_path, hardware=CPU).engine_nice == 19
    assert settings(tmp_path, hardware=CPU, vllm={"nice": 0}).engine_nice == 0
    assert settings(tmp_path).engine_nice == 0  # a GPU host
    with pytest.raises(ConfigError, match="nice"):
        settings(tmp_path, vllm={"nice": 20})


async def test_spawned_engines_get_their_niceness_with_every_thread(tmp_path: Path) -> None:
    proc = spawn([sys.executable, "-c", "import threading, time; threading.Thread("
                  "target=time.sleep, args=(30,)).start(); time.sleep(30)"],
                 tmp_path / "e.log", nice=7)
    try:
        for _ in range(100):
            tids = os.listdir(f"/proc/{proc.pid}/task")
            if len(tids) > 1:
                break
            await asyncio.sleep(0.02)
        mine = os.getpriority(os.PRIO_PROCESS, 0)
        assert len(tids) > 1
        assert {os.getpriority(os.PRIO_PROCESS, int(t)) for t in tids} == {mine + 7}
    finally:
        await stop_group(proc, 1.0)
