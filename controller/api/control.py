"""Control plane routes (``/api/v1/*``): ``{"detail": ...}`` errors, strict request bodies
and bounded parameters, and every answer declared as its ``pdctl_api.schema`` model
(``response_model``, also in /openapi.json).

The token and the body's media type are checked before this (``gate.ControlGate``); the
bearer scheme is declared here so that the OpenAPI document says so. Every route runs on the
event loop, never in a thread beside it, and every change runs under ``AppState.writes``:
read, validate, apply, persist and record happen as one step, so the API, ``state.db`` and
the audit log agree, in order.

Each answer is built by its typed view (``controller.api.views``) from the controller's
objects."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Security
from fastapi.dependencies.models import Dependant
from fastapi.security import HTTPBearer
from starlette.requests import Request

from controller.api.state import AppState, app_state
from controller.api.views import (
    cluster_view,
    instance_view,
    instances_view,
    planned,
    planner_view,
    pool_plan_view,
    pool_view,
    request_view,
    stats_view,
    timeseries_view,
)
from controller.errors import InvalidChange, NotFound, Unpredictable
from controller.models import InstanceState, RequestRecord, Role
from controller.sizing import advisor
from pdctl_api import profiles
from pdctl_api.schema import (
    AccessPublic,
    AdvisorPublic,
    ClusterPublic,
    ErrorPublic,
    EventPublic,
    InstanceLogPublic,
    InstancePublic,
    PlannerPublic,
    PlannerUpdate,
    PoolPlanPublic,
    PoolPublic,
    PoolUpdate,
    RequestPublic,
    RoutingPublic,
    RoutingUpdate,
    StatsPublic,
    TargetsPublic,
    TargetsUpdate,
    TimeseriesPublic,
)

# Declares the scheme in the OpenAPI document; ``ControlGate`` enforces it.
BEARER = HTTPBearer(auto_error=False, description=(
    "the admin token in STATE_DIR/token, or the read-only one in STATE_DIR/viewer-token"))
ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorPublic, "description": "missing or invalid bearer token"},
    403: {"model": ErrorPublic, "description": "a change sent with the viewer token"},
    404: {"model": ErrorPublic, "description": "no such instance"},
    413: {"model": ErrorPublic, "description": "a body over 64 KiB"},
    415: {"model": ErrorPublic, "description": "a body not sent as application/json"},
    422: {"model": ErrorPublic, "description": "refused: the field and the reason; nothing "
          "was changed"},
    503: {"model": ErrorPublic, "description": "a change the state directory cannot record "
          "(its disk full, say): nothing was changed"},
}


def query_names(dependant: Dependant) -> frozenset[str]:
    """The query parameters a route declares, its dependencies' included. Walked here rather
    than with FastAPI's ``get_flat_dependant``, which newer FastAPI releases no longer have
    (the console image, built without vLLM's pins, got one and failed to import)."""
    names = {p.alias for p in dependant.query_params}
    for sub in dependant.dependencies:
        names |= query_names(sub)
    return frozenset(names)


def known_query(request: Request) -> None:
    """Refuse query parameters the route does not declare (a typo is not silently ignored)."""
    route = request.scope.get("route")
    if route is None or not request.query_params:
        return
    known = query_names(route.dependant)
    unknown = sorted(set(request.query_params) - known)
    if unknown:
        raise InvalidChange(f"unknown query parameter(s): {', '.join(unknown)}"
                            + (f"; this route takes {', '.join(sorted(known))}" if known
                               else "; this route takes none"), unknown[0])


control_routes = APIRouter(prefix="/api/v1",
                           dependencies=[Security(BEARER), Depends(known_query)],
                           responses=ERRORS)
MAX_EVENT_ID = 2**63 - 1  # SQLite's INTEGER
State = Annotated[AppState, Depends(app_state)]


def audit_actor(request: Request) -> str:
    """Who the audit log names for a change: ``X-Pdctl-Actor`` (the CLI and the console set
    it), else ``api``."""
    values = request.headers.getlist("x-pdctl-actor")
    if not values:
        return "api"
    name = values[0]
    if len(values) > 1 or not 0 < len(name) <= 64 or not name.isprintable():
        raise InvalidChange("X-Pdctl-Actor: one header of 1 to 64 printable characters",
                            "x-pdctl-actor")
    return name


@control_routes.get("/cluster", response_model=ClusterPublic)
async def get_cluster(st: State) -> ClusterPublic:
    return cluster_view(st)


@control_routes.patch("/pools/{role}", response_model=PoolPublic | PoolPlanPublic)
async def patch_pool(role: Role, body: PoolUpdate, st: State, request: Request,
                     dry_run: Annotated[bool, Query(description=(
                         "validate the change exactly like the real one, change nothing, and "
                         "answer the actions the next reconcile step would take"))] = False
                     ) -> PoolPublic | PoolPlanPublic:
    if body.kv_mode == "push":  # the first look at the installed vLLM takes seconds
        await asyncio.to_thread(st.fleet.desired.push_problem)
    if dry_run:
        actions = st.fleet.preview_pool(role, body.size, body.tp, body.kv_mode)
        return pool_plan_view(st, role, body.size, body.tp, [planned(a) for a in actions],
                              body.kv_mode)
    async with st.writes:
        st.fleet.set_pool(role, body.size, body.tp, audit_actor(request), kv_mode=body.kv_mode)
        return pool_view(st, role)


@control_routes.get("/pools/{role}", response_model=PoolPublic)
async def get_pool(role: Role, st: State) -> PoolPublic:
    return pool_view(st, role)


@control_routes.get("/instances", response_model=list[InstancePublic])
async def list_instances(st: State, role: Role | None = None,
                         state: InstanceState | None = None) -> list[InstancePublic]:
    return instances_view(st, [i for i in st.fleet.registry if (role is None or i.role is role)
                               and (state is None or i.state is state)])


@control_routes.get("/instances/{instance_id}", response_model=InstancePublic)
async def get_instance(instance_id: str, st: State) -> InstancePublic:
    inst = st.fleet.registry.get(instance_id)
    if inst is None:
        raise NotFound(f"no instance {instance_id!r}")
    return instance_view(inst, st.table.inflight(inst.id), st.table.handles_out(inst.id))


@control_routes.get("/instances/{instance_id}/log", response_model=InstanceLogPublic)
async def instance_log(instance_id: str, st: State,
                       lines: Annotated[int, Query(ge=1, le=5000)] = 100) -> InstanceLogPublic:
    inst = st.fleet.registry.get(instance_id)
    if inst is None:
        raise NotFound(f"no instance {instance_id!r}")
    return InstanceLogPublic(id=inst.id, log=(await st.fleet.launcher.log_tail(inst.handle, lines)
                                  if inst.handle is not None else ""))


@control_routes.post("/instances/{instance_id}/drain", response_model=InstancePublic)
async def drain_instance(instance_id: str, st: State, request: Request) -> InstancePublic:
    async with st.writes:
        st.store.writable()  # a drain the audit log cannot hold is not made
        inst = st.fleet.drain(instance_id, audit_actor(request))
        return instance_view(inst, st.table.inflight(inst.id), st.table.handles_out(inst.id))


@control_routes.get("/routing", response_model=RoutingPublic)
async def get_routing(st: State) -> RoutingPublic:
    return st.table.settings  # a RoutingPublic, with the configuration's defaults


@control_routes.patch("/routing", response_model=RoutingPublic)
async def patch_routing(body: RoutingUpdate, st: State, request: Request) -> RoutingPublic:
    patch = body.model_dump(exclude_unset=True)
    async with st.writes:
        return st.table.update(patch, audit_actor(request))


@control_routes.get("/requests", response_model=list[RequestPublic])
async def list_requests(st: State, limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
                        since: Annotated[float | None, Query(ge=0, le=1e11, description=(
                            "only requests that started at or after this unix time"))] = None,
                        until: Annotated[float | None, Query(gt=0, le=1e11, description=(
                            "only requests that started before this unix time"))] = None
                        ) -> list[RequestPublic]:
    """The newest ``limit`` recorded requests, newest first; ``since``/``until`` bound their
    start times (a time range in the past)."""
    if since is not None and until is not None and since >= until:
        raise InvalidChange("since must be before until", "since")
    return [request_view(r) for r in st.requests.recent(limit, since, until)]


@control_routes.get("/requests/{request_id}", response_model=RequestPublic,
                    responses={404: {"model": ErrorPublic,
                                     "description": "no such request among those recorded"}})
async def get_request(request_id: Annotated[str, Path(max_length=256)], st: State
                      ) -> RequestPublic:
    rec = st.requests.find(request_id)
    if rec is None:
        raise NotFound(f"no request {request_id!r} among the last {len(st.requests)} "
                       "recorded (controller.request_buffer)")
    return request_view(rec)


@control_routes.get("/stats", response_model=StatsPublic)
async def get_stats(st: State, window_s: Annotated[float, Query(gt=0, le=86_400)] = 60.0,
                    end: Annotated[float | None, Query(gt=0, le=1e11, description=(
                        "the window's end, unix seconds (default: now): the window is "
                        "[end - window_s, end)"))] = None) -> StatsPublic:
    return stats_view(st, window_s, end)


MAX_BUCKETS = 2000  # of a time series (/timeseries, /utilization)


def check_buckets(window_s: float, step_s: float, field: str | None = None) -> None:
    """Refuse a time series of more than ``MAX_BUCKETS`` buckets (``field``: the one named)."""
    if window_s / step_s > MAX_BUCKETS:
        raise InvalidChange(f"window_s / step_s must be at most {MAX_BUCKETS} buckets", field)


@control_routes.get("/timeseries", response_model=TimeseriesPublic)
async def get_timeseries(st: State,
                         window_s: Annotated[float, Query(gt=0, le=86_400)] = 300.0,
                         step_s: Annotated[float, Query(gt=0, le=3600)] = 5.0,
                         end: Annotated[float | None, Query(gt=0, le=1e11, description=(
                             "the window's end, unix seconds (default: now)"))] = None
                         ) -> TimeseriesPublic:
    check_buckets(window_s, step_s)
    return timeseries_view(st, window_s, step_s, end)


@control_routes.get("/advisor", response_model=AdvisorPublic, responses={409: {
    "model": ErrorPublic, "description": "the model's architecture is unknown"}})
async def get_advisor(st: State, window_s: Annotated[float, Query(gt=0, le=86_400)] = 600.0,
                      end: Annotated[float | None, Query(gt=0, le=1e11, description=(
                          "the window's end, unix seconds (default: now): the advice is from "
                          "the requests that started in [end - window_s, end)"))] = None
                      ) -> AdvisorPublic:
    s, targets = st.settings, st.fleet.targets
    model = s.known_profile
    if model is None:
        raise Unpredictable(f"model {s.model.public_name!r}: its architecture is unknown (no "
                            "profile in model.name, no model.path), so its roofline is too")
    decode = st.table.ready(Role.DECODE)
    batch = sum(i.running for i in decode) / len(decode) if decode else None
    advice = advisor.advise(model, s.hardware.profile,
                            profiles.link(s.hardware.kv_link), targets[Role.PREFILL].tp,
                            targets[Role.DECODE].tp, window_records(st, window_s, end), batch,
                            st.table.settings.transfer_alert_share)
    return AdvisorPublic.model_validate(advice)  # the advisor's own JSON


def window_records(st: AppState, window_s: float, end: float | None) -> list[RequestRecord]:
    """The records that started in ``[end - window_s, end)`` (``end`` None: now), oldest
    first."""
    if end is None:
        return st.requests.window(window_s)
    return [r for r in st.requests.window(window_s, end) if r.started_at < end]


@control_routes.get("/access", response_model=AccessPublic)
async def get_access(request: Request) -> AccessPublic:
    """What the token of this request may do: ``admin`` reads and changes, ``viewer`` reads."""
    role = getattr(request.state, "pdctl_access", "admin")
    return AccessPublic(role=role, may_change=role == "admin")


@control_routes.get("/targets", response_model=TargetsPublic)
async def get_targets(st: State) -> TargetsPublic:
    return st.targets.settings  # a TargetsPublic, with the configuration's defaults


@control_routes.patch("/targets", response_model=TargetsPublic)
async def patch_targets(body: TargetsUpdate, st: State, request: Request) -> TargetsPublic:
    async with st.writes:
        new = st.targets.update(body.model_dump(exclude_unset=True), audit_actor(request))
    return new


@control_routes.get("/events", response_model=list[EventPublic])
async def list_events(st: State, limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
                            since_id: Annotated[int, Query(ge=0, le=MAX_EVENT_ID)] = 0,
                            kind: Annotated[str | None, Query(max_length=64)] = None,
                            since: Annotated[float | None, Query(ge=0, le=1e11, description=(
                                "only events at or after this unix time"))] = None,
                            until: Annotated[float | None, Query(gt=0, le=1e11, description=(
                                "only events before this unix time"))] = None
                            ) -> list[EventPublic]:
    """The audit log, newest first; ``since``/``until`` bound the events' times."""
    if since is not None and until is not None and since >= until:
        raise InvalidChange("since must be before until", "since")
    # The store's rows, as the audit log keeps them.
    return [EventPublic.model_validate(e)
            for e in st.store.events(limit, since_id, kind, since, until)]


@control_routes.get("/planner", response_model=PlannerPublic)
async def get_planner(st: State, history: Annotated[int, Query(ge=0, le=720)] = 60
                      ) -> PlannerPublic:
    return planner_view(st, history)


@control_routes.patch("/planner", response_model=PlannerPublic)
async def patch_planner(body: PlannerUpdate, st: State, request: Request) -> PlannerPublic:
    async with st.writes:
        st.planner.update(body.model_dump(exclude_unset=True), audit_actor(request))
    return planner_view(st, 60)
