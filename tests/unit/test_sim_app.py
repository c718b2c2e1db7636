"""The simulated engine's HTTP surface, in-process: OpenAI shapes, errors, metrics, health."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import replace
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from controller.engines.sim import SimEngineConfig, create_engine_app
from controller.engines.sim.engine import SimEngine

BASE = SimEngineConfig(port=8100, model="llama-3-8b", hardware="h100-sxm", time_scale=0.01)

Client = Callable[..., AbstractAsyncContextManager[httpx.AsyncClient]]


@asynccontextmanager
async def serve(cfg: SimEngineConfig = BASE, **kw: Any) -> AsyncIterator[httpx.AsyncClient]:
    """A client on a fresh app, with the app's lifespan run around it."""
    app = create_engine_app(replace(cfg, **kw))
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://sim") as client:
        client.app = app  # type: ignore[attr-defined]
        yield client


def engine_of(client: httpx.AsyncClient) -> SimEngine:
    app: Starlette = client.app  # type: ignore[attr-defined]
    engine: SimEngine = app.state.sim.engine
    return engine


def sse_events(text: str) -> list[Any]:
    events = [line.removeprefix("data: ") for line in text.split("\n\n") if line]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


async def test_health_is_503_until_the_startup_delay_passed() -> None:
    async with serve(startup_delay_s=0.2) as c:
        assert (await c.get("/health")).status_code == 503
        await asyncio.sleep(0.25)
        r = await c.get("/health")
        assert r.status_code == 200 and r.content == b""


async def test_models_lists_the_served_name() -> None:
    async with serve(served_model_name="meta-llama/Llama-3-8B") as c:
        data = (await c.get("/v1/models")).json()
    assert data["object"] == "list"
    assert [(m["id"], m["max_model_len"]) for m in data["data"]] == [
        ("meta-llama/Llama-3-8B", 8192)]


async def test_completion_shape_request_id_and_metrics() -> None:
    async with serve() as c:
        r = await c.post("/v1/completions", headers={"X-Request-Id": "abc"},
                         json={"model": "llama-3-8b", "prompt": "hello " * 40, "max_tokens": 5})
    assert r.status_code == 200 and r.headers["x-request-id"] == "abc"
    body = r.json()
    assert body["id"] == "cmpl-abc" and body["object"] == "text_completion"
    choice = body["choices"][0]
    assert choice["finish_reason"] == "length" and len(choice["text"].split()) == 5
    assert body["usage"] == {"prompt_tokens": 60, "completion_tokens": 5, "total_tokens": 65}
    assert body["kv_transfer_params"] is None
    m = body["metrics"]
    assert set(m) == {"queue_time_ms", "time_to_first_token_ms", "generation_time_ms",
                      "mean_itl_ms", "tokens_per_second", "kv_transfer_ms"}
    assert m["kv_transfer_ms"] == 0.0 and m["generation_time_ms"] > 0 and m["mean_itl_ms"] > 0


async def test_request_id_is_generated_when_absent() -> None:
    async with serve() as c:
        r = await c.post("/v1/chat/completions",
                         json={"messages": [{"role": "user", "content": "hi"}]})
    body = r.json()
    assert body["id"] == f"chatcmpl-{r.headers['x-request-id']}"
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["usage"]["completion_tokens"] == 16  # the default max_tokens


async def test_output_is_deterministic_and_ignores_temperature() -> None:
    async with serve() as c:
        texts = []
        for prompt, temperature in (("alpha", 0.0), ("alpha", 1.5), ("beta", 0.0)):
            r = await c.post("/v1/completions", json={"prompt": prompt, "max_tokens": 8,
                                                      "temperature": temperature})
            texts.append(r.json()["choices"][0]["text"])
    assert texts[0] == texts[1] != texts[2]


async def test_chat_stream_with_usage() -> None:
    async with serve() as c:
        r = await c.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hi there"}], "max_completion_tokens": 3,
            "stream": True, "stream_options": {"include_usage": True}})
    assert r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    tokens = events[1:4]
    assert all(e["object"] == "chat.completion.chunk" for e in events)
    assert [e["choices"][0]["finish_reason"] for e in tokens] == [None, None, "length"]
    assert "metrics" in tokens[-1] and "metrics" not in tokens[0]
    assert events[4]["choices"] == [] and events[4]["usage"]["completion_tokens"] == 3
    assert "metrics" in events[4]


async def test_completion_stream_text_matches_non_stream() -> None:
    async with serve() as c:
        body = {"prompt": [1, 2, 3, 4], "max_tokens": 6}
        full = (await c.post("/v1/completions", json=body)).json()
        r = await c.post("/v1/completions", json={**body, "stream": True})
    events = sse_events(r.text)
    assert "usage" not in events[0]
    assert "".join(e["choices"][0]["text"] for e in events) == full["choices"][0]["text"]
    assert full["usage"]["prompt_tokens"] == 4  # token ids are counted as given


