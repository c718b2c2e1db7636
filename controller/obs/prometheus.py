"""Prometheus beside the controller: the scrape configuration, the engine target list the
controller keeps current, and the Prometheus process ``pdctl lab`` runs.

Two jobs: ``pdctl-controller`` scrapes the controller's ``/metrics`` (a static target), and
``pdctl-engines`` scrapes every serving engine instance, discovered from
``STATE_DIR/prometheus/engines.json`` (``file_sd_configs``). Every controller keeps that file
equal to its ready and draining instances (``keep_targets``), each labelled with its
``instance`` id and ``role``; the file is replaced atomically, so Prometheus (which watches
it with inotify) never reads half of it.

Prometheus 2.x then applies a changed target set in two throttled steps: its discovery manager
hands updates to the scrape manager at most every 5 s (a fixed ticker, not configurable in
2.42), and the scrape manager reloads its targets on its own ticker, which ``argv`` shortens
from the default 5 s to ``DISCOVERY_RELOAD`` (1 s; the hidden flag
``--scrape.discovery-reload-interval``). Worst case from an instance's state change to the
changed active targets: one reconcile tick to write the file, + 5 s, + 1 s, which the default
10 s scrape interval bounds (``prometheus.scrape_interval_s``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httpx
import yaml

from controller.config import PrometheusSettings, Settings
from controller.errors import PdctlError
from controller.launchers.process import free_port, spawn, stop_group, tail
from controller.models import Instance, InstanceState
from controller.obs import alerts

if TYPE_CHECKING:
    from controller.fleet.registry import Registry

CONTROLLER_JOB = "pdctl-controller"
ENGINE_JOB = "pdctl-engines"
SD_FILE = "engines.json"
CONFIG_FILE = "prometheus.yml"
SERVING = frozenset({InstanceState.READY, InstanceState.DRAINING})
SD_REFRESH = "5s"  # re-read period, a fallback where inotify misses changes (some bind mounts)
DISCOVERY_RELOAD = "1s"  # the scrape manager's target reload ticker (Prometheus default: 5s)

TargetGroup = dict[str, Any]


class PrometheusError(PdctlError):
    """Prometheus could not be started or did not become ready; the message says why."""


def prometheus_dir(state_dir: Path) -> Path:
    return state_dir / "prometheus"


def targets_path(state_dir: Path) -> Path:
    return prometheus_dir(state_dir) / SD_FILE


# ---- engine targets (file_sd) ---------------------------------------------------------------

def target_group(inst: Instance) -> TargetGroup:
    """One file_sd group for an instance: its address, ``instance`` = id, ``role``."""
    url = urlsplit(inst.url)
    labels = {"instance": inst.id, "role": inst.role.value}
    if url.scheme == "https":
        labels["__scheme__"] = "https"
    if url.path.strip("/"):
        labels["__metrics_path__"] = url.path.rstrip("/") + "/metrics"
    return {"targets": [url.netloc], "labels": labels}


def engine_targets(instances: Iterable[Instance]) -> list[TargetGroup]:
    """The groups for the instances that serve requests (ready or draining), by id."""
    serving = sorted((i for i in instances if i.state in SERVING), key=lambda i: i.id)
    return [target_group(i) for i in serving]


def write_json_atomic(path: Path, data: Any) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class TargetsFile:
    """The engine targets file; rewritten only when the target groups change."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._written: list[TargetGroup] | None = None

    def update(self, instances: Iterable[Instance]) -> bool:
        groups = engine_targets(instances)
        if groups == self._written:
            return False
        write_json_atomic(self.path, groups)
        self._written = groups
        return True


async def keep_targets(registry: Registry, path: Path, period_s: float) -> None:
    """Rewrite ``path`` whenever the fleet's serving instances change (checked every
    ``period_s``, the reconcile tick, which is also when instances change state)."""
    targets = TargetsFile(path)
    while True:
        with contextlib.suppress(OSError):
            targets.update(registry)
        await asyncio.sleep(period_s)


def clear_targets(path: Path) -> None:
    """No engine targets (the controller stopped them all)."""
    with contextlib.suppress(OSError):
        write_json_atomic(path, [])


# ---- configuration ----------------------------------------------------------------------------

