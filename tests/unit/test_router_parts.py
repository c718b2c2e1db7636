"""Small router pieces: policies, SSE tail parsing, load parsing, token counting, request log."""

from __future__ import annotations

from collections import Counter

from controller.fleet.observer import EngineLoad, parse_load
from controller.fleet.registry import Registry
from controller.models import Instance, RequestPath, RequestRecord, Role
from controller.requests_log import RequestLog, percentiles, stats
from controller.router.bodies import prefill_body
from controller.router.policies import LeastLoaded, RoundRobin, make_policy
from controller.router.sse import last_event
from controller.tokens import EstimatingCounter, estimate_tokens


def instances(n: int) -> list[Instance]:
    return [Instance(f"d{i}", Role.DECODE, 1, f"http://x/{i}") for i in range(n)]


def test_round_robin_visits_everyone_evenly() -> None:
    pool, rr = instances(3), RoundRobin()
    counts = Counter(rr.choose(pool, {}).id for _ in range(300))
    assert set(counts.values()) == {100}


def test_least_loaded_prefers_idle_and_rotates_ties() -> None:
    pool, ll = instances(3), LeastLoaded()
    inflight = {"d0": 2}
    pool[1].waiting = 1
    assert ll.choose(pool, inflight).id == "d2"
    inflight["d2"] = 1
    pool[1].waiting = 0
    assert ll.choose(pool, inflight).id == "d1"
    pool[1].waiting = 0
    assert len({ll.choose(pool, {}).id for _ in range(3)}) == 3


def test_unknown_policy() -> None:
    try:
        make_policy("random")
    except ValueError as exc:
        assert "round_robin" in str(exc)
    else:
        raise AssertionError("expected ValueError")


def test_prefill_body_is_vllm_nixl_shape() -> None:
    body = prefill_body({"prompt": "x", "stream": True, "stream_options": {}, "max_tokens": 9})
    assert body["max_tokens"] == 1 and body["stream"] is False and "stream_options" not in body
    assert body["kv_transfer_params"]["do_remote_decode"] is True
    assert body["kv_transfer_params"]["do_remote_prefill"] is False


def test_last_event_merges_usage_and_metrics() -> None:
    tail = (b'data: {"choices":[{"text":"a"}]}\n\n'
            b'data: {"choices":[{"finish_reason":"length"}],"metrics":{"queue_time_ms":1}}\n\n'
            b'data: {"choices":[],"usage":{"prompt_tokens":3}}\n\ndata: [DONE]\n\n')
    ev = last_event(tail)
    assert ev is not None
    assert ev["usage"] == {"prompt_tokens": 3} and ev["metrics"] == {"queue_time_ms": 1}


def test_parse_load_sums_series() -> None:
    text = ('# HELP x\nvllm:num_requests_running{engine="0",model_name="m"} 3.0\n'
            'vllm:num_requests_running{engine="1",model_name="m"} 2.0\n'
            'vllm:num_requests_waiting{model_name="m"} 4.0\n'
            'vllm:kv_cache_usage_perc{model_name="m"} 0.25\n')
    assert parse_load(text) == {"running": 5.0, "waiting": 4.0, "kv_usage": 0.25}


def test_token_fallback() -> None:
    assert estimate_tokens("") == 0 and estimate_tokens("abcd" * 10) == 10
    c = EstimatingCounter()
    assert c.count({"prompt": [1, 2, 3]}) == 3
    assert c.count({"messages": [{"role": "user", "content": "x" * 40}]}) == 12


def rec(i: int, t: float, ttft: float, status: str = "ok") -> RequestRecord:
    return RequestRecord(f"r{i}", t, "/v1/completions", RequestPath.DISAGGREGATED, status,
                         False, 100, 10, "p", "d", transfer_ms=ttft / 4, ttft_ms=ttft,
                         kv_bytes=1000)


def test_request_log_is_bounded_and_windowed() -> None:
    log = RequestLog(maxlen=100)
    for i in range(250):
        log.add(rec(i, 1000.0 + i, float(i)))
    assert len(log) == 100 and log.total == 250
    assert [r.id for r in log.recent(2)] == ["r249", "r248"]
    assert len(log.window(10.0, now=1249.5)) == 10


def test_stats_percentiles_and_alert() -> None:
    records = [rec(i, float(i), float(i + 1)) for i in range(100)]
    out = stats(records, 100.0, alert_share=0.2)
    assert out["ttft_ms"]["p50"] == 50.0 and out["ttft_ms"]["p99"] == 99.0
    assert out["request_rate"] == 1.0 and out["disaggregated_share"] == 1.0
    assert out["transfer_share"]["alert"] is True  # transfer is 25% of TTFT
    assert percentiles([])["p50"] == 0.0


