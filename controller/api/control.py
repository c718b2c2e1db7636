"""Control plane routes (``/api/v1/*``): token auth, ``{"detail": ...}`` errors."""

from __future__ import annotations

import secrets
import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request

from controller import advisor, profiles
from controller.api.state import AppState, app_state
from controller.config import PolicyName
from controller.errors import InvalidChange, NotFound, Unauthorized
from controller.models import Instance, InstanceState, Role
from controller.requests_log import stats, timeseries


def require_token(request: Request) -> None:
    expected = app_state(request).token
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not secrets.compare_digest(given.strip(), expected):
        raise Unauthorized("missing or invalid bearer token (see STATE_DIR/token)")


router = APIRouter(prefix="/api/v1", dependencies=[Depends(require_token)])
State = Annotated[AppState, Depends(app_state)]


class PoolUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    size: int | None = Field(None, ge=0, le=10_000)
    tp: int | None = Field(None, ge=1, le=1024)


class RoutingUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    disagg_min_prompt_tokens: int | None = Field(None, ge=0)
    transfer_alert_share: float | None = Field(None, gt=0, le=1)
    prefill_policy: PolicyName | None = None
    decode_policy: PolicyName | None = None
    max_attempts: int | None = Field(None, ge=1, le=10)
    request_timeout_s: float | None = Field(None, gt=0)


def instance_view(st: AppState, inst: Instance) -> dict[str, Any]:
    return inst.public(st.table.inflight(inst.id))


def actor(request: Request) -> str:
    return request.headers.get("x-pdctl-actor", "api")


@router.get("/cluster")
def get_cluster(st: State) -> dict[str, Any]:
    s, f = st.settings, st.fleet
    m = s.model_profile
    return {
        "model": {"name": s.model.name, "served_name": s.model.public_name,
                  "params": m.params, "layers": m.layers, "heads": m.heads,
                  "kv_heads": m.kv_heads, "head_dim": m.head_dim,
                  "kv_bytes_per_token": m.kv_bytes_per_token},
        "backend": s.backend,
        "hardware": {"accelerator": s.hardware.accelerator,
                     "accelerators_per_node": s.hardware.per_node, "nodes": s.hardware.nodes,
                     "total_accelerators": s.hardware.total_accelerators,
                     "used_accelerators": f.registry.used_accelerators(),
                     "kv_link": s.hardware.kv_link},
        "pools": {r.value: f.pool_view(r) for r in Role},
        "routing": st.table.settings.model_dump(),
        "instances": [instance_view(st, i) for i in f.registry],
    }


@router.patch("/pools/{role}")
def patch_pool(role: Role, body: PoolUpdate, st: State, request: Request) -> dict[str, Any]:
    st.fleet.set_pool(role, body.size, body.tp, actor(request))
    return st.fleet.pool_view(role)


@router.get("/pools/{role}")
def get_pool(role: Role, st: State) -> dict[str, Any]:
    return st.fleet.pool_view(role)


@router.get("/instances")
def list_instances(st: State, role: Role | None = None,
                   state: InstanceState | None = None) -> list[dict[str, Any]]:
    return [instance_view(st, i) for i in st.fleet.registry
            if (role is None or i.role is role) and (state is None or i.state is state)]


@router.get("/instances/{instance_id}")
def get_instance(instance_id: str, st: State) -> dict[str, Any]:
    inst = st.fleet.registry.get(instance_id)
    if inst is None:
        raise NotFound(f"no instance {instance_id!r}")
    return instance_view(st, inst)


@router.get("/instances/{instance_id}/log")
def instance_log(instance_id: str, st: State,
                 lines: Annotated[int, Query(ge=1, le=5000)] = 100) -> dict[str, Any]:
    inst = st.fleet.registry.get(instance_id)
    if inst is None:
        raise NotFound(f"no instance {instance_id!r}")
    return {"id": inst.id, "log": st.fleet.launcher.log_tail(inst.handle, lines)}


@router.post("/instances/{instance_id}/drain")
def drain_instance(instance_id: str, st: State, request: Request) -> dict[str, Any]:
    return instance_view(st, st.fleet.drain(instance_id, actor(request)))


@router.get("/routing")
def get_routing(st: State) -> dict[str, Any]:
    return st.table.settings.model_dump()


@router.patch("/routing")
def patch_routing(body: RoutingUpdate, st: State, request: Request) -> dict[str, Any]:
    patch = body.model_dump(exclude_unset=True)
    return st.table.update(patch, actor(request)).model_dump()


@router.get("/requests")
def list_requests(st: State, limit: Annotated[int, Query(ge=1, le=10_000)] = 100
                  ) -> list[dict[str, Any]]:
    return [r.public() for r in st.requests.recent(limit)]


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


@router.get("/stats")
def get_stats(st: State, window_s: Annotated[float, Query(gt=0, le=86_400)] = 60.0
              ) -> dict[str, Any]:
    out = stats(st.requests.columns(window_s), window_s,
                st.table.settings.transfer_alert_share)
    out["pools"] = pool_utilization(st)
    out["total_requests"] = st.requests.total
    out["kv_integrity"] = st.lease_watch.summary(window_s)
    return out


@router.get("/timeseries")
def get_timeseries(st: State, window_s: Annotated[float, Query(gt=0, le=86_400)] = 300.0,
                   step_s: Annotated[float, Query(gt=0, le=3600)] = 5.0) -> dict[str, Any]:
    if window_s / step_s > 2000:
        raise InvalidChange("window_s / step_s must be at most 2000 buckets")
    now = time.time()
    return {"window_s": window_s, "step_s": step_s, "now": now,
            "buckets": timeseries(st.requests.columns(window_s, now), window_s, step_s, now)}


@router.get("/advisor")
def get_advisor(st: State, window_s: Annotated[float, Query(gt=0, le=86_400)] = 600.0
                ) -> dict[str, Any]:
    s, targets = st.settings, st.fleet.targets
    decode = st.table.ready(Role.DECODE)
    batch = sum(i.running for i in decode) / len(decode) if decode else None
    return advisor.advise(s.model_profile, s.hardware.profile, profiles.link(s.hardware.kv_link),
                          targets[Role.PREFILL].tp, targets[Role.DECODE].tp,
                          st.requests.window(window_s), batch,
                          st.table.settings.transfer_alert_share)


@router.get("/events")
def list_events(st: State, limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
                since_id: int = 0, kind: str | None = None) -> list[dict[str, Any]]:
    return st.store.events(limit, since_id, kind)
