"""The launcher interface: start an instance, stop it, tell whether it is still alive."""

from __future__ import annotations

import abc
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controller.models import Role


@dataclass(frozen=True)
class LaunchSpec:
    instance_id: str
    role: Role
    tp: int
    accelerators: tuple[int, ...]
    log_path: Path


@dataclass
class Launched:
    url: str
    handle: Any = None


class Launcher(abc.ABC):
    """Starts and stops instances. ``managed`` launchers may be scaled by the controller."""

    name: str = "base"
    managed: bool = True

    @abc.abstractmethod
    async def start(self, spec: LaunchSpec) -> Launched:
        """Begin starting an instance; readiness is checked by the caller."""

    @abc.abstractmethod
    async def stop(self, launched: Launched, grace_s: float = 5.0) -> None:
        """Stop the instance and everything it spawned."""

    def exit_code(self, launched: Launched) -> int | None:
        """The exit status if the instance's process has ended, else None."""
        return None

    def log_tail(self, launched: Launched, lines: int = 100) -> str:
        return ""

    async def close(self) -> None:  # noqa: B027 - optional hook, nothing to do by default
        """Stop everything this launcher started."""
