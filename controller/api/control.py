"""Control plane routes (``/api/v1/*``): ``{"detail": ...}`` errors, strict request bodies
and bounded parameters, and every answer declared as its ``pdctl_api.schema`` model
(``response_model``, also in /openapi.json).

The token and the body's media type are checked before this (``gate.ControlGate``); the
bearer scheme is declared here so that the OpenAPI document says so. Every route runs on the
event loop, never in a thread beside it, and every change runs under ``AppState.writes``:
read, validate, apply, persist and record happen as one step, so the API, ``state.db`` and
the audit log agree, in order.

Each model is built in one place from what its owner returns (``Instance.public`` with the
routing table's in-flight count, ``Fleet.pool_view``, ``stats`` ...)."""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Security
from fastapi.dependencies.models import Dependant
from fastapi.security import HTTPBearer
from starlette.requests import Request

from controller.api.state import AppState, app_state
from controller.errors import InvalidChange, NotFound
from controller.fleet.reconcile import Action, Drain, Start
from controller.models import Instance, InstanceState, Role
from controller.requests_log import stats, timeseries
from controller.sizing import advisor, kvfit
from pdctl_api import profiles
from pdctl_api.schema import (
    AccessPublic,
    AdvisorPublic,
    ClusterPublic,
    ErrorPublic,
    EventPublic,
    InstanceLogPublic,
    InstancePublic,
    PlannedAction,
    PlannerPublic,
    PlannerUpdate,
    PoolPlanPublic,
    PoolPublic,
    PoolSize,
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


router = APIRouter(prefix="/api/v1", dependencies=[Security(BEARER), Depends(known_query)],
                   responses=ERRORS)
MAX_EVENT_ID = 2**63 - 1  # SQLite's INTEGER
State = Annotated[AppState, Depends(app_state)]


def instance_view(st: AppState, inst: Instance) -> InstancePublic:
    return InstancePublic.model_validate(inst.public(st.table.inflight(inst.id)))


def pool_view(st: AppState, role: Role) -> PoolPublic:
    return PoolPublic.model_validate(st.fleet.pool_view(role))


def planned(action: Action) -> PlannedAction:
    """A reconciler action as the API shows it."""
    if isinstance(action, Start):
        return PlannedAction(kind="start", role=action.role, tp=action.tp, reason=action.reason)
    kind = "drain" if isinstance(action, Drain) else "stop"
    return PlannedAction(kind=kind, instance_id=action.instance_id, reason=action.reason)


def actor(request: Request) -> str:
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


@router.get("/cluster", response_model=ClusterPublic)
async def get_cluster(st: State) -> ClusterPublic:
    s, f = st.settings, st.fleet
    m = s.model_profile
    per_node, nodes, _ = f.capacity()  # a Ray cluster's nodes, read live, or the config's
    return ClusterPublic.model_validate({
        "model": {"name": s.model.name, "served_name": s.model.public_name,
                  "params": m.params, "layers": m.layers, "heads": m.heads,
                  "kv_heads": m.kv_heads, "head_dim": m.head_dim,
                  "kv_bytes_per_token": m.kv_bytes_per_token},
        "backend": s.backend,
        "hardware": {"accelerator": s.hardware.accelerator,
                     "accelerators_per_node": per_node, "nodes": nodes,
                     "total_accelerators": per_node * nodes,
                     "used_accelerators": f.registry.used_accelerators(),
                     "kv_link": s.hardware.kv_link},
        "pools": {r: pool_view(st, r) for r in Role},
        "routing": st.table.settings.model_dump(),
        "instances": [instance_view(st, i) for i in f.registry],
        "time_scale": s.sim.time_scale if s.backend == "sim" else 1.0,
    })


@router.patch("/pools/{role}", response_model=PoolPublic | PoolPlanPublic)
async def patch_pool(role: Role, body: PoolUpdate, st: State, request: Request,
                     dry_run: Annotated[bool, Query(description=(
                         "validate the change exactly like the real one, change nothing, and "
                         "answer the actions the next reconcile step would take"))] = False
                     ) -> PoolPublic | PoolPlanPublic:
    if dry_run:
        actions = st.fleet.preview_pool(role, body.size, body.tp)
        now = st.fleet.targets[role]
        tp = now.tp if body.tp is None else body.tp
        return PoolPlanPublic(
            role=role, desired=PoolSize(size=now.size if body.size is None else body.size,
                                        tp=tp),
            actions=[planned(a) for a in actions], notes=pool_notes(st, role, tp))
    async with st.writes:
        st.fleet.set_pool(role, body.size, body.tp, actor(request))
        return pool_view(st, role)


def pool_notes(st: AppState, role: Role, tp: int) -> list[str]:
    """A decode pool's KV capacity at ``tp`` against the contexts of the last 10 minutes."""
    s = st.settings
    # External engines' memory is not known; the CPU lab's KV space is
    # vllm.cpu_kv_cache_gib, not an accelerator's memory.
    if role is not Role.DECODE or s.backend == "external" or s.hardware.is_cpu:
        return []
    c = st.requests.columns(600.0)
    ok = c.select(c.ok)
    contexts = ok.col("prompt_tokens") + ok.col("output_tokens")
    m = profiles.model(s.model.name) if s.backend == "sim" else s.model_profile
    fit = kvfit.fit(m, s.hardware.profile, tp, contexts,
                    advisor.DEFAULT_ISL + advisor.DEFAULT_OSL)
    return [fit.note()]


@router.get("/pools/{role}", response_model=PoolPublic)
async def get_pool(role: Role, st: State) -> PoolPublic:
    return pool_view(st, role)


@router.get("/instances", response_model=list[InstancePublic])
async def list_instances(st: State, role: Role | None = None,
                         state: InstanceState | None = None) -> list[InstancePublic]:
    return [instance_view(st, i) for i in st.fleet.registry
            if (role is None or i.role is role) and (state is None or i.state is state)]


@router.get("/instances/{instance_id}", response_model=InstancePublic)
async def get_instance(instance_id: str, st: State) -> InstancePublic:
    inst = st.fleet.registry.get(instance_id)
    if inst is None:
        raise NotFound(f"no instance {instance_id!r}")
    return instance_view(st, inst)


@router.get("/instances/{instance_id}/log", response_model=InstanceLogPublic)
async def instance_log(instance_id: str, st: State,
                       lines: Annotated[int, Query(ge=1, le=5000)] = 100) -> InstanceLogPublic:
    inst = st.fleet.registry.get(instance_id)
    if inst is None:
        raise NotFound(f"no instance {instance_id!r}")
    return InstanceLogPublic(id=inst.id, log=(await st.fleet.launcher.log_tail(inst.handle, lines)
                                  if inst.handle is not None else ""))


@router.post("/instances/{instance_id}/drain", response_model=InstancePublic)
async def drain_instance(instance_id: str, st: State, request: Request) -> InstancePublic:
    async with st.writes:
        return instance_view(st, st.fleet.drain(instance_id, actor(request)))


@router.get("/routing", response_model=RoutingPublic)
async def get_routing(st: State) -> RoutingPublic:
    return RoutingPublic.model_validate(st.table.settings.model_dump())


@router.patch("/routing", response_model=RoutingPublic)
async def patch_routing(body: RoutingUpdate, st: State, request: Request) -> RoutingPublic:
    patch = body.model_dump(exclude_unset=True)
    async with st.writes:
        return RoutingPublic.model_validate(st.table.update(patch, actor(request)).model_dump())


@router.get("/requests", response_model=list[RequestPublic])
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
    return [RequestPublic.model_validate(r.public())
            for r in st.requests.recent(limit, since, until)]


@router.get("/requests/{request_id}", response_model=RequestPublic,
            responses={404: {"model": ErrorPublic,
                             "description": "no such request among those recorded"}})
async def get_request(request_id: Annotated[str, Path(max_length=256)], st: State
                      ) -> RequestPublic:
    rec = st.requests.find(request_id)
    if rec is None:
        raise NotFound(f"no request {request_id!r} among the last {len(st.requests)} "
                       "recorded (controller.request_buffer)")
    return RequestPublic.model_validate(rec.public())


def nixl_totals(instances: list[Instance]) -> dict[str, float]:
    """KV moved by NIXL as the engines count it (decode side), and its bandwidth."""
    nbytes = sum(i.nixl_bytes for i in instances)
    seconds = sum(i.nixl_xfer_s for i in instances)
    return {"transfers": sum(i.nixl_xfers for i in instances), "bytes": nbytes,
            "seconds": seconds, "gbps": nbytes / 1e9 / seconds if seconds > 0 else 0.0}


def pool_utilization(st: AppState) -> dict[str, Any]:
    out = {}
    for role in Role:
        ready = st.table.ready(role)
        n = len(ready)
        inflight = [st.table.inflight(i.id) for i in ready]
        out[role.value] = {
            "ready_instances": n,
            "inflight": sum(inflight),
            "running": sum(i.running for i in ready),
            "waiting": sum(i.waiting for i in ready),
            "busy_share": sum(1 for i, k in zip(ready, inflight, strict=True) if k or i.running)
            / n if n else 0.0,
            "kv_cache_usage_mean": sum(i.kv_usage for i in ready) / n if n else 0.0,
            "nixl": nixl_totals(ready),
        }
    return out


@router.get("/stats", response_model=StatsPublic)
async def get_stats(st: State, window_s: Annotated[float, Query(gt=0, le=86_400)] = 60.0,
                    end: Annotated[float | None, Query(gt=0, le=1e11, description=(
                        "the window's end, unix seconds (default: now): the window is "
                        "[end - window_s, end)"))] = None) -> StatsPublic:
    cols, covered = st.requests.between(window_s, end)
    out = stats(cols, window_s, st.table.settings.transfer_alert_share, covered)
    out["pools"] = pool_utilization(st)
    out["total_requests"] = st.requests.total
    rs = st.table.settings
    out["admission"] = {"inflight": st.proxy.inflight, "max_inflight": rs.max_inflight,
                        "max_inflight_per_instance": rs.max_inflight_per_instance,
                        "refused_total": st.proxy.refused_total,
                        "prefill_waiting": st.table.prefill_waiting}
    out["kv_integrity"] = st.lease_watch.summary(window_s)
    return StatsPublic.model_validate(out)


@router.get("/timeseries", response_model=TimeseriesPublic)
async def get_timeseries(st: State,
                         window_s: Annotated[float, Query(gt=0, le=86_400)] = 300.0,
                         step_s: Annotated[float, Query(gt=0, le=3600)] = 5.0,
                         end: Annotated[float | None, Query(gt=0, le=1e11, description=(
                             "the window's end, unix seconds (default: now)"))] = None
                         ) -> TimeseriesPublic:
    if window_s / step_s > 2000:
        raise InvalidChange("window_s / step_s must be at most 2000 buckets")
    now = time.time() if end is None else min(end, time.time())  # as ``between`` does
    cols, _ = st.requests.between(window_s, end)
    return TimeseriesPublic.model_validate(
        {"window_s": window_s, "step_s": step_s, "now": now,
         "buckets": timeseries(cols, window_s, step_s, now)})


@router.get("/advisor", response_model=AdvisorPublic)
async def get_advisor(st: State, window_s: Annotated[float, Query(gt=0, le=86_400)] = 600.0
                      ) -> AdvisorPublic:
    s, targets = st.settings, st.fleet.targets
    decode = st.table.ready(Role.DECODE)
    batch = sum(i.running for i in decode) / len(decode) if decode else None
    advice = advisor.advise(s.model_profile, s.hardware.profile,
                            profiles.link(s.hardware.kv_link), targets[Role.PREFILL].tp,
                            targets[Role.DECODE].tp, st.requests.window(window_s), batch,
                            st.table.settings.transfer_alert_share)
    return AdvisorPublic.model_validate(advice)


@router.get("/access", response_model=AccessPublic)
async def get_access(request: Request) -> AccessPublic:
    """What the token of this request may do: ``admin`` reads and changes, ``viewer`` reads."""
    role = getattr(request.state, "pdctl_access", "admin")
    return AccessPublic(role=role, may_change=role == "admin")


@router.get("/targets", response_model=TargetsPublic)
async def get_targets(st: State) -> TargetsPublic:
    return TargetsPublic.model_validate(st.targets.settings.model_dump())


@router.patch("/targets", response_model=TargetsPublic)
async def patch_targets(body: TargetsUpdate, st: State, request: Request) -> TargetsPublic:
    async with st.writes:
        new = st.targets.update(body.model_dump(exclude_unset=True), actor(request))
    return TargetsPublic.model_validate(new.model_dump())


@router.get("/events", response_model=list[EventPublic])
async def list_events(st: State, limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
                            since_id: Annotated[int, Query(ge=0, le=MAX_EVENT_ID)] = 0,
                            kind: Annotated[str | None, Query(max_length=64)] = None
                            ) -> list[EventPublic]:
    return [EventPublic.model_validate(e) for e in st.store.events(limit, since_id, kind)]


def planner_view(st: AppState, history: int) -> PlannerPublic:
    pl = st.planner
    found = pl.profiles()
    plans = list(pl.history)[-history:] if history else []
    return PlannerPublic.model_validate({
        **pl.live.public(), "time_scale": pl.time_scale,
        "bounds": vars(pl.bounds()),
        "profiles": {r: (p.key if p is not None else None) for r, p in found.items()},
        "problem": pl.problem(), "next_at": pl.next_at,
        "history": [p.public() for p in plans]})


@router.get("/planner", response_model=PlannerPublic)
async def get_planner(st: State, history: Annotated[int, Query(ge=0, le=720)] = 60
                      ) -> PlannerPublic:
    return planner_view(st, history)


@router.patch("/planner", response_model=PlannerPublic)
async def patch_planner(body: PlannerUpdate, st: State, request: Request) -> PlannerPublic:
    async with st.writes:
        st.planner.update(body.model_dump(exclude_unset=True), actor(request))
    return planner_view(st, 60)
