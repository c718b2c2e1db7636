"""The operator's service targets (``GET|PATCH /api/v1/targets``): each target's type,
bounds and description, written once here. The answer declares the fields, the PATCH body
takes them from it (``changes_of``), and the controller's ``targets`` configuration section
(``controller.config``) is the answer with the configuration's defaults."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from pdctl_api.schema.common import Public, UpdateBody, changes_of

TtftTargetMs = Annotated[float, Field(gt=0, le=3_600_000, allow_inf_nan=False)]
TtftP95Ms = Annotated[TtftTargetMs, Field(description="target TTFT p95, ms")]
TtftP99Ms = Annotated[TtftTargetMs, Field(description="target TTFT p99, ms")]
GapP99Ms = Annotated[float, Field(gt=0, le=600_000, allow_inf_nan=False, description=(
    "the 99th percentile, over streamed requests, of each one's p99 inter-token gap"))]
ErrorRate = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False, description=(
    "failed and refused requests over all requests in the window"))]


class TargetsPublic(Public):
    """``GET|PATCH /api/v1/targets``: the operator's service targets."""

    ttft_p95_ms: TtftP95Ms
    ttft_p99_ms: TtftP99Ms
    gap_p99_ms: GapP99Ms
    error_rate: ErrorRate


@changes_of(TargetsPublic)
class TargetsUpdate(UpdateBody):
    """``PATCH /api/v1/targets`` body."""
