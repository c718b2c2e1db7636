"""The SLA planner (``GET|PATCH /api/v1/planner``): its live settings, whose type, bounds and
description are written once here (the answer declares them, the PATCH body takes them from
it, the controller's ``planner`` configuration section uses the same types); the profiles it
plans with, and its decisions."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from pdctl_api.schema.common import Public, Role, UpdateBody, changes_of
from pdctl_api.schema.targets import TtftTargetMs

PlannerMode = Literal["off", "advisory", "apply"]
PredictorName = Literal["constant", "holt"]

PlannerModeSetting = Annotated[PlannerMode, Field(description=(
    "off; advisory: recommends (API, console, pdctl_planner_recommended_instances); "
    "apply: changes the pools itself (audit actor ``planner``)"))]
PredictorSetting = Annotated[PredictorName, Field(description=(
    "next-interval load: the last interval's (constant) or its trend (holt)"))]
PlannerIntervalS = Annotated[float, Field(ge=1, le=86_400, allow_inf_nan=False, description=(
    "adjustment interval: one observation, prediction and decision each"))]
PlannerTtftMs = Annotated[TtftTargetMs, Field(description="target TTFT p95 (modelled ms)")]
PlannerItlMs = Annotated[float, Field(gt=0, le=60_000, allow_inf_nan=False, description=(
    "target inter-token gap p95 (modelled ms)"))]


class PlanLoad(Public):
    """A load in modelled time: requests/s and mean tokens per request."""

    request_rate: float
    prompt_tokens: float
    output_tokens: float


class PlanObserved(Public):
    """One interval as the planner saw it (modelled ms: wall ms / sim.time_scale)."""

    requests: int
    load: PlanLoad
    ttft_p95_ms: float
    itl_p95_ms: float | None = Field(None, description="inter-token gap p95 (streamed)")
    itl_mean_ms: float | None = None
    prefill_ms_mean: float | None = None
    prefill_queue_p95_ms: float
    decode_queue_p95_ms: float
    decode_concurrency: float
    disagg_token_share: float


class TpAdvicePublic(Public):
    role: Role
    size: int
    tp: int


class PlanPublic(Public):
    """One pass of the planner: what it saw, predicted and recommended, and why."""

    at: float
    mode: PlannerMode
    current: dict[Role, int]
    recommended: dict[Role, int]
    reasons: list[str]
    hold: str | None = Field(None, description="why the recommendation was not applied now")
    observed: PlanObserved | None = None
    predicted: PlanLoad | None = None
    applied: bool = False
    error: str | None = None
    tp_advice: TpAdvicePublic | None = Field(None, description=(
        "planner.tp_advice: a pool's size and TP that serve the recent traffic better; "
        "recommended only, never applied by the planner"))


class PlannerBounds(Public):
    min_prefill: int
    max_prefill: int
    min_decode: int
    max_decode: int
    accelerator_budget: int | None = None


class PlannerPublic(Public):
    """``GET /api/v1/planner``: settings, the profiles it plans with, its decisions."""

    mode: PlannerModeSetting
    predictor: PredictorSetting
    interval_s: PlannerIntervalS
    ttft_ms: PlannerTtftMs
    itl_ms: PlannerItlMs
    time_scale: float = Field(1.0, description="sim.time_scale: wall s per modelled s")
    bounds: PlannerBounds
    profiles: dict[Role, str | None]
    problem: str | None = Field(None, description="why the planner cannot run now")
    next_at: float | None = None
    history: list[PlanPublic] = Field(default_factory=list, description="oldest first")


@changes_of(PlannerPublic, "mode", "ttft_ms", "itl_ms", "interval_s", "predictor")
class PlannerUpdate(UpdateBody):
    """``PATCH /api/v1/planner`` body."""
