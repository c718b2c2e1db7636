"""What a pool change will do, before it is made (``POST /api/v1/whatif/pools``), and, once
made and converged, predicted against measured (``GET /api/v1/whatif``). Times are modelled
milliseconds (a simulated fleet's wall milliseconds divided by its time scale)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from pdctl_api.schema.cluster import InstanceCount, TensorParallel
from pdctl_api.schema.common import Maybe, Public, UpdateBody

WhatIfStatus = Literal["proposed", "superseded", "converging", "measuring", "measured"]
RecentMinutes = Annotated[float, Field(gt=0, le=1440, description=(
    "the recent traffic played: requests received in the last this many modelled minutes"))]


class PoolChoice(UpdateBody):
    size: Maybe[InstanceCount] = None
    tp: Maybe[TensorParallel] = None


class DecodePoolChoice(PoolChoice):
    """The decode pool serves every request: a layout without one is no layout."""

    size: Maybe[Annotated[int, Field(ge=1, le=10_000, description="instances in the pool")]] = None


class WhatIfPools(UpdateBody):
    """``POST /api/v1/whatif/pools`` body: the pools as proposed (a pool or field left out
    stays as it is now) and how much recent traffic to play."""

    prefill: Maybe[PoolChoice] = None
    decode: Maybe[DecodePoolChoice] = None
    minutes: Maybe[RecentMinutes] = None


class FiguresPublic(Public):
    requests: int
    within_ttft: float | None = Field(description="share of the requests within the TTFT "
                                                  "target")
    p50_ms: dict[str, float | None] = Field(description=(
        "ttft, queue, prefill, transfer, decode_sched (TTFT and its parts) and gap_p99 (each "
        "request's p99 inter-token gap): their medians"))
    p90_ms: dict[str, float | None]


class LayoutPool(Public):
    count: int
    tp: int | None


class LayoutPublic(Public):
    prefill: LayoutPool
    decode: LayoutPool
    disagg_policy: str | None = None
    kv_mode: str | None = Field(None, description="pull or push (both pools push); None "
                                                  "colocated")


class ForecastPublic(Public):
    """The recent traffic played in the discrete-event fleet on the pools now and as proposed,
    each with all its instances serving (after the change has converged)."""

    id: int
    made_at: float = Field(description="unix time the prediction was made")
    current: LayoutPublic
    proposed: LayoutPublic
    current_label: str
    proposed_label: str
    requests: int = Field(description="recent requests played")
    span_s: float = Field(description="modelled seconds from their first arrival to the last")
    ttft_target_ms: float
    before: FiguresPublic = Field(description="on the pools now")
    after: FiguresPublic = Field(description="on the pools as proposed")
    accelerator_hours: dict[str, float] = Field(description=(
        "current and proposed: accelerators held for the traffic's span, in hours"))
    wall_s: float = Field(description="what the two runs took")
    notes: list[str] = Field(default_factory=list)


class ComparisonPublic(Public):
    figure: str
    quantile: str
    predicted_ms: float | None
    measured_ms: float | None
    error: float | None = Field(description="(predicted - measured) / measured")


class WhatIfPublic(Public):
    """``GET /api/v1/whatif``: the last prediction and what became of it. ``proposed``: not
    made (the pools differ from it and no change followed); ``superseded``: a later change
    took the pools elsewhere; ``converging``: made, instances still starting or draining;
    ``measuring``: converged, fewer than ``min_requests`` served since; ``measured``."""

    forecast: ForecastPublic | None = None
    status: WhatIfStatus | None = None
    applied_at: float | None = None
    converged_at: float | None = None
    min_requests: int = 0
    measured: FiguresPublic | None = None
    comparison: list[ComparisonPublic] = Field(default_factory=list)
