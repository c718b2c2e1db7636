"""``GET /api/v1/utilization``: each instance's and each pool's load over a window, against
the capacity the planner's performance profiles give (``controller.planner.utilization``).
Same query rules as ``/api/v1/timeseries``: bounded window and step, at most 2000 buckets,
unknown parameters refused."""

from __future__ import annotations

import time
from typing import Annotated

import numpy as np
from fastapi import APIRouter, Depends, Query, Security

from controller.api.control import BEARER, ERRORS, State, check_buckets, known_query
from controller.api.state import AppState
from controller.planner.capacity import profile_capacities
from controller.planner.profile import profile_key
from controller.planner.utilization import (
    LOOKBACK_S,
    NUMBERS,
    Seen,
    TokenWork,
    utilization_json,
)
from controller.requests_log import bucket_grid
from pdctl_api.schema import UtilizationPublic

utilization_routes = APIRouter(prefix="/api/v1",
                               dependencies=[Security(BEARER), Depends(known_query)],
                               responses=ERRORS)


@utilization_routes.get("/utilization", response_model=UtilizationPublic)
async def get_utilization(st: State,
                          window_s: Annotated[float, Query(gt=0, le=86_400)] = 300.0,
                          step_s: Annotated[float, Query(gt=0, le=3600)] = 5.0,
                          end: Annotated[float | None, Query(gt=0, le=1e11, description=(
                              "the window's end, unix seconds (default: now)"))] = None
                          ) -> UtilizationPublic:
    """Per instance seen in the window (live or ended) and per pool, in ``/timeseries``'s
    buckets: running, waiting, KV cache usage, prompt and output tokens/s, utilization."""
    check_buckets(window_s, step_s, "step_s")
    return utilization_view(st, window_s, step_s, end)


def utilization_view(st: AppState, window_s: float, step_s: float, end: float | None
                     ) -> UtilizationPublic:
    now = time.time() if end is None else min(end, time.time())  # as ``timeseries_view``
    start, _ = bucket_grid(window_s, step_s, now)
    history = st.fleet.load_history
    work = token_work(st, now - start + LOOKBACK_S, now)
    seen = {iid: Seen(role, tp) for iid, (role, tp) in history.seen.items()}
    seen.update({i.id: Seen(i.role, i.tp, i.state.value) for i in st.fleet.registry})
    s = st.settings
    itl_ms = st.planner.live.itl_ms
    name, accel = s.model.profile_name, s.hardware.accelerator
    capacity = profile_capacities(
        lambda tp: st.planner.index.find(s.backend, name, accel, tp),
        lambda tp: profile_key(s.backend, name, accel, tp), itl_ms,
        "backend external: the controller runs no engine there, so no profile applies"
        if s.backend == "external" else None)
    return UtilizationPublic.model_validate(utilization_json(
        history.between(start, now), work, seen, capacity, window_s, step_s, now,
        st.planner.time_scale, itl_ms))


def token_work(st: AppState, span_s: float, now: float) -> TokenWork:
    """The tokens of the requests that started in ``[now - span_s, now)``: their instances
    from the records, their numbers from the request log's columns (the same records in the
    same order -- both count back from the newest to the first one older than the span --
    checked by their start times)."""
    records = st.requests.window(span_s, now)
    cols = st.requests.columns(span_s, now)
    numbers = np.stack([cols.col(f) for f in NUMBERS], axis=1)
    started = np.fromiter((r.started_at for r in records), float, count=len(records))
    if numbers.shape[0] != len(records) or not np.array_equal(numbers[:, 0], started):
        return TokenWork.of([r for r in records if r.started_at < now])
    keep = started < now
    return TokenWork.of([r for r, k in zip(records, keep.tolist(), strict=True) if k],
                        numbers[keep])