def test_rates_divide_by_the_part_of_the_window_the_log_has_recorded() -> None:
    log = RequestLog(maxlen=1000)
    log.since = 1000.0  # the controller started at 1000
    for i in range(200):  # 10 requests/s for 20 s
        log.add(rec(i, 1000.0 + i / 10, 10.0))
    now = 1020.0
    assert log.covered(300.0, now) == 20.0 and log.covered(10.0, now) == 10.0
    out = stats(log.columns(300.0, now), 300.0, 0.2, log.covered(300.0, now))
    assert out["covered_s"] == 20.0 and out["request_rate"] == 10.0  # not 200 / 300
    assert out["kv"]["bytes_per_s"] == 200 * 1000 / 20.0
    log.add(rec(999, 900.0, 10.0))  # a record older than the log's start (a restore)
    assert log.since == 900.0 and log.covered(300.0, now) == 120.0


def test_timeseries_buckets() -> None:
    from controller.requests_log import timeseries

    records = [rec(i, 1000.0 + i * 0.5, 10.0 * (i % 3 + 1)) for i in range(40)]  # 20 s
    out = timeseries(records, window_s=20.0, step_s=5.0, now=1020.0)
    assert [b["requests"] for b in out] == [10, 10, 10, 10]
    assert out[0]["t"] == 1000.0 and out[0]["rate"] == 2.0
    assert out[0]["disaggregated"] == 10 and out[0]["kv_bytes"] == 10_000
    parts = out[0]["parts_mean_ms"]
    assert set(parts) == {"queue", "prefill", "transfer", "decode_sched", "overhead"}
    assert parts["transfer"] > 0 and out[0]["ttft_ms"]["p99"] == 30.0
    # What the Overview draws besides TTFT: by path, end to end, tokens per second.
    assert out[0]["ttft_by_path"]["disaggregated"] == {"p50": 20.0, "p99": 30.0}
    assert out[0]["ttft_by_path"]["colocated"] is None
    assert out[0]["e2e_p99_ms"] == max(r.e2e_ms for r in records[:10])
    assert out[0]["prompt_tokens_per_s"] == sum(r.prompt_tokens for r in records[:10]) / 5.0
    assert out[0]["output_tokens_per_s"] == sum(r.output_tokens for r in records[:10]) / 5.0


def test_streaming_decode_hop_asks_for_usage_and_relay_strips_it() -> None:
    from controller.router.bodies import decode_body
    from controller.router.sse import strip_usage_event

    body, strip = decode_body({"prompt": "x", "stream": True}, {"do_remote_prefill": True})
    assert strip and body["stream_options"] == {"include_usage": True}
    assert body["kv_transfer_params"] == {"do_remote_prefill": True}
    asked = {"prompt": "x", "stream": True, "stream_options": {"include_usage": True}}
    assert decode_body(asked, None) == (asked, False)
    assert decode_body({"prompt": "x"}, None) == ({"prompt": "x"}, False)
    chunk = (b'data: {"choices":[{"text":"a","finish_reason":"length"}]}\n\n'
             b'data: {"choices":[],"usage":{"prompt_tokens":1},"metrics":{}}\n\n'
             b"data: [DONE]\n\n")
    out = strip_usage_event(chunk)
    assert b"usage" not in out and b'"text":"a"' in out and b"[DONE]" in out
    assert strip_usage_event(b'data: {"choices":[{"text":"b"}]}\n\n') == (
        b'data: {"choices":[{"text":"b"}]}\n\n')


def test_apply_load_tracks_recent_nixl_transfer_time() -> None:
    inst = instances(1)[0]
    registry = Registry(None, lambda: 0.0)  # type: ignore[arg-type]  # no transitions here
    registry.apply_load(inst, EngineLoad(running=2, nixl_xfers=4, nixl_xfer_s=0.04, nixl_bytes=4e6))
    assert inst.running == 2 and inst.recent_xfer_ms == 10.0
    registry.apply_load(inst, EngineLoad(nixl_xfers=6, nixl_xfer_s=0.10, nixl_bytes=6e6))
    assert abs(inst.recent_xfer_ms - 30.0) < 1e-9  # (0.10 - 0.04) / 2 transfers
    registry.apply_load(inst, EngineLoad(nixl_xfers=6, nixl_xfer_s=0.10, nixl_bytes=6e6))
    assert abs(inst.recent_xfer_ms - 30.0) < 1e-9  # no new transfers: keep the last mean
