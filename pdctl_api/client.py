"""The one client of the controller's control API: a typed, synchronous ``PdctlClient`` with a
method per route, each returning the route's model from ``pdctl_api.schema``, and ``ApiError``,
the only exception it raises. The CLI (``pdctl status|scale|tp|kv-mode|route``) and the console both
use it.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, TypeAdapter, ValidationError

from pdctl_api.schema import (
    AccessPublic,
    AdvisorPublic,
    ClusterPublic,
    EventPublic,
    ForecastPublic,
    HealthPublic,
    InstanceLogPublic,
    InstancePublic,
    InstanceState,
    PlannerPublic,
    PlannerUpdate,
    PoolPlanPublic,
    PoolPublic,
    RequestPublic,
    Role,
    RoutingPublic,
    RoutingUpdate,
    StatsPublic,
    TargetsPublic,
    TimeseriesPublic,
    UtilizationPublic,
    WhatIfPublic,
)

DEFAULT_URL = "http://127.0.0.1:8080"
DEFAULT_STATE_DIR = Path(".pdctl")  # the controller's; its API token is STATE_DIR/token
API = "/api/v1"

T = TypeVar("T")
ModelT = TypeVar("ModelT", bound=BaseModel)
_INSTANCES = TypeAdapter(list[InstancePublic])
_REQUESTS = TypeAdapter(list[RequestPublic])
_EVENTS = TypeAdapter(list[EventPublic])
_ADAPTERS: dict[type[BaseModel], TypeAdapter[Any]] = {}


def _adapter(model: type[ModelT]) -> TypeAdapter[ModelT]:
    if model not in _ADAPTERS:
        _ADAPTERS[model] = TypeAdapter(model)
    adapter: TypeAdapter[ModelT] = _ADAPTERS[model]
    return adapter


NO_TOKEN = "no API token"
BAD_TOKEN = ("the API token holds characters an HTTP header cannot carry (printable ASCII "
             "only), so it cannot be the controller's")


class ApiError(Exception):
    """A control-API call that did not succeed.

    ``status`` is the HTTP status, or ``None`` when no answer came (unreachable controller,
    timeout) or there was no token to send. ``detail`` is the API's ``detail`` as sent, and
    ``field`` the field of a refused change when the controller names it.
    """

    def __init__(self, status: int | None, detail: str, url: str = "",
                 field: str | None = None) -> None:
        super().__init__(f"{status}: {detail}" if status else detail)
        self.status = status
        self.detail = detail
        self.url = url
        self.field = field

    @property
    def unreachable(self) -> bool:
        return self.status is None

    @property
    def unauthorized(self) -> bool:
        return self.status == 401

    @property
    def token_problem(self) -> bool:
        """No token was found, or the one found cannot be sent (nothing reached the
        controller)."""
        return self.status is None and self.detail in (NO_TOKEN, BAD_TOKEN)

    @property
    def refused(self) -> bool:
        """The controller understood the change and refused it (nothing was changed)."""
        return self.status in (400, 404, 409, 422)


def read_token(state_dir: Path) -> str | None:
    """The token the controller keeps in ``state_dir/token``; None when unreadable or empty."""
    try:
        return (state_dir / "token").read_text().strip() or None
    except OSError:
        return None


def _api_error(response: httpx.Response, url: str) -> ApiError:
    try:
        body = response.json()
    except ValueError:
        return ApiError(response.status_code, response.text or response.reason_phrase, url)
    if isinstance(body, dict) and "detail" in body:
        detail, field = body["detail"], body.get("field")
        return ApiError(response.status_code, detail if isinstance(detail, str) else str(detail),
                        url, field if isinstance(field, str) else None)
    return ApiError(response.status_code, response.text, url)


class PdctlClient:
    """One controller, one token. ``actor`` goes to the audit log (``X-Pdctl-Actor``);
    ``transport`` lets tests put a fake controller behind it."""

    def __init__(self, base_url: str, token: str | None, *, actor: str = "api",
                 timeout_s: float = 5.0, transport: httpx.BaseTransport | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.actor = actor
        self._timeout_s = timeout_s
        self._transport = transport
        # Distinguishes clients in shared caches (two tests, two controllers, one URL).
        self.cache_key = f"{self.base_url}#{uuid.uuid4().hex[:8]}"
        # A header carries printable ASCII only ("Jørgen" would fail every call).
        actor = "".join(ch for ch in actor if ch.isascii() and ch.isprintable()) or "api"
        headers = {"X-Pdctl-Actor": actor}
        # Likewise a token: one beyond ASCII is refused before any call.
        self._bad_token = bool(token) and not (token or "").isascii()
        if token and not self._bad_token:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.Client(base_url=self.base_url, headers=headers,
                                  timeout=httpx.Timeout(timeout_s, connect=min(2.0, timeout_s)),
                                  transport=transport)

    def with_token(self, token: str) -> Self:
        """The same controller (and transport) with another token."""
        return type(self)(base_url=self.base_url, token=token, actor=self.actor,
                          timeout_s=self._timeout_s, transport=self._transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> PdctlClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _roundtrip(self, method: str, path: str, params: Mapping[str, Any] | None = None,
              body: Any = None, auth: bool = True, timeout_s: float | None = None
              ) -> httpx.Response:
        if auth and not self.token:
            raise ApiError(None, NO_TOKEN, self.base_url)
        if auth and self._bad_token:
            raise ApiError(None, BAD_TOKEN, self.base_url)
        try:
            r = self._http.request(method, path, params=params, json=body,
                                   timeout=httpx.USE_CLIENT_DEFAULT if timeout_s is None
                                   else httpx.Timeout(timeout_s, connect=2.0))
        except httpx.HTTPError as exc:
            raise ApiError(None, f"{type(exc).__name__}: {exc}", self.base_url) from None
        if r.status_code >= 400:
            raise _api_error(r, self.base_url)
        return r

    def _call(self, into: TypeAdapter[T], method: str, path: str,
              params: Mapping[str, Any] | None = None, body: Any = None,
              timeout_s: float | None = None) -> T:
        """One authenticated call under ``/api/v1``, its answer validated into ``into``
        (``timeout_s``: this call's, instead of the client's)."""
        return _parse(into, self._roundtrip(method, API + path, params, body,
                                            timeout_s=timeout_s), self.base_url)

    # ---- reads -------------------------------------------------------------------------

    def health(self) -> HealthPublic:
        """``GET /healthz`` (needs no token)."""
        return _parse(_adapter(HealthPublic), self._roundtrip("GET", "/healthz", auth=False),
                      self.base_url)

    def cluster(self) -> ClusterPublic:
        return self._call(_adapter(ClusterPublic), "GET", "/cluster")

    def pool(self, role: Role | str) -> PoolPublic:
        return self._call(_adapter(PoolPublic), "GET", f"/pools/{Role(role)}")

    def instances(self, role: Role | str | None = None,
                  state: InstanceState | str | None = None) -> list[InstancePublic]:
        params = {k: str(v) for k, v in (("role", role), ("state", state)) if v is not None}
        return self._call(_INSTANCES, "GET", "/instances", params)

    def instance(self, instance_id: str) -> InstancePublic:
        return self._call(_adapter(InstancePublic), "GET", f"/instances/{instance_id}")

    def instance_log(self, instance_id: str, lines: int = 100) -> InstanceLogPublic:
        return self._call(_adapter(InstanceLogPublic), "GET", f"/instances/{instance_id}/log",
                          {"lines": lines})

    def routing(self) -> RoutingPublic:
        return self._call(_adapter(RoutingPublic), "GET", "/routing")

    def requests(self, limit: int = 100, since: float | None = None,
                 until: float | None = None) -> list[RequestPublic]:
        """The newest ``limit`` requests, newest first; ``since``/``until`` (unix s) bound
        their start times."""
        params: dict[str, float] = {"limit": limit}
        if since is not None:
            params["since"] = since
        if until is not None:
            params["until"] = until
        return self._call(_REQUESTS, "GET", "/requests", params)

    def stats(self, window_s: float = 60.0, end: float | None = None) -> StatsPublic:
        """The window's aggregates; ``end`` (unix s): a window that ended then, not now."""
        params: dict[str, float] = {"window_s": window_s}
        if end is not None:
            params["end"] = end
        return self._call(_adapter(StatsPublic), "GET", "/stats", params)

    def timeseries(self, window_s: float = 300.0, step_s: float = 5.0,
                   end: float | None = None) -> TimeseriesPublic:
        """Buckets of ``step_s`` over the window; ``end`` (unix s): a window that ended then."""
        params = {"window_s": window_s, "step_s": step_s}
        if end is not None:
            params["end"] = end
        return self._call(_adapter(TimeseriesPublic), "GET", "/timeseries", params)

    def utilization(self, window_s: float = 300.0, step_s: float = 5.0,
                    end: float | None = None) -> UtilizationPublic:
        """Each instance's and pool's load against capacity, in ``step_s`` buckets over the
        window (``/timeseries``'s); ``end`` (unix s): a window that ended then."""
        params = {"window_s": window_s, "step_s": step_s}
        if end is not None:
            params["end"] = end
        return self._call(_adapter(UtilizationPublic), "GET", "/utilization", params)

    def advisor(self, window_s: float = 600.0, end: float | None = None) -> AdvisorPublic:
        """Advice from the window's requests; ``end`` (unix s): a window that ended then."""
        params = {"window_s": window_s}
        if end is not None:
            params["end"] = end
        return self._call(_adapter(AdvisorPublic), "GET", "/advisor", params)

    def planner(self, history: int = 60) -> PlannerPublic:
        return self._call(_adapter(PlannerPublic), "GET", "/planner", {"history": history})

    def request(self, request_id: str) -> RequestPublic:
        """One recorded request by id (404 when it is no longer, or never was, recorded)."""
        path = f"/requests/{quote(request_id, safe='')}"
        return self._call(_adapter(RequestPublic), "GET", path)

    def access(self) -> AccessPublic:
        """What this client's token may do."""
        return self._call(_adapter(AccessPublic), "GET", "/access")

    def targets(self) -> TargetsPublic:
        return self._call(_adapter(TargetsPublic), "GET", "/targets")

    def set_targets(self, change: Mapping[str, Any]) -> TargetsPublic:
        """Change the service targets (only the fields given)."""
        return self._call(_adapter(TargetsPublic), "PATCH", "/targets", body=dict(change))

    def set_planner(self, change: PlannerUpdate | Mapping[str, Any]) -> PlannerPublic:
        """Change the planner's mode, targets, interval or predictor."""
        body = (change.model_dump(mode="json", exclude_unset=True)
                if isinstance(change, PlannerUpdate) else dict(change))
        return self._call(_adapter(PlannerPublic), "PATCH", "/planner", body=body)

    def events(self, limit: int = 100, kind: str | None = None, since_id: int = 0,
               since: float | None = None, until: float | None = None) -> list[EventPublic]:
        """The newest ``limit`` audit events, newest first; ``since``/``until`` (unix s) bound
        their times."""
        params: dict[str, Any] = {"limit": limit}
        if kind:
            params["kind"] = kind
        if since_id:
            params["since_id"] = since_id
        if since is not None:
            params["since"] = since
        if until is not None:
            params["until"] = until
        return self._call(_EVENTS, "GET", "/events", params)

    # ---- changes -----------------------------------------------------------------------

    @staticmethod
    def _pool_body(size: int | None, tp: int | None, kv_mode: str | None = None
                   ) -> dict[str, int | str]:
        given: tuple[tuple[str, int | str | None], ...] = (
            ("size", size), ("tp", tp), ("kv_mode", kv_mode))
        return {k: v for k, v in given if v is not None}

    def set_pool(self, role: Role | str, size: int | None = None, tp: int | None = None,
                 kv_mode: str | None = None) -> PoolPublic:
        """Change the pool's desired size, TP and/or KV transfer mode (``pull``, ``push``);
        the controller converges to it (a rolling replace for TP and mode)."""
        return self._call(_adapter(PoolPublic), "PATCH", f"/pools/{Role(role)}",
                          body=self._pool_body(size, tp, kv_mode))

    def plan_pool(self, role: Role | str, size: int | None = None, tp: int | None = None,
                  kv_mode: str | None = None) -> PoolPlanPublic:
        """The dry run of ``set_pool``: validated the same way, nothing changed, and the
        actions the controller's next reconcile step would take."""
        return self._call(_adapter(PoolPlanPublic), "PATCH", f"/pools/{Role(role)}",
                          {"dry_run": "true"}, self._pool_body(size, tp, kv_mode))

    def predict_pools(self, pools: Mapping[str, Mapping[str, int]],
                      minutes: float | None = None, timeout_s: float = 60.0
                      ) -> ForecastPublic:
        """``POST /api/v1/whatif/pools``: the recent traffic played on the pools now and as
        ``pools`` proposes (``{"decode": {"size": 2}}``; a pool left out stays), before any
        change. A read (nothing changes), but seconds of simulation: its own timeout."""
        body: dict[str, Any] = {role: dict(choice) for role, choice in pools.items()}
        if minutes is not None:
            body["minutes"] = minutes
        return self._call(_adapter(ForecastPublic), "POST", "/whatif/pools", body=body,
                          timeout_s=timeout_s)

    def whatif(self) -> WhatIfPublic:
        """``GET /api/v1/whatif``: the last prediction and what became of it."""
        return self._call(_adapter(WhatIfPublic), "GET", "/whatif")

    def drain(self, instance_id: str) -> InstancePublic:
        return self._call(_adapter(InstancePublic), "POST", f"/instances/{instance_id}/drain")

    def set_routing(self, change: RoutingUpdate | Mapping[str, Any]) -> RoutingPublic:
        """Change routing settings. A mapping is sent as given, for the controller to
        validate (its refusal names the field); a ``RoutingUpdate`` sends its set fields."""
        body = (change.model_dump(mode="json", exclude_unset=True)
                if isinstance(change, RoutingUpdate) else dict(change))
        return self._call(_adapter(RoutingPublic), "PATCH", "/routing", body=body)


def _parse(into: TypeAdapter[T], response: httpx.Response, url: str) -> T:
    try:
        return into.validate_json(response.content)
    except ValidationError as exc:
        request = response.request
        raise ApiError(response.status_code, f"unexpected answer to {request.method} "
                       f"{request.url.path}: {_summary(exc)}", url) from None


def _summary(exc: ValidationError) -> str:
    parts = []
    for e in exc.errors()[:3]:
        loc = ".".join(str(p) for p in e.get("loc", ()))
        parts.append(f"{loc}: {e.get('msg')}" if loc else str(e.get("msg")))
    more = exc.error_count() - len(parts)
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")
