"""A simulated prefill engine and a decode engine joined by a side channel that records the
decode engine's calls to the prefill (and can hold its pulls), in-process; the request, the
metrics and the log lines the lease tests read."""

from __future__ import annotations

import asyncio
import json
import math
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from controller.engines.sim import SimEngineConfig, create_engine_app
from controller.engines.sim.engine import SimEngine
from controller.tokens import estimate_tokens

PREFILL = SimEngineConfig(port=8500, role="prefill", model="llama-3-8b", engine_id="P",
                          time_scale=0.01)
DECODE = replace(PREFILL, port=8600, role="decode", engine_id="D")
PROMPT = "a lease on the prefill's KV blocks " * 20
PROMPT_TOKENS = estimate_tokens(PROMPT)
BLOCKS = math.ceil(PROMPT_TOKENS / 16)
BODY: dict[str, Any] = {"prompt": PROMPT, "max_tokens": 4}
HOP = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
       "remote_block_ids": None, "remote_host": None, "remote_port": None}
LOGGER = "controller.engines.sim.engine"
EXPIRED = "vllm:nixl_num_kv_expired_reqs_total"
AFTER_EXPIRY = "vllm:nixl_num_notifications_after_expiry_total"


def expired_line(request_id: str) -> str:
    return (f"Releasing expired KV blocks for request {request_id} which were retrieved by 0 "
            "remote worker(s) before lease expired.")


def unrecognized_line(request_id: str) -> str:
    return (f"Potentially invalid KV blocks for unrecognized request {request_id} were "
            "retrieved by a decode worker. They may have expired.")


class SideChannel(httpx.AsyncBaseTransport):
    """The decode engine's way to the prefill: records calls, can hold pulls at a gate."""

    def __init__(self, app: Starlette) -> None:
        self._inner = httpx.ASGITransport(app=app)
        self.calls: Counter[str] = Counter()
        self.heartbeats: list[dict[str, Any]] = []
        self.pull_gate: asyncio.Event | None = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        self.calls[path] += 1
        if path == "/sim/kv/heartbeat":
            self.heartbeats.append(json.loads(request.content))
        if path == "/sim/kv/pull" and self.pull_gate is not None:
            await self.pull_gate.wait()
        return await self._inner.handle_async_request(request)


@dataclass
class Pair:
    prefill: httpx.AsyncClient
    decode: httpx.AsyncClient
    decode_app: Starlette
    p: SimEngine
    d: SimEngine
    side: SideChannel


@asynccontextmanager
async def pair(prefill_kw: dict[str, Any] | None = None,
               decode_kw: dict[str, Any] | None = None) -> AsyncIterator[Pair]:
    p_app = create_engine_app(replace(PREFILL, **(prefill_kw or {})))
    side = SideChannel(p_app)
    d_app = create_engine_app(replace(DECODE, **(decode_kw or {})), kv_transport=side)
    async with p_app.router.lifespan_context(p_app), d_app.router.lifespan_context(d_app), \
            httpx.AsyncClient(transport=httpx.ASGITransport(app=p_app), base_url="http://p") as p, \
            httpx.AsyncClient(transport=httpx.ASGITransport(app=d_app), base_url="http://d") as d:
        yield Pair(p, d, d_app, p_app.state.sim.engine, d_app.state.sim.engine, side)


async def prefill_hop(c: httpx.AsyncClient, request_id: str = "hop-1") -> dict[str, Any]:
    r = await c.post("/v1/completions", json={**BODY, "kv_transfer_params": HOP},
                     headers={"X-Request-Id": request_id})
    assert r.status_code == 200, r.text
    params: dict[str, Any] = r.json()["kv_transfer_params"]
    assert params["remote_request_id"] == request_id
    return params


async def metric(c: httpx.AsyncClient, name: str) -> float:
    for line in (await c.get("/metrics")).text.splitlines():
        if line.startswith(f'{name}{{model_name="llama-3-8b"}} '):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in metrics")


def messages(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == level]
