"""``GET /api/v1/cache``: the prefix cache over a window -- hit rate as the engines report it
and as the router predicted it, drift, tokens and decode-side KV bytes saved, and the block
index per instance (``controller.kvevents.report``). Query rules as ``/api/v1/utilization``."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Security

from controller.api.control import BEARER, ERRORS, State, check_buckets, known_query
from controller.api.state import AppState
from controller.kvevents.report import cache_report
from controller.models import Role
from controller.requests_log import bucket_grid
from pdctl_api import profiles
from pdctl_api.schema import CachePublic

cache_routes = APIRouter(prefix="/api/v1", dependencies=[Security(BEARER), Depends(known_query)],
                         responses=ERRORS)


@cache_routes.get("/cache", response_model=CachePublic)
async def get_cache(st: State,
                    window_s: Annotated[float, Query(gt=0, le=86_400)] = 300.0,
                    step_s: Annotated[float, Query(gt=0, le=3600)] = 10.0,
                    end: Annotated[float | None, Query(gt=0, le=1e11, description=(
                        "the window's end, unix seconds (default: now)"))] = None
                    ) -> CachePublic:
    """Prefix-cache hits of the requests that started in the window, per instance and per
    bucket, and the block index of every serving instance."""
    check_buckets(window_s, step_s, "step_s")
    return cache_view(st, window_s, step_s, end)


def cache_view(st: AppState, window_s: float, step_s: float, end: float | None) -> CachePublic:
    now = time.time() if end is None else min(end, time.time())
    start, _ = bucket_grid(window_s, step_s, now)
    records = [r for r in st.requests.window(now - start, now) if r.started_at < now]
    registry = st.fleet.registry
    roles = {iid: role for iid, (role, _tp) in st.fleet.load_history.seen.items()}
    roles.update({i.id: i.role for i in registry})
    hub = registry.kv
    states = hub.states([i.id for i in registry.serving()]) if hub is not None else []
    s = st.settings
    model, block = s.known_profile, s.kv_block_size
    routing = st.table.settings
    return CachePublic.model_validate(cache_report(
        records, states, roles,
        {Role.PREFILL: routing.prefill_policy, Role.DECODE: routing.decode_policy},
        None if model is None else lambda tokens: profiles.kv_bytes(model, tokens, block),
        window_s, step_s, start, now))
