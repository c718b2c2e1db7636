"""Simulated engines hosted by a few processes (``sim.processes``), each engine on its port.

``python -m controller.engines.sim.host`` processes are started on first use, up to
``sim.processes``; a new engine goes to the host with the fewest running. Every engine keeps
its own port, API, metrics and log file, so the rest of the controller cannot tell it from an
engine of its own process. A host process that ends takes its engines with it: each reports
the host's exit as its reason.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from subprocess import Popen
from typing import Any

import httpx

from controller.config import Settings
from controller.errors import LaunchError
from controller.launchers.base import EventPorts, Launched, Launcher, LaunchSpec, exit_reason
from controller.launchers.process import free_port, free_ports, spawn, stop_group, tail
from controller.launchers.sim import SimEngineKind

HOST_START_TIMEOUT_S = 30.0
CONTROL_TIMEOUT_S = 30.0
HOST_PORT_TRIES = 3  # a host whose port was taken before it bound it starts again


@dataclass
class _Host:
    index: int
    proc: Popen[bytes]
    url: str
    log: Path
    engines: set[str] = field(default_factory=set)
    states: dict[str, dict[str, Any]] = field(default_factory=dict)  # last GET /host/engines

    def ended(self) -> str | None:
        code = self.proc.poll()
        return None if code is None else (
            f"its sim host process (pid {self.proc.pid}) ended: {exit_reason(code)}; "
            f"see {self.log}")


class SimHostLauncher(Launcher):
    """Simulated engines on ``sim.processes`` shared host processes."""

    name = "sim"

    def __init__(self, settings: Settings) -> None:
        self.engine = SimEngineKind(settings)
        self.processes = settings.sim.processes
        self._hosts: list[_Host] = []
        self._http = httpx.AsyncClient(timeout=CONTROL_TIMEOUT_S)
        self._lock = asyncio.Lock()

    async def _host_for(self, log_dir: Path, instance_id: str) -> _Host:
        """The live host with the fewest engines, starting one while fewer than asked run;
        ``instance_id`` counts on it from now (engines starting together spread evenly)."""
        async with self._lock:
            self._hosts = [h for h in self._hosts if h.proc.poll() is None]
            if len(self._hosts) < self.processes:
                self._hosts.append(await self._start_host(log_dir))
            host = min(self._hosts, key=lambda h: len(h.engines))
            host.engines.add(instance_id)
            return host

    async def _start_host(self, log_dir: Path) -> _Host:
        """A new host process; started again on another port when its first one was taken
        meanwhile (the port is free when chosen, not reserved)."""
        for attempt in range(HOST_PORT_TRIES):
            try:
                return await self._start_host_once(log_dir)
            except PortTaken as exc:
                if attempt + 1 == HOST_PORT_TRIES:
                    raise LaunchError(str(exc)) from None
        raise AssertionError("unreachable")

    async def _start_host_once(self, log_dir: Path) -> _Host:
        index = max((h.index for h in self._hosts), default=-1) + 1
        port = free_port()
        log = log_dir / f"sim-host-{index}.log"
        proc = spawn([sys.executable, "-m", "controller.engines.sim.host", "--port", str(port)],
                     log)
        host = _Host(index, proc, f"http://127.0.0.1:{port}", log)
        deadline = time.monotonic() + HOST_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                why = (f"sim host process {index} exited while starting: "
                       f"{exit_reason(proc.returncode)}; see {log}")
                if "address already in use" in tail(log, 5):
                    raise PortTaken(why)
                raise LaunchError(why)
            try:
                if (await self._http.get(f"{host.url}/health", timeout=1.0)).status_code == 200:
                    return host
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.1)
        await stop_group(proc, 2.0)
        raise LaunchError(f"sim host process {index} did not answer within "
                          f"{HOST_START_TIMEOUT_S:g} s; see {log}")

    async def start(self, spec: LaunchSpec) -> Launched:
        host = await self._host_for(spec.log_path.parent, spec.instance_id)
        try:
            return await self._start_on(host, spec)
        except BaseException:
            host.engines.discard(spec.instance_id)
            raise

    async def _start_on(self, host: _Host, spec: LaunchSpec) -> Launched:
        port, publish, replay = free_ports("127.0.0.1", 3)
        events = EventPorts(publish, replay)
        # The flags, without `python -m <module>`.
        args = self.engine.argv(spec, port)[3:] + events.flags()
        try:
            resp = await self._http.post(f"{host.url}/host/engines",
                                         json={"args": args, "log_path": str(spec.log_path)})
        except httpx.HTTPError as exc:
            raise LaunchError(f"sim host {host.index} unreachable: "
                              f"{type(exc).__name__}: {exc}") from exc
        if resp.status_code != 201:
            raise LaunchError(f"sim host {host.index} refused the engine: {_message(resp)}")
        host.states[spec.instance_id] = resp.json()
        return Launched(url=resp.json()["url"],
                        handle={"host": host, "engine_id": spec.instance_id,
                                "log": spec.log_path},
                        kv_events=events.endpoints("127.0.0.1"),
                        kv_peer=self.engine.kv_peer(spec, "127.0.0.1", port, port))

    async def stop(self, launched: Launched, grace_s: float = 5.0) -> None:
        host: _Host = launched.handle["host"]
        engine_id: str = launched.handle["engine_id"]
        if host.proc.poll() is None:
            try:
                await self._http.delete(f"{host.url}/host/engines/{engine_id}",
                                        params={"grace_s": grace_s},
                                        timeout=grace_s + CONTROL_TIMEOUT_S)
            except httpx.HTTPError:
                pass  # a host that cannot answer is stopped with the launcher
        host.engines.discard(engine_id)
        host.states.pop(engine_id, None)

    async def refresh(self, launched: Sequence[Launched]) -> None:
        hosts = {id(h): h for h in (x.handle["host"] for x in launched)
                 if h.proc.poll() is None}

        async def one(h: _Host) -> None:
            try:
                data = (await self._http.get(f"{h.url}/host/engines", timeout=5.0)).json()
            except (httpx.HTTPError, ValueError):
                return  # a host too busy to answer keeps its last known states
            h.states = {e["engine_id"]: e for e in data.get("engines", [])}

        await asyncio.gather(*(one(h) for h in hosts.values()))

    def exit_reason(self, launched: Launched) -> str | None:
        host: _Host = launched.handle["host"]
        ended = host.ended()
        if ended is not None:
            return ended
        state = host.states.get(launched.handle["engine_id"])
        if state is not None and state.get("state") == "exited":
            return str(state.get("exit_reason") or "engine server ended")
        return None

    def exit_code(self, launched: Launched) -> int | None:
        host: _Host = launched.handle["host"]
        code = host.proc.poll()
        if code is not None:
            return code
        return 1 if self.exit_reason(launched) is not None else None

    async def log_tail(self, launched: Launched, lines: int = 100) -> str:
        return tail(launched.handle["log"], lines)

    async def close(self) -> None:
        await asyncio.gather(*(stop_group(h.proc, 10.0) for h in self._hosts))
        self._hosts.clear()
        await self._http.aclose()


class PortTaken(Exception):
    """A host process could not bind the port chosen for it."""


def _message(resp: httpx.Response) -> str:
    try:
        return str(resp.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return f"HTTP {resp.status_code}"
