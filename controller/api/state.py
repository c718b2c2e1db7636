"""The objects one controller app owns, built by ``create_app`` and reached from requests;
each piece of state has one owner among them."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Protocol

from starlette.requests import Request

from controller.config import Settings
from controller.fleet import Fleet
from controller.metrics import Metrics, Samples
from controller.obs.kv_fallback import FallbackWatch
from controller.obs.kv_integrity import LeaseWatch
from controller.obs.targets import Targets
from controller.planner.service import Planner
from controller.requests_log import RequestLog
from controller.router.proxy import Proxy
from controller.router.table import RoutingTable
from controller.router.upstream import Upstream
from controller.store import Store
from controller.whatif.forecast import Made


class DataWorkers(Protocol):
    """The router workers (``controller.workers.pool.WorkerPool``) as the API uses them."""

    async def sync(self) -> None:
        """Until every worker has sent what it did and applied what it was told."""

    def samples(self) -> Samples:
        """Their metric samples, by family."""

    def public(self) -> list[dict[str, Any]]:
        """Each worker: index, pid, requests in flight and arrived."""

    async def stop(self, timeout_s: float) -> None:
        """Stop them (their requests in flight finish first, within ``timeout_s``)."""


@dataclass
class AppState:
    settings: Settings
    store: Store
    fleet: Fleet  # the engines: desired pools, instances, the reconcile loop
    table: RoutingTable  # the router's: live routing settings, candidates, in-flight counts
    proxy: Proxy
    requests: RequestLog
    metrics: Metrics
    upstream: Upstream
    token: str
    lease_watch: LeaseWatch
    planner: Planner  # the SLA planner: its live settings, history; acts through ``fleet``
    targets: Targets  # the operator's service targets (the console's health, alert rules)
    viewer_token: str = ""  # reads only: the control API answers 403 to a change with it
    # Held by every change to the cluster (pools, routing, drains, the planner's): one at a
    # time, in order.
    writes: asyncio.Lock = field(default_factory=asyncio.Lock)
    fallback: FallbackWatch | None = None  # silent KV fallbacks (told of every decode hop)
    forecast: Made | None = None  # the last what-if prediction (``controller.api.whatif``)
    predicting: asyncio.Lock = field(default_factory=asyncio.Lock)  # one what-if at a time
    workers: DataWorkers | None = None  # the router workers (controller.data_workers > 1)


def app_state(request: Request) -> AppState:
    state: AppState = request.app.state.pdctl
    return state
