"""The hand-off lab's engines: ports and connectors per mode, one real vLLM CPU engine started
with the product's command line (two ``kv_transfer_config`` fields changed) in its own session
and killed by process group, the lab settings, the wait for readiness."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from controller.config import Settings
from controller.launchers.base import LaunchSpec
from controller.launchers.vllm import VllmEngineKind
from controller.models import Role

HOST = "127.0.0.1"
MODEL_NAME = "lab-tiny"
CONNECTORS = {"pull": "NixlConnector", "push": "NixlPushConnector"}
# (prefill http, decode http, prefill side channel, decode side channel) per mode.
PORTS = {"pull": (18100, 18101, 15600, 15601), "push": (18110, 18111, 15610, 15611)}
DEAD_SIDE_PORT = 15699  # nothing listens here
MAX_TOKENS = 16
METRIC_RE = re.compile(r"^(vllm:[a-z_]+)(\{[^}]*\})?\s+([0-9.eE+-]+)$")


@dataclass
class LabEngine:
    name: str
    role: Role
    mode: str
    core: int
    http_port: int
    side_port: int
    engine_id: str
    log_path: Path
    extra: dict[str, Any] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.http_port}"

    def command(self, settings: Settings) -> tuple[list[str], dict[str, str], int]:
        kind = VllmEngineKind(settings)
        spec = LaunchSpec(self.name, self.role, 1, (self.core,), self.log_path)
        cmd = kind.command(spec, HOST, self.http_port, self.side_port)
        argv = list(cmd.argv)
        i = argv.index("--kv-transfer-config")
        cfg = json.loads(argv[i + 1])
        cfg["kv_connector"] = CONNECTORS[self.mode]
        cfg["engine_id"] = self.engine_id
        cfg["kv_connector_extra_config"] = {**cfg["kv_connector_extra_config"], **self.extra}
        argv[i + 1] = json.dumps(cfg)
        argv.append("--enable-prompt-tokens-details")
        return argv, cmd.env, cmd.nice

    def start(self, settings: Settings) -> None:
        argv, env, nice = self.command(settings)
        log = self.log_path.open("wb")
        log.write(("# " + " ".join(argv) + "\n# env " + json.dumps(env) + "\n").encode())
        log.flush()
        self.proc = subprocess.Popen(
            ["nice", "-n", str(nice), *argv], env={**os.environ, **env}, stdout=log,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is None:
            return
        pgid = self.proc.pid  # session leader: its pid is the group id
        for sig, wait in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 10.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, sig)
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                try:
                    os.killpg(pgid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.2)
            else:
                continue
            break
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)

    def log_tail(self, lines: int = 40, grep: str | None = None) -> list[str]:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return []
        if grep:
            pat = re.compile(grep)
            text = [ln for ln in text if pat.search(ln)]
        return text[-lines:]


def pair_settings(model: Path) -> Settings:
    return Settings(
        backend="vllm",
        model={"name": MODEL_NAME, "path": str(model)},
        hardware={"accelerator": "cpu-lab", "accelerators_per_node": 2, "nodes": 1,
                  "kv_link": "host-memory"},
        pools={"prefill": {"size": 1, "tp": 1}, "decode": {"size": 1, "tp": 1}},
        vllm={"enforce_eager": True, "kv_load_failure_policy": "recompute"},
    )


def wait_engine_ready(client: httpx.Client, engines: list[LabEngine], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    pending = list(engines)
    while pending:
        for eng in list(pending):
            if not eng.alive():
                tail = "\n".join(eng.log_tail(60))
                raise RuntimeError(f"{eng.name} exited during start-up:\n{tail}")
            with contextlib.suppress(httpx.HTTPError):
                if client.get(eng.url + "/v1/models", timeout=2).status_code == 200:
                    pending.remove(eng)
        if time.monotonic() > deadline:
            raise RuntimeError(f"not ready after {timeout_s:.0f} s: {[e.name for e in pending]}")
        time.sleep(1)


def make_pair(mode: str, args: argparse.Namespace, logdir: Path) -> tuple[LabEngine, LabEngine]:
    hp, hd, sp, sd = PORTS[mode]
    extra: dict[str, Any] = {}
    if mode == "push":
        extra["push_registration_timeout"] = args.push_registration_timeout
    p = LabEngine(f"{mode}-prefill", Role.PREFILL, mode, 0, hp, sp, f"hl-{mode}-prefill",
               logdir / f"{mode}-prefill.log", extra)
    d = LabEngine(f"{mode}-decode", Role.DECODE, mode, 1, hd, sd, f"hl-{mode}-decode",
               logdir / f"{mode}-decode.log", extra)
    return p, d

