"""``accounting.account``: what the router measured of a finished request -> its record."""

from __future__ import annotations

from typing import Any

from controller.models import RequestPath
from controller.router.accounting import KvCosts, Measured, account
from pdctl_api import profiles

MODEL = profiles.model("llama-3-8b")
COSTS = KvCosts(MODEL, 16, profiles.link("ib-ndr"))


def measured(**over: Any) -> Measured:
    base: dict[str, Any] = {
        "rid": "r1", "endpoint": "/v1/completions", "stream": True,
        "path": RequestPath.DISAGGREGATED, "status": "ok", "error": None,
        "started_at": 1.7e9, "t0": 10.0, "decode_sent": 10.050, "first_at": 10.080,
        "end": 10.200, "counted_prompt_tokens": 90, "response": None,
        "prefill_instance": "prefill-1", "decode_instance": "decode-1"}
    return Measured(**{**base, **over})


def test_a_stream_takes_its_ttft_from_the_first_chunk_and_tokens_from_usage() -> None:
    rec = account(measured(response={
        "usage": {"prompt_tokens": 100, "completion_tokens": 7},
        "metrics": {"queue_time_ms": 4, "time_to_first_token_ms": 6, "mean_itl_ms": 2.5,
                    "kv_transfer_ms": 3}}), COSTS)
    assert rec.ttft_ms == 80.0 and rec.e2e_ms == 200.0
    assert (rec.prompt_tokens, rec.output_tokens, rec.itl_ms) == (100, 7, 2.5)
    assert rec.kv_bytes == profiles.kv_bytes(MODEL, 100, 16)  # whole blocks of the prompt
    assert rec.transfer_ms == 3.0  # the engine's own report wins
    parts = rec.queue_ms + rec.prefill_ms + rec.transfer_ms + rec.decode_sched_ms
    assert abs(parts + rec.overhead_ms - rec.ttft_ms) < 1e-9


def test_without_usage_the_routers_own_token_count_stands() -> None:
    rec = account(measured(), COSTS)
    assert rec.prompt_tokens == 90 and rec.output_tokens == 0


def test_non_streaming_ttft_is_the_hop_start_plus_the_engines_first_token() -> None:
    rec = account(measured(stream=False, first_at=None, response={
        "metrics": {"queue_time_ms": 5, "time_to_first_token_ms": 15}}), COSTS)
    assert rec.ttft_ms == 70.0  # 50 ms to the decode hop + 20 ms on the engine


def test_non_streaming_without_engine_metrics_uses_the_hops_wall_time() -> None:
    rec = account(measured(stream=False, first_at=None), COSTS)
    assert rec.ttft_ms == 200.0  # to the end of the answer


def test_no_kv_is_counted_when_no_prefill_answered() -> None:
    rec = account(measured(prefill_instance=None, status="cancelled",
                           error="client disconnected"), COSTS)
    assert rec.kv_bytes == 0 and rec.status == "cancelled" and rec.error
    assert account(measured(path=RequestPath.COLOCATED), COSTS).kv_bytes == 0


def test_transfer_estimate_prefers_the_decode_engines_recent_nixl_time() -> None:
    # vLLM reports no kv_transfer_ms: the estimate is capped by the decode queue time.
    response = {"metrics": {"queue_time_ms": 30, "time_to_first_token_ms": 1}}
    measured_nixl = account(measured(response=response, decode_recent_xfer_ms=12.0), COSTS)
    modelled = account(measured(response=response), COSTS)
    assert measured_nixl.transfer_ms == 12.0
    expected = profiles.transfer_seconds(modelled.kv_bytes, COSTS.link) * 1e3
    assert abs(modelled.transfer_ms - round(min(expected, 30.0), 3)) < 1e-3
