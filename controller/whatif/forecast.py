"""What a pool change will do, before it is made: the recent traffic played in the
discrete-event fleet on the pools as they are and as proposed (each once its instances all
serve: the layout after the change has converged), its TTFT parts, gap tail and share within
the TTFT target for each, and the accelerator-hours each holds for that traffic's span; then,
once the change has converged, the same figures measured on the requests the controller
served since, beside the prediction.

Pure functions of their inputs (recorded requests, layouts, the run's model); tests assert
their values from small traces.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from controller.replay.summary import rounded_quantiles
from controller.replay.trace import TraceRequest
from controller.whatif.layout import Layout
from controller.whatif.run import RunSpec, simulate

# What is predicted and measured: TTFT and its four parts, and the inter-token gap tail
# (each request's p99 gap), in modelled milliseconds.
PREDICTED_FIGURES = ("ttft", "queue", "prefill", "transfer", "decode_sched", "gap_p99")


class HasFigures(Protocol):
    """One request's figures: a controller's record or a discrete-event one."""

    @property
    def ttft_ms(self) -> float: ...

    @property
    def queue_ms(self) -> float: ...

    @property
    def prefill_ms(self) -> float: ...

    @property
    def transfer_ms(self) -> float: ...

    @property
    def decode_sched_ms(self) -> float: ...

    @property
    def gap_p99_ms(self) -> float: ...


@dataclass(frozen=True)
class Figures:
    """p50 and p90 of each of ``PREDICTED_FIGURES`` over ``requests``, and the share within
    the TTFT target."""

    requests: int
    within: float | None
    p50: dict[str, float | None]
    p90: dict[str, float | None]

    def public(self) -> dict[str, Any]:
        return {"requests": self.requests, "within_ttft": self.within,
                "p50_ms": self.p50, "p90_ms": self.p90}


def figures(served: Sequence[HasFigures], ttft_ms: float, time_scale: float = 1.0) -> Figures:
    """``served``'s figures, its milliseconds divided by ``time_scale`` (a simulated fleet's
    wall milliseconds per modelled one); a request with no first token is outside the
    target."""
    p50: dict[str, float | None] = {}
    p90: dict[str, float | None] = {}
    first = [r for r in served if r.ttft_ms > 0]  # a failed request has no parts
    for name in PREDICTED_FIGURES:
        values = [float(getattr(r, f"{name}_ms")) / time_scale for r in first]
        p50[name], p90[name] = rounded_quantiles(values, (0.5, 0.9))
    within = (sum(1 for r in first if r.ttft_ms / time_scale <= ttft_ms) / len(served)
              if served else None)
    return Figures(len(served), within, p50, p90)


@dataclass(frozen=True)
class Forecast:
    current: Layout
    proposed: Layout
    requests: int  # recent requests played
    span_s: float  # modelled seconds from their first arrival to their last
    ttft_target_ms: float
    before: Figures  # on the current layout
    after: Figures  # on the proposed one
    wall_s: float  # what the two runs took

    @property
    def hours(self) -> float:
        return self.span_s / 3600

    def public(self) -> dict[str, Any]:
        return {"current": self.current.as_dict(), "proposed": self.proposed.as_dict(),
                "current_label": self.current.label, "proposed_label": self.proposed.label,
                "requests": self.requests, "span_s": round(self.span_s, 3),
                "ttft_target_ms": self.ttft_target_ms,
                "before": self.before.public(), "after": self.after.public(),
                "accelerator_hours": {
                    "current": round(self.current.accelerators * self.hours, 4),
                    "proposed": round(self.proposed.accelerators * self.hours, 4)},
                "wall_s": round(self.wall_s, 3)}


def forecast(recent: list[TraceRequest], current: Layout, proposed: Layout,
             spec: RunSpec) -> Forecast:
    """``recent`` (non-empty) on ``current`` and on ``proposed``, each from its first
    arrival with every instance serving."""
    if not recent:
        raise ValueError("no recent requests to play")
    ttft = spec.targets.ttft_ms
    now, then = simulate(recent, current, spec), simulate(recent, proposed, spec)
    span = (recent[-1].time_s - recent[0].time_s) / spec.rate_scale
    return Forecast(current, proposed, len(recent), span, ttft,
                    figures(now.served.records, ttft), figures(then.served.records, ttft),
                    now.wall_s + then.wall_s)


@dataclass(frozen=True)
class Comparison:
    """One figure predicted and measured (modelled ms), and the error of the prediction."""

    figure: str
    quantile: str
    predicted: float | None
    measured: float | None

    @property
    def error(self) -> float | None:
        """(predicted - measured) / measured; None when either is missing or measured is 0."""
        if self.predicted is None or not self.measured:
            return None
        return (self.predicted - self.measured) / self.measured


def side_by_side(predicted: Figures, measured: Figures) -> list[Comparison]:
    return [Comparison(name, q, getattr(predicted, q)[name], getattr(measured, q)[name])
            for name in PREDICTED_FIGURES for q in ("p50", "p90")]


def since(records: Iterable[Any], start: float, end: float) -> list[Any]:
    """The records of requests the controller received in ``[start, end)`` (unix s), refused
    ones left out."""
    return [r for r in records if start <= r.started_at < end and r.status != "rejected"]


MIN_MEASURED = 20  # requests served after convergence before the measure is shown


@dataclass(frozen=True)
class Hindsight:
    """What became of a prediction: its status (``pdctl_api.schema.whatif.WhatIfStatus``)
    and, once measured, the comparison."""

    status: str
    applied_at: float | None = None
    converged_at: float | None = None
    measured: Figures | None = None
    comparison: tuple[Comparison, ...] = ()


@dataclass(frozen=True)
class Fleetwise:
    """The fleet since a prediction was made: when pool changes were recorded after it,
    whether the pools now are the proposed ones, whether they have converged, and when
    instances became ready or ended (what convergence waited for)."""

    changes: Sequence[float]  # unix s
    matches: bool
    converged: bool
    settled: Sequence[float]  # unix s


def in_hindsight(made: Forecast, fleet: Fleetwise, records: Iterable[Any], time_scale: float,
                 min_requests: int = MIN_MEASURED) -> Hindsight:
    """The prediction against the requests received once the change converged, over as
    many wall seconds as the prediction's traffic spanned (modelled seconds x
    ``time_scale``), at least a minute."""
    if not fleet.changes:
        return Hindsight("proposed")
    applied = max(fleet.changes)
    if not fleet.matches:
        return Hindsight("superseded", applied)
    if not fleet.converged:
        return Hindsight("converging", applied)
    converged = max([applied, *(t for t in fleet.settled if t >= applied)])
    end = converged + max(60.0, made.span_s * time_scale)
    served = since(records, converged, end)
    if len(served) < min_requests:
        return Hindsight("measuring", applied, converged)
    measured = figures(served, made.ttft_target_ms, time_scale)
    return Hindsight("measured", applied, converged, measured,
                   tuple(side_by_side(made.after, measured)))


@dataclass(frozen=True)
class Made:
    """A prediction the controller made, kept to be checked against what followed."""

    id: int
    at: float  # unix s
    forecast: Forecast
    notes: tuple[str, ...] = ()
