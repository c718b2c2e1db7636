"""``create_app``: builds one controller (store, launcher, fleet, router) and its routes.

The lifespan starts the reconcile and load-polling loops and the writer of Prometheus's engine
targets file and, on the way out, stops every instance the controller started.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import httpx
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from controller.api import cache, control, data, discovery, utilization, whatif
from controller.api.asgi import ASGIApp
from controller.api.gate import ControlGate
from controller.api.listener import SHUTDOWN_GRACE_S
from controller.api.state import AppState
from controller.api.synced import Synced
from controller.api.views import health_view, readiness_view
from controller.config import Settings
from controller.errors import ConfigError, InvalidChange, PdctlError
from controller.fleet import build_fleet
from controller.fleet.collector import FleetCollector
from controller.launchers.base import EngineKind, Launcher
from controller.launchers.external import ExternalLauncher
from controller.launchers.process import ProcessLauncher
from controller.launchers.sim import SimEngineKind
from controller.launchers.sim_host import SimHostLauncher
from controller.launchers.vllm import VllmEngineKind
from controller.metrics import Merged, Metrics
from controller.models import Instance, Role
from controller.obs import prometheus
from controller.obs.kv_fallback import FallbackWatch
from controller.obs.kv_integrity import LeaseWatch
from controller.obs.targets import Targets, TargetsCollector
from controller.planner.service import Planner
from controller.requests_log import RequestLog
from controller.router.h1 import H1Upstream
from controller.router.proxy import Proxy
from controller.router.tracing import RequestTracer
from controller.store import Store
from controller.token_file import ensure_token
from controller.tokens import make_counter
from pdctl_api.schema import ErrorPublic, HealthPublic

log = logging.getLogger("pdctl.controller")


def make_launcher(settings: Settings) -> Launcher:
    """The engine kind (``backend``) run where ``launcher`` says."""
    if settings.backend == "external":
        return ExternalLauncher({Role.PREFILL: settings.pools.prefill.urls,
                                 Role.DECODE: settings.pools.decode.urls})
    engine: EngineKind = (SimEngineKind(settings) if settings.backend == "sim"
                          else VllmEngineKind(settings))
    if settings.launcher == "ray":
        from controller.launchers.ray import RayLauncher  # noqa: PLC0415 - imports Ray

        return RayLauncher(settings, engine)
    if settings.backend == "sim" and settings.sim.processes:
        return SimHostLauncher(settings)
    return ProcessLauncher(engine)


def build_state(settings: Settings, launcher: Launcher | None = None) -> AppState:
    if not settings.model.public_name:
        raise ConfigError("backend external: the engines' model is not known yet "
                          "(controller.launchers.external_model.resolve), and none is named "
                          "(model.served_name)")
    state_dir = settings.controller.state_dir
    state_dir.mkdir(parents=True, exist_ok=True)
    store = Store(state_dir / "state.db")
    fleet, table = build_fleet(settings, store, launcher or make_launcher(settings),
                               httpx.AsyncClient(timeout=httpx.Timeout(5.0)))
    upstream = H1Upstream(lambda: table.settings.request_timeout_s)  # the live value
    table.on_failed = _cut_connections(upstream)
    metrics = Metrics(settings.model.public_name)
    metrics.registry.register(FleetCollector(fleet))
    requests = RequestLog(settings.controller.request_buffer)
    proxy = Proxy(settings, table, upstream,
                  make_counter(settings.model.path, settings.backend), requests, metrics)
    kv = fleet.registry.kv
    if kv is not None:
        metrics.attach_kv_index(lambda: [
            (s.instance, bool(s.health and not s.health.stale), s.health.blocks if s.health
             else 0) for s in kv.states([i.id for i in fleet.registry.serving()])])
    metrics.attach_state(lambda: (store.problem is None, store.failed_writes))
    metrics.attach_admission(lambda: proxy.inflight + proxy.others_inflight, lambda: (
        table.settings.max_inflight, table.settings.max_inflight_per_instance),
        lambda: table.prefill_waiting + proxy.others_waiting)
    writes = asyncio.Lock()
    planner = Planner(settings, fleet, requests, metrics, store, writes,
                      arrivals=lambda: (proxy.arrived + proxy.others_arrived[0],
                                        proxy.arrived_prompt_tokens + proxy.others_arrived[1]))
    targets = Targets(settings.targets, store)
    metrics.registry.register(TargetsCollector(lambda: targets.settings))
    proxy.targets = lambda: (targets.settings.ttft_p95_ms, targets.settings.gap_p99_ms)
    fallback = proxy.fallback = FallbackWatch(requests, metrics, store, settings.kv_block_size)
    if settings.controller.otlp_traces_endpoint:
        proxy.tracer = RequestTracer(settings.controller.otlp_traces_endpoint)
    return AppState(settings, store, fleet, table, proxy, requests, metrics, upstream,
                    ensure_token(state_dir), LeaseWatch(requests, metrics, store), planner,
                    targets,
                    viewer_token=ensure_token(state_dir, "viewer-token"), writes=writes,
                    fallback=fallback)


def _cut_connections(upstream: H1Upstream) -> Callable[[Instance, str], None]:
    """What the router does when the fleet fails an instance: end its connections to it, so
    that requests waiting on an engine that cannot answer (a cut path, a hung process) fail
    now -- retried elsewhere where nothing reached the client yet, else ended with an error
    -- rather than after the read timeout."""
    def cut(inst: Instance, why: str) -> None:
        if not inst.url:
            return
        n = upstream.cut(inst.url, f"{inst.id} failed: {why}")
        if n:
            log.warning("%s failed (%s): its %d open connection(s) ended", inst.id, why, n)
    return cut


def _after_poll(st: AppState) -> Callable[[list[Instance]], None]:
    """What reads the engines' counters after each load poll: the KV lease and the
    silent-fallback watches."""
    fallback = st.fallback

    def after(instances: list[Instance]) -> None:
        st.lease_watch.check(instances)
        if fallback is not None:
            fallback.check(instances)
    return after


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    st: AppState = app.state.pdctl
    st.store.record("controller", "controller.start", "controller", None,
                    {"backend": st.settings.backend, "launcher": st.settings.launcher,
                     "model": st.settings.model.public_name})
    for event in await st.fleet.recover():
        log.warning("%s: %s", event["target"], event["detail"])
    sd_file = prometheus.targets_path(st.settings.controller.state_dir)
    tasks = [asyncio.create_task(st.fleet.run()),
             asyncio.create_task(st.fleet.run_load_poller(_after_poll(st))),
             asyncio.create_task(prometheus.keep_targets(st.fleet.registry, sd_file,
                                                         st.settings.controller.tick_s)),
             asyncio.create_task(st.planner.run())]
    try:
        yield
    finally:
        if st.workers is not None:  # they finish their requests while the engines still run
            await st.workers.stop(SHUTDOWN_GRACE_S + 5.0)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await st.proxy.close()  # KV releases in flight still need their engines
        await st.fleet.shutdown()
        if st.fleet.registry.kv is not None:
            await st.fleet.registry.kv.close()
        prometheus.clear_targets(sd_file)
        await st.upstream.close()
        if st.proxy.tracer is not None:
            await asyncio.to_thread(st.proxy.tracer.close)  # the last spans, exported
        st.store.record("controller", "controller.stop", "controller")
        st.store.close()


def error_public(exc: PdctlError) -> ErrorPublic:
    """A refused or failed control-API request's answer: the reason, and the field of a
    refused change when it is known."""
    return ErrorPublic(detail=str(exc),
                       field=exc.field if isinstance(exc, InvalidChange) and exc.field else None)


def invalid_public(errors: Sequence[Any]) -> ErrorPublic:
    """A refused request's ``ErrorPublic``: one reason per field (``size``,
    ``query.since_id``), the first field named in ``field``. The branches of an optional
    field (``int | None``) are one field: its "should be None" branch says nothing."""
    reasons: dict[str, str] = {}
    for e in errors:
        loc = [str(p) for p in e.get("loc", ()) if p != "body"]
        if e.get("type") == "none_required" and len(loc) > 1:
            continue
        where = ".".join(loc[:2]) if loc and loc[0] in ("query", "path", "header") else (
            loc[0] if loc else "")
        reasons.setdefault(where, str(e.get("msg")))
    detail = "; ".join(f"{k}: {v}" if k else v for k, v in reasons.items())
    return ErrorPublic(detail=detail or "invalid request", field=next(iter(reasons), "") or None)


def error_response(error: ErrorPublic, status_code: int) -> JSONResponse:
    """``field`` is left out when there is none."""
    return JSONResponse(error.model_dump(exclude_none=True), status_code=status_code)


class ControllerApp(FastAPI):
    """FastAPI for the control API, with the data plane (``data.DataPlane``) outermost: the
    inference routes skip every framework layer, error middleware included. Next, with
    router workers, the wait for them (``Synced``); then the control API's gate
    (``gate.ControlGate``): token and media type before any body is read."""

    def build_middleware_stack(self) -> ASGIApp:
        st: AppState = self.state.pdctl
        gate = ControlGate(super().build_middleware_stack(), st.token, st.viewer_token)
        synced = Synced(gate, lambda: st.workers)
        return data.DataPlane(synced, st.proxy, st.settings.controller)


def create_app(settings: Settings, launcher: Launcher | None = None) -> FastAPI:
    app = ControllerApp(title="pdctl controller", lifespan=lifespan, docs_url="/docs",
                        redoc_url=None)
    app.state.pdctl = build_state(settings, launcher)

    @app.exception_handler(PdctlError)
    async def _pdctl_error(request: Request, exc: PdctlError) -> JSONResponse:
        return error_response(error_public(exc), exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(invalid_public(exc.errors()), 422)

    @app.get("/healthz", response_model=HealthPublic)
    async def healthz() -> HealthPublic:
        """Liveness, with the ready instances per pool: 200 while the controller runs; open
        without a token."""
        return health_view(app.state.pdctl.table)

    @app.get("/health", response_model=HealthPublic)
    async def health() -> HealthPublic:
        """Liveness (vLLM's path): as ``/healthz``."""
        return health_view(app.state.pdctl.table)

    @app.get("/readyz", response_model=HealthPublic,
             responses={503: {"model": HealthPublic, "description": "the fleet cannot serve"}})
    async def readyz() -> JSONResponse:
        """Readiness: 200 once the fleet can serve -- a ready decode instance, and a ready
        prefill instance when the prefill pool's desired size is above 0 -- else 503 with
        the reason; open without a token."""
        st: AppState = app.state.pdctl
        view = readiness_view(st.table, st.fleet.desired.targets[Role.PREFILL].size > 0)
        return JSONResponse(view.model_dump(mode="json"),
                            status_code=503 if view.reason else 200)

    @app.get("/metrics")
    async def metrics() -> Response:
        st: AppState = app.state.pdctl
        registry: Any = st.metrics.registry
        if st.workers is not None:  # every router process's samples, added up
            registry = Merged(registry, st.workers.samples())
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    app.include_router(data.data_routes)
    app.include_router(control.control_routes)
    app.include_router(utilization.utilization_routes)
    app.include_router(cache.cache_routes)
    app.include_router(discovery.discovery_routes)
    app.include_router(whatif.whatif_routes)
    return app
