"""Real processes for integration tests: a ``pdctl controller`` with simulated engines (started
and stopped by ``bench.fleet``, as the benchmarks start theirs), the tests' controller config,
and a load generator that counts every client-visible failure."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench import fleet
from bench.fleet import ControllerProc, free_port

__all__ = ["LONG_PROMPT", "SHORT_PROMPT", "ControllerProc", "Load", "LoadResult", "base_config",
           "engine_metric", "free_port", "pdctl_fault", "sim_engine", "start_controller",
           "wait_healthy"]

LONG_PROMPT = "the quick brown fox jumps over the lazy dog " * 60  # ~660 tokens: disaggregated
SHORT_PROMPT = "hello there"  # colocated


# ``make test-workers`` runs the integration tests whose controller has this many data-plane
# processes (``controller.data_workers``); unset: 1, whatever the machine's cores.
DATA_WORKERS = int(os.environ.get("PDCTL_TEST_DATA_WORKERS", "1") or 1)


def base_config(state_dir: Path, port: int, **extra: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "backend": "sim",
        "sim": {"time_scale": 0.2, "startup_delay_s": 0.3},
        "routing": {"disagg_min_prompt_tokens": 256},
        "controller": {"port": port, "state_dir": str(state_dir), "tick_s": 0.2,
                       "health_interval_s": 0.5, "metrics_poll_s": 0.5,
                       "drain_timeout_s": 30},
    }
    cfg["controller"]["data_workers"] = DATA_WORKERS
    for key, value in extra.items():
        cfg[key] = {**cfg.get(key, {}), **value} if isinstance(value, dict) else value
    return cfg


def start_controller(tmp: Path, config: dict[str, Any] | None = None,
                     wait_ready: bool = True) -> ControllerProc:
    """A ``pdctl controller`` on ``base_config`` + ``config``: ``tmp/pdctl.yaml``, state in
    ``tmp/state``, log ``tmp/controller.log``; up (and its pools converged with
    ``wait_ready``). Stop it with ``ControllerProc.stop``."""
    cfg = base_config(tmp / "state", free_port(), **(config or {}))
    return fleet.start_controller(tmp, cfg, config_file="pdctl.yaml",
                                  wait="converged" if wait_ready else "up")


def sim_engine(port: int, role: str, served: str | None = None, time_scale: float = 0.1
               ) -> subprocess.Popen[bytes]:
    """A simulated engine process started outside any controller (for the ``external``
    backend), in its own process group."""
    named = ["--served-model-name", served] if served else []
    return subprocess.Popen(
        [sys.executable, "-m", "controller.engines.sim", "--port", str(port), "--role", role,
         "--tp", "2", "--time-scale", str(time_scale), *named], stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True)


def wait_healthy(url: str, timeout_s: float = 60.0, path: str = "/health",
                 proc: subprocess.Popen[bytes] | None = None, log: Path | None = None) -> None:
    """Until ``GET url + path`` answers 200 (an engine's ``/health``, Streamlit's
    ``/_stcore/health``). Fails after ``timeout_s``, or at once when ``proc`` has exited;
    either failure shows ``log``'s text."""
    def told(what: str) -> str:
        return f"{url} {what}" + (f":\n{log.read_text(errors='replace')}" if log else "")

    deadline = time.monotonic() + timeout_s
    while True:
        assert proc is None or proc.poll() is None, told("exited")
        try:
            if httpx.get(f"{url}{path}", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, told("did not come up")
        time.sleep(0.1)


def engine_metric(url: str, name: str) -> float:
    """``name`` on an engine's /metrics page, summed over its label sets."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))


@dataclass
class LoadResult:
    ok: int = 0
    failures: list[str] = field(default_factory=list)
    by_path: dict[str, int] = field(default_factory=dict)


class Load:
    """Closed-loop client load in a background thread: ``workers`` concurrent clients, mixed
    long/short prompts, streaming and not. Every non-200, error event or missing [DONE] is a
    failure with its reason. ``paused()`` holds it still for a check that must see the
    cluster without its traffic."""

    def __init__(self, url: str, workers: int = 6, max_tokens: int = 8,
                 model: str = "llama-3-70b", extra: dict[str, Any] | None = None,
                 timeout_s: float = 60.0, pause_s: float = 0.0,
                 streaming: bool | None = None, long_only: bool = False) -> None:
        """``streaming``: None alternates streaming and not; ``long_only``: every prompt
        long enough to go disaggregated."""
        self.url, self.workers, self.max_tokens = url, workers, max_tokens
        self.streaming, self.long_only = streaming, long_only
        self.model, self.extra = model, extra or {}
        self.timeout_s, self.pause_s = timeout_s, pause_s
        self.result = LoadResult()
        self._stop = threading.Event()
        self._go = threading.Event()
        self._go.set()
        self._inflight = 0
        self._since: dict[int, float] = {}  # worker -> when its request in flight was sent
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @contextmanager
    def paused(self, timeout_s: float = 300.0) -> Iterator[None]:
        """No new request is sent inside the block, which starts once those in flight ended."""
        self._go.clear()
        try:
            deadline = time.monotonic() + timeout_s
            while self._inflight and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not self._inflight, f"{self._inflight} load requests still in flight"
            yield
        finally:
            self._go.set()

    def oldest_s(self) -> float:
        """How long the oldest request in flight has been waiting (0: none in flight)."""
        now = time.monotonic()
        return max((now - t for t in list(self._since.values())), default=0.0)

    def stop(self) -> LoadResult:
        self._stop.set()
        self._go.set()
        self._thread.join(timeout=60)
        return self.result

    async def _main(self) -> None:
        async with httpx.AsyncClient(timeout=self.timeout_s) as client:
            await asyncio.gather(*(self._worker(client, w) for w in range(self.workers)))

    async def _worker(self, client: httpx.AsyncClient, w: int) -> None:
        n = 0
        while not self._stop.is_set():
            self._inflight += 1  # before the check: paused() waits for it or it waits
            if not self._go.is_set():
                self._inflight -= 1
                await asyncio.sleep(0.05)
                continue
            n += 1
            stream = (n + w) % 2 == 0 if self.streaming is None else self.streaming
            prompt = LONG_PROMPT if self.long_only or (n + w) % 3 else SHORT_PROMPT
            body = {"model": self.model, "prompt": f"{w}-{n} {prompt}",
                    "max_tokens": self.max_tokens, "stream": stream, **self.extra}
            self._since[w] = time.monotonic()
            try:
                reason = await self._one(client, body)
            except httpx.HTTPError as exc:
                reason = f"{type(exc).__name__}: {exc}"
            finally:
                self._inflight -= 1
                del self._since[w]
            if reason:
                self.result.failures.append(reason)
            else:
                self.result.ok += 1
            if self.pause_s:
                await asyncio.sleep(self.pause_s)

    async def _one(self, client: httpx.AsyncClient, body: dict[str, Any]) -> str | None:
        url = f"{self.url}/v1/completions"
        if not body["stream"]:
            r = await client.post(url, json=body)
            if r.status_code != 200:
                return f"{r.status_code}: {r.text[:200]}"
            n = r.json()["usage"]["completion_tokens"]
            return None if n == body["max_tokens"] else f"{n} tokens"
        async with client.stream("POST", url, json=body) as r:
            if r.status_code != 200:
                return f"{r.status_code}: {(await r.aread())[:200]!r}"
            text = (await r.aread()).decode()
        if '"error"' in text:
            return f"error event: {text[-300:]}"
        return None if text.rstrip().endswith("data: [DONE]") else f"no [DONE]: {text[-200:]}"


def pdctl_fault(url: str, state_dir: Path, scenario: str, *extra: str
                ) -> tuple[int, dict[str, Any], str]:
    """``pdctl fault SCENARIO --json`` against ``url`` as an operator runs it: its exit
    status, its report (empty when it printed none) and its stderr."""
    out = subprocess.run(
        [sys.executable, "-m", "controller.cli", "fault", scenario, "--controller", url,
         "--state-dir", str(state_dir), "--json", *extra],
        capture_output=True, text=True, timeout=600)
    report = json.loads(out.stdout) if out.stdout.startswith("{") else {}
    return out.returncode, report, out.stderr
