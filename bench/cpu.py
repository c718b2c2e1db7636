"""CPU time: of a process and its children, of a set of processes, and of the whole machine.

CPU seconds per request hold up on a noisy, shared machine where latency and rate do not,
so the benchmarks read them around every measurement.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass

import psutil


def process_seconds(p: psutil.Process) -> float:
    """User + system CPU seconds of one process (0.0 once it is gone)."""
    with contextlib.suppress(psutil.Error):
        t = p.cpu_times()
        return float(t.user + t.system)
    return 0.0


def tree_seconds(p: psutil.Process) -> float:
    """User + system CPU seconds of a process and its live descendants."""
    total = process_seconds(p)
    with contextlib.suppress(psutil.Error):
        for ch in p.children(recursive=True):
            total += process_seconds(ch)
    return total


def pids_seconds(pids: Iterable[int]) -> float:
    """User + system CPU seconds of the live processes among ``pids``."""
    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            total += process_seconds(psutil.Process(pid))
    return total


def self_seconds() -> float:
    """This process's CPU seconds (all threads)."""
    return process_seconds(psutil.Process())


@dataclass(frozen=True)
class MachineTimes:
    """The whole machine's CPU seconds since boot, summed over cores."""

    user: float  # user + nice
    system: float  # system + irq + softirq
    idle: float  # idle + iowait

    @property
    def busy(self) -> float:
        return self.user + self.system

    def since(self, before: MachineTimes) -> MachineTimes:
        return MachineTimes(self.user - before.user, self.system - before.system,
                            self.idle - before.idle)

    def shares(self) -> dict[str, float]:
        """Percent of user, system and idle time (of a ``since`` interval)."""
        total = (self.user + self.system + self.idle) or 1.0
        return {"user_pct": 100 * self.user / total, "system_pct": 100 * self.system / total,
                "idle_pct": 100 * self.idle / total}


def machine_times() -> MachineTimes:
    """The whole machine's CPU seconds now."""
    t = psutil.cpu_times()
    return MachineTimes(t.user + getattr(t, "nice", 0.0),
                        t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0),
                        t.idle + getattr(t, "iowait", 0.0))
