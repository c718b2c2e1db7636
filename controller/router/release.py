"""Freeing a KV handle that nobody will read: a decode engine is sent a request its serving
layer rejects, which makes vLLM notify the prefill to free the blocks at once (else they are
held until the lease ends). Counted by reason and outcome."""

from __future__ import annotations

import logging
from typing import Any

import orjson

from controller.metrics import Metrics
from controller.models import Instance, Role
from controller.router.bodies import release_body
from controller.router.table import RoutingTable
from controller.router.upstream import Upstream, UpstreamError

log = logging.getLogger("pdctl.router")

RELEASE_ENDPOINT = "/v1/completions"


class KvRelease:
    def __init__(self, upstream: Upstream, table: RoutingTable, metrics: Metrics,
                 model: str) -> None:
        self.upstream, self.table, self.metrics, self._model = upstream, table, metrics, model

    async def release(self, kv: dict[str, Any], hint: Instance | None, reason: str,
                       rid: str) -> None:
        """Have a decode engine tell the prefill to free a handle's blocks; counted."""
        inst = hint if hint is not None and not hint.state.terminal else None
        inst = inst or self.table.pick(Role.DECODE, set())
        outcome = "failed"
        if inst is not None:
            payload = orjson.dumps(release_body(self._model, kv))
            headers = {"X-Request-Id": f"{rid}-release", "Content-Type": "application/json"}
            try:
                reply = await self.upstream.post(f"{inst.url}{RELEASE_ENDPOINT}", payload, headers,
                                                 resend=False)
                outcome = "ok" if reply.status < 500 else "failed"
            except UpstreamError as exc:
                log.warning("%s: releasing KV handle through %s failed: %s", rid, inst.id, exc)
        self.metrics.kv_releases.labels(reason, outcome).inc()
        if outcome == "failed":
            log.warning("%s: KV handle %s not released (%s); the prefill frees it when its "
                        "lease expires", rid, kv.get("remote_request_id"), reason)
