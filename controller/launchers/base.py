"""The launcher interface: start an instance, stop it, tell whether it is still alive.

Which engine runs (``EngineKind``: simulated or vLLM, as a command line) and where it runs
(``Launcher``: local processes, Ray actors, external URLs) are independent: a launcher that
runs processes takes the engine kind's ``Command`` and runs it wherever it places instances.
"""

from __future__ import annotations

import abc
import contextlib
import json
import signal
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controller.kvevents.subscriber import engine_kv_events_config
from controller.models import PoolTarget, Role


@dataclass(frozen=True)
class LaunchSpec:
    instance_id: str
    role: Role
    tp: int
    accelerators: tuple[int, ...]
    log_path: Path
    kv_mode: str = "pull"  # "pull": NixlConnector, "push": NixlPushConnector


@dataclass
class Launched:
    url: str
    handle: Any = None
    node: str | None = None  # where it runs: the Ray node's IP; None for local processes
    # Where the controller subscribes to the engine's KV events: (publisher, replay)
    # endpoints; None when the engine publishes none (attached external engines).
    kv_events: tuple[str, str] | None = None
    # The engine's NIXL identity, which a push-mode decode hop names (``EngineKind.kv_peer``):
    # {"engine_id", "host", "port", "tp_size"}; None where unknown (attached external engines).
    kv_peer: dict[str, Any] | None = None


@dataclass(frozen=True)
class EventPorts:
    """The two ports an engine's KV-event publisher binds: batches, and replays."""

    publish: int
    replay: int

    def endpoints(self, host: str) -> tuple[str, str]:
        return f"tcp://{host}:{self.publish}", f"tcp://{host}:{self.replay}"

    def flags(self) -> list[str]:
        """vLLM's flags (the simulated engine takes the same): publish KV events on these
        ports, and report each request's cached prompt tokens in its usage."""
        config = engine_kv_events_config(self.publish, self.replay)
        return ["--kv-events-config", json.dumps(config), "--enable-prompt-tokens-details"]


@dataclass(frozen=True)
class Command:
    """One engine's command line, as an engine kind builds it for a host and ports."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    nice: int = 0


class EngineKind(abc.ABC):
    """Builds the command line of one engine instance. Picklable: a Ray actor builds the
    command on the node it runs on, with that node's address and free ports."""

    name: str = "engine"

    @abc.abstractmethod
    def command(self, spec: LaunchSpec, host: str, port: int, side_port: int,
                devices: Sequence[str] | None = None, events: EventPorts | None = None
                ) -> Command:
        """The engine serving HTTP on ``host:port`` (and NIXL's side channel on
        ``host:side_port`` where it has one); ``devices``: the accelerators it may use where
        the placer chose them (Ray's GPU ids), else None (``spec.accelerators``);
        ``events``: where it publishes its KV events (None: it publishes none)."""

    def kv_peer(self, spec: LaunchSpec, host: str, port: int, side_port: int
                ) -> dict[str, Any] | None:
        """The NIXL identity of the engine ``command`` starts on ``host`` (HTTP ``port``,
        side channel ``side_port``), as a push-mode decode hop names its prefill engine:
        ``{"engine_id", "host", "port", "tp_size"}``; None where the kind has none."""
        return None


class Launcher(abc.ABC):
    """Starts and stops instances. ``managed`` launchers may be scaled by the controller."""

    name: str = "base"
    managed: bool = True
    # True where an instance whose engine ended still holds something that ``stop`` frees
    # (a Ray actor and its placement group).
    stop_after_exit: bool = False

    @abc.abstractmethod
    async def start(self, spec: LaunchSpec) -> Launched:
        """Begin starting an instance; readiness is checked by the caller. Raises
        ``LaunchError``; a cancelled start leaves nothing behind."""

    @abc.abstractmethod
    async def stop(self, launched: Launched, grace_s: float = 5.0) -> None:
        """Stop the instance and everything it spawned."""

    async def refresh(self, launched: Sequence[Launched]) -> None:  # noqa: B027 - optional
        """Bring what ``exit_code`` and ``exit_reason`` report up to date (remote engines)."""

    def exit_code(self, launched: Launched) -> int | None:
        """The exit status if the instance's process has ended, else None."""
        return None

    def exit_reason(self, launched: Launched) -> str | None:
        """Why the instance's engine is no longer running, or None while it runs."""
        code = self.exit_code(launched)
        return None if code is None else exit_reason(code)

    def capacity(self) -> tuple[int, int] | None:
        """``(accelerators per node, nodes)`` where the launcher knows them (a Ray cluster);
        None: the configured hardware's."""
        return None

    def room_problem(self, targets: dict[Role, PoolTarget]) -> str | None:
        """Why the cluster cannot place these pools, beyond their accelerators (which
        ``sizing.fit`` checks), or None: a Ray cluster's CPUs."""
        return None

    async def reattach(self) -> dict[str, Launched]:
        """Engines a previous controller run left running that this launcher can find by
        instance id (Ray's named actors); local processes are handled by their pids."""
        return {}

    async def log_tail(self, launched: Launched, lines: int = 100) -> str:
        return ""

    async def close(self) -> None:  # noqa: B027 - optional hook, nothing to do by default
        """Stop everything this launcher started."""


def exit_reason(code: int) -> str:
    """``process exited with status -4 (SIGILL)``: a signal's name where there is one."""
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"process exited with status {code} ({signal.Signals(-code).name})"
    return f"process exited with status {code}"
