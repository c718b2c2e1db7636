"""The brain's supervisor of its router workers: starts ``data_workers - 1`` worker
processes on the controller's address, replaces one that ends while the controller runs
(each exit an audit event, ``worker.exit``, with the requests it took down), and stops them
all when the controller stops -- at the start of its shutdown, so that every process lets
its requests in flight finish within the same grace."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from controller.config import Settings
from controller.metrics import Samples
from controller.store import Store
from controller.workers.hub import WorkerHub
from controller.workers.worker import SETTINGS_ENV

log = logging.getLogger("pdctl.workers")

CHECK_S = 0.2  # how often the workers' processes are looked at
RESTART_BACKOFF_MAX_S = 30.0  # the longest wait before replacing a worker that keeps dying
STABLE_S = 10.0  # a worker up this long resets its backoff
# A worker sends its metric samples every second whatever else it does (``worker.METRICS_S``):
# one silent this long is hung (its event loop stuck, or the process stopped) and is killed,
# so that its clients' connections end and it is replaced; one not connected this long after
# its start, likewise.
HUNG_S = 10.0
CONNECT_S = 60.0


def _die_with_parent() -> None:
    """In the worker, before exec: SIGTERM when the controller process dies (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class WorkerPool:
    def __init__(self, settings: Settings, port: int, hub: WorkerHub, store: Store,
                 log_level: str = "info", log_format: str = "text") -> None:
        self.settings, self.port, self.hub, self.store = settings, port, hub, store
        self.count = settings.controller.data_processes - 1
        self.rundir = Path(tempfile.mkdtemp(prefix="pdctl-"))  # short: a Unix socket's path
        self._log = (log_level, log_format)
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        self._started: dict[int, float] = {}
        self._backoff: dict[int, float] = {}
        self._due: dict[int, float] = {}
        self._killed: dict[int, str] = {}  # why the pool killed a worker, for its exit event
        self.stopping = False
        self._watch: asyncio.Task[None] | None = None
        self._env = {**os.environ, SETTINGS_ENV: orjson.dumps(
            settings.model_dump(mode="json")).decode()}  # a worker's settings: the brain's

    def control_socket(self) -> socket.socket:
        """The brain's control socket, which the workers relay every other path to."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        path = self.rundir / "control.sock"
        sock.bind(str(path))
        path.chmod(0o600)
        sock.listen(256)
        sock.setblocking(False)
        return sock

    async def start(self) -> None:
        await self.hub.start(self.rundir / "workers.sock")
        for i in range(1, self.count + 1):
            self._spawn(i)
        self._watch = asyncio.create_task(self._run())

    def _spawn(self, index: int) -> None:
        level, fmt = self._log
        proc = subprocess.Popen(
            [sys.executable, "-m", "controller.workers.worker", "--index", str(index),
             "--rundir", str(self.rundir), "--port", str(self.port), "--log-level", level,
             "--log-format", fmt], env=self._env, stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent)  # noqa: PLW1509 - no threads start it
        self._procs[index] = proc
        self._started[index] = time.monotonic()
        log.info("router worker %d started (pid %d)", index, proc.pid)

    async def _run(self) -> None:
        while not self.stopping:
            await asyncio.sleep(CHECK_S)
            now = time.monotonic()
            for index, proc in list(self._procs.items()):
                if self.stopping:
                    return
                if index in self._due:
                    if now >= self._due[index]:
                        del self._due[index]
                        self._spawn(index)
                    continue
                code = proc.poll()
                if code is None:
                    self._check(index, proc, now)
                    continue
                self._exited(index, proc, code, now)

    def _check(self, index: int, proc: subprocess.Popen[bytes], now: float) -> None:
        """Kill a running worker that is hung: silent ``HUNG_S`` on its channel, or not
        connected ``CONNECT_S`` after its start (``_exited`` then replaces it)."""
        if index in self._killed:
            return
        link = self.hub.links.get(index)
        if link is not None and link.pid == proc.pid:
            if now - link.heard < HUNG_S:
                return
            why = f"silent for {now - link.heard:.0f} s on its channel (hung): killed"
        elif now - self._started[index] >= CONNECT_S:
            why = f"not connected {CONNECT_S:.0f} s after its start: killed"
        else:
            return
        log.error("router worker %d (pid %d) %s", index, proc.pid, why)
        self._killed[index] = why
        with contextlib.suppress(ProcessLookupError):
            proc.kill()

    def _exited(self, index: int, proc: subprocess.Popen[bytes], code: int, now: float) -> None:
        link = self.hub.links.get(index)
        lost = link.unfinished if link is not None else self.hub.last_lost.pop(index, 0)
        why = self._killed.pop(index, None) or (
            f"killed by signal {-code}" if code < 0 else f"exit status {code}")
        up = now - self._started[index]
        backoff = 0.0 if up >= STABLE_S else min(RESTART_BACKOFF_MAX_S,
                                                  max(0.5, self._backoff.get(index, 0.0) * 2))
        self._backoff[index] = backoff
        self._due[index] = now + backoff
        log.error("router worker %d (pid %d) ended: %s; replacing it%s", index, proc.pid, why,
                  f" in {backoff:.1f} s" if backoff else "")
        self.store.record("controller", "worker.exit", f"router-worker-{index}", None,
                          {"pid": proc.pid, "reason": why, "requests_in_flight": lost},
                          f"router worker {index} (pid {proc.pid}) ended ({why}) with "
                          f"{lost} request(s) in flight; replaced")

    def terminate(self) -> None:
        """The controller is stopping: every worker is told to finish its requests and go."""
        self.stopping = True
        for proc in self._procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)

    async def stop(self, timeout_s: float) -> None:
        """After ``terminate``: wait for the workers, kill what is left, close the hub."""
        self.terminate()
        if self._watch is not None:
            self._watch.cancel()
        deadline = time.monotonic() + timeout_s
        for proc in self._procs.values():
            while proc.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            if proc.poll() is None:
                log.error("router worker (pid %d) did not stop within %.0f s: killed",
                          proc.pid, timeout_s)
                proc.kill()
                proc.wait()
        # What the workers sent last (their final records) is read before the hub closes.
        deadline = time.monotonic() + 2.0
        while self.hub.links and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        await self.hub.close()
        shutil.rmtree(self.rundir, ignore_errors=True)

    # ---- as the API sees them (``api.state.DataWorkers``) ---------------------------

    async def sync(self) -> None:
        await self.hub.sync()

    def samples(self) -> Samples:
        return self.hub.samples()

    def public(self) -> list[dict[str, Any]]:
        return self.hub.public()
