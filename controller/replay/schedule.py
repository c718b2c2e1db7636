"""Which requests of a trace a run sends, and when.

``--start-s S`` skips to S seconds into the trace and ``--limit N`` keeps the first N requests
from there. A request at trace time ``t`` is sent ``(t - S) * time_scale / rate_scale``
seconds after the run starts: ``time_scale`` stretches (> 1) or compresses (< 1) the trace's
gaps, ``rate_scale`` multiplies its request rate; the two multiply, so ``time_scale 0.5`` and
``rate_scale 2`` give the same schedule. Open loop: a request is due at its time whether
earlier ones have finished or not.
"""

from __future__ import annotations

from dataclasses import dataclass

from controller.replay.trace import Trace, TraceRequest


@dataclass(frozen=True, slots=True)
class Slice:
    start_s: float
    limit: int | None
    time_scale: float = 1.0
    rate_scale: float = 1.0

    def __post_init__(self) -> None:
        if self.start_s < 0:
            raise ValueError(f"start must be at least 0 s, got {self.start_s}")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit must be at least 1, got {self.limit}")
        if not (self.time_scale > 0 and self.rate_scale > 0):
            raise ValueError("time scale and rate scale must be positive")

    @property
    def factor(self) -> float:
        """Wall seconds per trace second."""
        return self.time_scale / self.rate_scale

    def wall_s(self, trace_s: float) -> float:
        """When a request at trace time ``trace_s`` is due, in seconds from the run's start."""
        return max(0.0, (trace_s - self.start_s) * self.factor)

    def trace_s(self, wall_s: float) -> float:
        """The trace time a run has reached after ``wall_s`` seconds."""
        return self.start_s + wall_s / self.factor


def select(trace: Trace, sl: Slice) -> list[TraceRequest]:
    """The requests of the slice, in time order."""
    picked = [r for r in trace.requests if r.time_s >= sl.start_s]
    return picked if sl.limit is None else picked[:sl.limit]


def due_times(requests: list[TraceRequest], sl: Slice) -> list[float]:
    """Each request's send time in seconds from the run's start."""
    return [sl.wall_s(r.time_s) for r in requests]
