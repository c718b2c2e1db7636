"""A client that goes away aborts its request: out of the batch, KV freed, gauge back to 0."""

from __future__ import annotations

import asyncio
import json
from collections.abc import MutableMapping
from typing import Any

import pytest

from controller.engines.sim import SimEngineConfig, create_engine_app
from controller.engines.sim.engine import SimEngine

# Llama-3-8B decode steps of ~7 ms at time scale 1: 2000 tokens would take ~14 s.
CFG = SimEngineConfig(port=8400, model="llama-3-8b", time_scale=1.0)


def scope(path: str) -> dict[str, Any]:
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1", "method": "POST", "scheme": "http", "path": path,
            "raw_path": path.encode(), "query_string": b"", "root_path": "",
            "headers": [(b"content-type", b"application/json")],
            "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8400), "state": {}}


async def until(predicate: Any, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.005)


@pytest.mark.parametrize("stream", [False, True])
async def test_disconnect_aborts_the_request(stream: bool) -> None:
    app = create_engine_app(CFG)
    engine: SimEngine = app.state.sim.engine
    body = json.dumps({"prompt": "long one", "max_tokens": 2000, "stream": stream}).encode()
    gone = asyncio.Event()
    delivered = False
    sent: list[MutableMapping[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    async with app.router.lifespan_context(app):
        call = asyncio.create_task(app(scope("/v1/completions"), receive, send))
        await until(lambda: engine.scheduler.num_running == 1 and (
            not stream or len(sent) >= 2))
        assert engine.scheduler.pool.used > 0
        gone.set()
        await asyncio.wait_for(call, 5.0)
        assert engine.scheduler.num_running == 0
        assert engine.scheduler.pool.used == 0
        text = engine.metrics.render(0, 0, 0.0).decode()
        assert 'vllm:request_success_total{finished_reason="length",model_name="llama-3-8b"} 0.0' \
            in text