@pytest.mark.parametrize(("body", "status", "fragment"), [
    (None, 400, "not valid JSON"),
    ({"max_tokens": 3}, 400, "prompt"),
    ({"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ({"prompt": "x", "n": 2}, 400, "n must be 1"),
    ({"prompt": "x", "stream": "yes"}, 400, "stream"),
    ({"prompt": [1] * 8000, "max_tokens": 500}, 400, "maximum context length is 8192"),
    ({"prompt": "x", "model": "gpt-9"}, 404, "does not exist"),
    ({"prompt": "x", "kv_transfer_params": {"do_remote_prefill": True}}, 400, "remote_"),
])
async def test_bad_requests_get_openai_errors(body: Any, status: int, fragment: str) -> None:
    async with serve() as c:
        content = b"{not json" if body is None else json.dumps(body).encode()
        r = await c.post("/v1/completions", content=content,
                         headers={"content-type": "application/json"})
    assert r.status_code == status
    err = r.json()["error"]
    assert fragment in err["message"] and err["code"] == status and err["type"]


async def test_sim_info_reports_the_config() -> None:
    async with serve(role="decode", engine_id="d-1", tp=2) as c:
        info = (await c.get("/sim/info")).json()
    assert info["role"] == "decode" and info["engine_id"] == "d-1" and info["tp"] == 2
    assert {"hardware", "model", "link", "time_scale"} <= set(info)


METRIC_NAMES = [
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
    "vllm:request_success_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
    'vllm:prompt_tokens_by_source_total{model_name="llama-3-8b",source="local_compute"}',
    'vllm:prompt_tokens_by_source_total{model_name="llama-3-8b",source="external_kv_transfer"}',
    "vllm:nixl_num_failed_transfers_total", "vllm:nixl_num_kv_expired_reqs_total",
    "vllm:nixl_num_notifications_after_expiry_total",
    "vllm:time_to_first_token_seconds_bucket", "vllm:request_queue_time_seconds_bucket",
    "vllm:request_prefill_time_seconds_bucket", "vllm:request_decode_time_seconds_bucket",
    "vllm:inter_token_latency_seconds_bucket", "vllm:e2e_request_latency_seconds_bucket",
    "vllm:nixl_xfer_time_seconds_bucket", "vllm:nixl_post_time_seconds_bucket",
    "vllm:nixl_bytes_transferred_bucket", "vllm:nixl_num_descriptors_bucket",
]


async def test_metrics_use_vllm_names() -> None:
    async with serve() as c:
        await c.post("/v1/completions", json={"prompt": "count me", "max_tokens": 4})
        text = (await c.get("/metrics")).text
    for name in METRIC_NAMES:
        assert name in text, name
    assert "_total_total" not in text
    assert 'vllm:generation_tokens_total{model_name="llama-3-8b"} 4.0' in text
    assert 'vllm:request_success_total{finished_reason="length",model_name="llama-3-8b"} 1.0' \
        in text


async def test_two_apps_in_one_process_keep_separate_metrics() -> None:
    async with serve() as a, serve() as b:
        await a.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
        text = (await b.get("/metrics")).text
    assert 'vllm:generation_tokens_total{model_name="llama-3-8b"} 0.0' in text


async def test_kv_cache_usage_follows_running_requests() -> None:
    async with serve(time_scale=1.0) as c:
        task = asyncio.create_task(c.post("/v1/completions",
                                          json={"prompt": [7] * 1000, "max_tokens": 200}))
        engine = engine_of(c)
        while engine.scheduler.num_running == 0:
            await asyncio.sleep(0.005)
        usage = engine.scheduler.kv_usage
        assert usage > 0
        assert f"vllm:kv_cache_usage_perc{{model_name=\"llama-3-8b\"}} {usage}" in (
            await c.get("/metrics")).text
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert engine.scheduler.num_running == 0 and engine.scheduler.pool.used == 0


async def test_ttft_follows_the_roofline_at_the_time_scale() -> None:
    # Llama-3-70B TP=4 on H100, a 4096-token prompt: one ~0.3 s prefill step.
    from pdctl_api import profiles

    m, hw = profiles.model("llama-3-70b"), profiles.hardware("h100-sxm")
    modelled = profiles.step_seconds(m, hw, 4, 4096, 0, [])
    async with serve(model="llama-3-70b", tp=4, time_scale=0.2) as c:
        r = await c.post("/v1/completions", json={"prompt": [3] * 4096, "max_tokens": 1})
    ttft_s = r.json()["metrics"]["time_to_first_token_ms"] / 1e3
    assert modelled * 0.2 * 0.95 <= ttft_s <= modelled * 0.2 + 0.05
