"""What-if before apply: ``POST /api/v1/whatif/pools`` plays the recent traffic in the
discrete-event fleet on the pools now and as proposed (``controller.whatif.forecast``), and
keeps the prediction; ``GET /api/v1/whatif`` answers it with what became of it -- once the
change is made and has converged, the same figures measured on the requests served since.

A prediction changes nothing in the cluster (no audit event); its runs take seconds, off the
event loop. It is refused (409, nothing kept) when the controller's model, accelerator or link
has no profile, or too few requests were received recently to play."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

from fastapi import APIRouter, Depends, Security

from controller.api.control import BEARER, ERRORS, State, known_query
from controller.api.state import AppState
from controller.errors import Busy, InvalidChange, Unpredictable
from controller.models import Role
from controller.whatif.forecast import (
    MIN_MEASURED,
    Fleetwise,
    Made,
    forecast,
    in_hindsight,
)
from controller.whatif.layout import Layout
from controller.whatif.live import RECENT_RECORDS, live_spec, recent_traffic
from pdctl_api.schema import ForecastPublic, WhatIfPools, WhatIfPublic

MIN_PLAYED = 10  # recent requests a prediction needs
DEFAULT_MINUTES = 10.0

whatif_routes = APIRouter(
    prefix="/api/v1", dependencies=[Security(BEARER), Depends(known_query)],
    responses={**ERRORS, 409: {"model": ERRORS[422]["model"], "description": (
        "no prediction: the model, accelerator or link has no profile, or too few recent "
        "requests")}, 429: {"model": ERRORS[422]["model"], "description": (
        "another prediction is running (one at a time: each plays two fleets on a core)")}})
_ids = itertools.count(1)


def proposed_layout(st: AppState, body: WhatIfPools) -> tuple[Layout, Layout]:
    """The layouts now and as ``body`` proposes, validated as a pool change would be
    (InvalidChange: 422)."""
    now = {r: (st.fleet.targets[r].size, st.fleet.targets[r].tp) for r in Role}
    wanted = dict(now)
    for role, choice in ((Role.PREFILL, body.prefill), (Role.DECODE, body.decode)):
        if choice is None:
            continue
        if choice.size is None and choice.tp is None:
            raise InvalidChange("give size and/or tp for each pool proposed", role.value)
        target = st.fleet.desired.check(role, choice.size, choice.tp)[role]
        wanted[role] = (target.size, target.tp)
    policy = st.table.settings.disagg_policy
    push = all(st.fleet.targets[r].kv_mode == "push" for r in Role)  # both pools push

    def layout(pools: dict[Role, tuple[int, int]], what: str) -> Layout:
        (p, ptp), (d, dtp) = pools[Role.PREFILL], pools[Role.DECODE]
        if d < 1:
            raise InvalidChange(f"{what}: no decode instance: nothing would serve",
                                "decode.size")
        return Layout(d, dtp, p, ptp, policy, "push" if push else "pull")

    return layout(now, "the pools now"), layout(wanted, "the proposal")


@whatif_routes.post("/whatif/pools", response_model=ForecastPublic)
async def predict_pools(body: WhatIfPools, st: State) -> ForecastPublic:
    current, proposed = proposed_layout(st, body)
    s = st.settings
    ttft_ms = st.targets.settings.ttft_p95_ms
    spec = live_spec(s, ttft_ms, st.table.settings)
    if isinstance(spec, str):
        raise Unpredictable(f"no prediction: {spec}")
    minutes = body.minutes or DEFAULT_MINUTES
    recent = recent_traffic(st.requests, time.time(), minutes * 60, s.time_scale)
    if len(recent) < MIN_PLAYED:
        raise Unpredictable(f"no prediction: {len(recent)} requests received in the last "
                            f"{minutes:g} min, fewer than {MIN_PLAYED} to play")
    if st.predicting.locked():  # two simulations per call: never several beside the router
        raise Busy("another what-if prediction is running; retry when it ends")
    async with st.predicting:
        made = await asyncio.to_thread(forecast, recent, current, proposed, spec)
    notes = ["each layout as it serves once converged: every instance up from the first "
             "request (start-up and drains not played)",
             "recorded requests carry no prefix information: each prompt is its own, "
             "so prefix-cache hits are not predicted"]
    if s.time_scale != 1:
        notes.append(f"a simulated fleet: times in modelled ms (wall / {s.time_scale:g})")
    if len(recent) >= RECENT_RECORDS:
        notes.append(f"the most recent {RECENT_RECORDS:,} requests only")
    st.forecast = Made(next(_ids), time.time(), made, tuple(notes))
    return forecast_view(st.forecast)


def forecast_view(made: Made) -> ForecastPublic:
    return ForecastPublic.model_validate({**made.forecast.public(), "id": made.id,
                                          "made_at": made.at, "notes": list(made.notes)})


@whatif_routes.get("/whatif", response_model=WhatIfPublic)
async def get_whatif(st: State) -> WhatIfPublic:
    made = st.forecast
    if made is None:
        return WhatIfPublic()
    p = made.forecast.proposed
    want = {Role.PREFILL: (p.prefill_count, p.prefill_tp), Role.DECODE: (p.decode_count,
                                                                       p.decode_tp)}

    def matches(role: Role) -> bool:
        t = st.fleet.targets[role]
        size, tp = want[role]
        return t.size == size and (size == 0 or t.tp == tp)

    wall = time.time() - st.fleet.clock()  # the fleet's clock is monotonic
    settled = [t + wall for i in st.fleet.registry for t in (i.ready_at, i.ended_at)
               if t is not None]
    fleet = Fleetwise(
        changes=[e["ts"] for e in st.store.events(1000, kind="pool.update", since=made.at)],
        matches=all(matches(r) for r in Role),
        converged=all(st.fleet.pool_view(r)["converged"] for r in Role),
        settled=settled)
    records = st.requests.recent(RECENT_RECORDS, since=made.at)
    h = in_hindsight(made.forecast, fleet, records, st.settings.time_scale)
    out: dict[str, Any] = {
        "forecast": forecast_view(made), "status": h.status, "applied_at": h.applied_at,
        "converged_at": h.converged_at, "min_requests": MIN_MEASURED,
        "measured": h.measured.public() if h.measured else None,
        "comparison": [{"figure": c.figure, "quantile": c.quantile,
                        "predicted_ms": c.predicted, "measured_ms": c.measured,
                        "error": None if c.error is None else round(c.error, 4)}
                       for c in h.comparison]}
    return WhatIfPublic.model_validate(out)