def duration(seconds: float) -> str:
    """A Prometheus duration: ``2s``, ``500ms``."""
    ms = round(seconds * 1000)
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def render_config(controller_target: str, sd_file: str, scrape_interval_s: float,
                  rules_file: str | None = None) -> dict[str, Any]:
    """The scrape configuration. The controller job honours the labels it exposes: its
    ``pdctl_instance_*`` series carry the engine instance's id as ``instance``, the same
    value the engine targets get, so controller and engine series join on it."""
    interval = duration(scrape_interval_s)
    return {
        "global": {"scrape_interval": interval, "scrape_timeout": interval,
                   "evaluation_interval": interval},
        **({"rule_files": [rules_file]} if rules_file else {}),
        "scrape_configs": [
            {"job_name": CONTROLLER_JOB, "honor_labels": True,
             "static_configs": [{"targets": [controller_target]}]},
            {"job_name": ENGINE_JOB,
             "file_sd_configs": [{"files": [sd_file], "refresh_interval": SD_REFRESH}]},
        ],
    }


def write_config(state_dir: Path, controller_target: str, scrape_interval_s: float) -> Path:
    """``STATE_DIR/prometheus/prometheus.yml`` for a controller at ``controller_target``."""
    d = prometheus_dir(state_dir).resolve()
    d.mkdir(parents=True, exist_ok=True)
    rules = d / alerts.RULES_FILE
    rules.write_text(yaml.safe_dump(alerts.rules(), sort_keys=False))
    cfg = render_config(controller_target, str(d / SD_FILE), scrape_interval_s, str(rules))
    path = d / CONFIG_FILE
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


# ---- the process --------------------------------------------------------------------------------

def unavailable(ps: PrometheusSettings) -> str | None:
    """Why ``pdctl lab`` will not start Prometheus, or None when it will."""
    if not ps.enabled:
        return "disabled (--no-prometheus or prometheus.enabled: false)"
    if shutil.which(ps.binary) is None:
        return (f"no `{ps.binary}` executable on PATH; install it (Debian: apt-get install "
                "prometheus) or set prometheus.binary")
    return None


def argv(binary: str, config: Path, data_dir: Path, listen: str, retention: str) -> list[str]:
    return [binary, f"--config.file={config}", f"--storage.tsdb.path={data_dir}",
            f"--storage.tsdb.retention.time={retention}", f"--web.listen-address={listen}",
            f"--scrape.discovery-reload-interval={DISCOVERY_RELOAD}", "--log.level=warn"]


@dataclass
class PrometheusProc:
    proc: subprocess.Popen[bytes]
    url: str
    config_path: Path
    log_path: Path

    async def stop(self) -> None:
        await stop_group(self.proc, 10.0)


def _url_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host


async def start(settings: Settings, controller_target: str, ready_timeout_s: float = 30.0
                ) -> PrometheusProc:
    """Write the configuration, start Prometheus in its own process group, and wait until it
    answers ``/-/ready``. Raises PrometheusError (with the log's tail) when it does not."""
    ps, state_dir = settings.prometheus, settings.controller.state_dir
    binary = shutil.which(ps.binary)
    if binary is None:
        raise PrometheusError(unavailable(ps) or "no prometheus binary")
    config = write_config(state_dir, controller_target, ps.scrape_interval_s)
    port = ps.port or free_port(_url_host(ps.host))
    log_path = prometheus_dir(state_dir) / "prometheus.log"
    data_dir = (prometheus_dir(state_dir) / "data").resolve()
    proc = spawn(argv(binary, config, data_dir, f"{ps.host}:{port}", ps.retention), log_path)
    running = PrometheusProc(proc, f"http://{_url_host(ps.host)}:{port}", config, log_path)
    try:
        await wait_ready(running, ready_timeout_s)
    except BaseException:
        await running.stop()
        raise
    return running


async def wait_ready(p: PrometheusProc, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(timeout=2.0) as client:
        while True:
            if p.proc.poll() is not None:
                raise PrometheusError(f"prometheus exited with status {p.proc.returncode}: "
                                      f"{tail(p.log_path, 5)}")
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get(f"{p.url}/-/ready")).status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise PrometheusError(f"prometheus not ready after {timeout_s:.0f} s; "
                                      f"log {p.log_path}")
            await asyncio.sleep(0.2)
