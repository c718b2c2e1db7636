"""``GET /api/v1/sd/engines``: Prometheus HTTP service discovery (``http_sd_configs``) of the
engines the controller runs, wherever they are (local processes, Ray actors, pods): the same
target groups as the file ``pdctl lab``'s Prometheus reads (``controller.obs.prometheus``),
each serving instance's address with ``instance`` (its id) and ``role`` labels. Read with
either token (Prometheus's ``authorization: {credentials_file: ...}``; the viewer token is
enough)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Security

from controller.api.control import BEARER, ERRORS, State, known_query
from controller.obs import prometheus

discovery_routes = APIRouter(prefix="/api/v1", dependencies=[Security(BEARER),
                                                             Depends(known_query)],
                             responses=ERRORS)


@discovery_routes.get("/sd/engines")
async def sd_engines(st: State) -> list[dict[str, Any]]:
    """The serving engines as Prometheus HTTP SD target groups:
    ``[{"targets": ["host:port"], "labels": {"instance": ID, "role": ROLE}}, ...]``."""
    return prometheus.engine_targets(st.fleet.registry)
