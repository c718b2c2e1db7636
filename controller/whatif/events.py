"""The event queue of a discrete-event run: callbacks at modelled times, in time order (ties in
the order they were scheduled)."""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable
from typing import Any


class EventQueue:
    __slots__ = ("now", "_heap", "_seq", "handled")

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = itertools.count()
        self.handled = 0

    def at(self, when: float, fn: Callable[..., None], *args: Any) -> None:
        """Call ``fn(*args)`` at modelled time ``when`` (never before now)."""
        heapq.heappush(self._heap, (max(when, self.now), next(self._seq), fn, args))

    def clock(self) -> float:
        return self.now

    def run(self, until: float = math.inf) -> None:
        """Handle events up to ``until`` (all of them by default)."""
        heap, pop = self._heap, heapq.heappop
        while heap and heap[0][0] <= until:
            when, _, fn, args = pop(heap)
            self.now = when
            self.handled += 1
            fn(*args)
        if until != math.inf:
            self.now = max(self.now, until)

    @property
    def pending(self) -> int:
        return len(self._heap)
