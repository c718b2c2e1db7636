"""The engines' load over time: what each poll of the engines' /metrics read (requests running
and waiting, KV cache usage), kept in a bounded ring of numpy rows so that a poll costs a
block copy and a window's read a mask, at a hundred instances polled every second for an
hour."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from controller.models import Instance, Role

HISTORY_S = 3600.0  # what the ring holds at ...
HISTORY_INSTANCES = 100  # ... this many instances polled every ``controller.metrics_poll_s``
MAX_ROWS = 2_000_000


@dataclass(frozen=True)
class LoadSamples:
    """Polls of the engines' load, one row per instance and poll, oldest first: ``inst`` holds
    each row's index into ``ids``; times are unix seconds."""

    t: np.ndarray
    inst: np.ndarray
    running: np.ndarray
    waiting: np.ndarray
    kv_usage: np.ndarray
    ids: tuple[str, ...]

    def __len__(self) -> int:
        return int(self.t.shape[0])

    @classmethod
    def of(cls, rows: Iterable[tuple[float, str, float, float, float]]) -> LoadSamples:
        """From ``(t, instance id, running, waiting, kv usage)`` rows (tests, fakes)."""
        listed = list(rows)
        ids = tuple(dict.fromkeys(r[1] for r in listed))
        code = {iid: k for k, iid in enumerate(ids)}
        col = np.array([(r[0], r[2], r[3], r[4]) for r in listed], dtype=float).reshape(-1, 4)
        return cls(col[:, 0], np.array([code[r[1]] for r in listed], dtype=np.int32),
                   col[:, 1], col[:, 2], col[:, 3], ids)


def history_rows(poll_s: float) -> int:
    """Rows for ``HISTORY_S`` of ``HISTORY_INSTANCES`` polled every ``poll_s``."""
    return max(1000, min(MAX_ROWS, math.ceil(HISTORY_S / poll_s) * HISTORY_INSTANCES))


class LoadHistory:
    """The last ``rows`` polls of every instance; and each instance's role and TP, for the
    instances it has seen (an instance replaced mid-window keeps its own rows), and its KV
    mode (``modes``)."""

    def __init__(self, rows: int, wall: Callable[[], float] = time.time) -> None:
        self._rows = rows
        self._t = np.zeros(rows)
        self._inst = np.zeros(rows, dtype=np.int32)
        self._load = np.zeros((rows, 3), dtype=np.float32)  # running, waiting, kv usage
        self.total = 0
        self.wall = wall
        self._ids: list[str] = []
        self._code: dict[str, int] = {}
        self.seen: dict[str, tuple[Role, int]] = {}  # instance id -> (role, TP)
        self.modes: dict[str, str] = {}  # instance id -> its KV mode (pull, push)

    def record(self, instances: Iterable[Instance], at: float | None = None) -> None:
        """One poll: the load each instance's engine reported (the registry applied it)."""
        rows = []
        for inst in instances:
            code = self._code.get(inst.id)
            if code is None:
                code = self._code[inst.id] = len(self._ids)
                self._ids.append(inst.id)
                self.seen[inst.id] = (inst.role, inst.tp)
                self.modes[inst.id] = inst.kv_mode
            rows.append((code, inst.running, inst.waiting, inst.kv_usage))
        if not rows:
            return
        n = min(len(rows), self._rows)
        block = np.array(rows[-n:], dtype=float)
        idx = (self.total + np.arange(n)) % self._rows
        self._t[idx] = self.wall() if at is None else at
        self._inst[idx] = block[:, 0].astype(np.int32)
        self._load[idx] = block[:, 1:]
        self.total += n

    def between(self, start: float, end: float) -> LoadSamples:
        """The polls in ``[start, end)``, oldest first."""
        held = min(self.total, self._rows)
        order = np.arange(self.total - held, self.total) % self._rows
        t = self._t[order]
        rows = order[(t >= start) & (t < end)]
        load = self._load[rows].astype(float)
        return LoadSamples(self._t[rows], self._inst[rows], load[:, 0], load[:, 1], load[:, 2],
                           tuple(self._ids))
