"""The hub follows instances (a subscriber per watched instance on real ZMQ sockets, entries
dropped when it ends), and the cache report from records and index states: rates, drift,
decode bytes saved, and the warnings an operator must see at a glance."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest
import zmq

from controller.kvevents.hub import IndexState, KvEventsHub
from controller.kvevents.index import InstanceHealth
from controller.kvevents.report import cache_report
from controller.kvevents.wire import KVEventBatch, encode_message
from controller.models import RequestPath, RequestRecord, Role
from tests.unit.kvevents.events import PROMPT, B, stored

pytestmark = pytest.mark.timeout(30)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_a_watched_instance_is_indexed_and_an_ended_one_forgotten() -> None:
    port = free_port()
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.bind(f"tcp://127.0.0.1:{port}")
    hub = KvEventsHub(B, silence_s=None)
    try:
        # No replay endpoint answers: the start-up catch-up times out quietly.
        hub.watch("p-1", (f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{free_port()}"))
        hub.watch("x-1", None)  # publishes nothing: not in the index
        assert hub.watched("p-1") and not hub.watched("x-1")
        deadline = time.monotonic() + 10
        while hub.index.longest_prefix("p-1", _own(PROMPT)) == 0:
            assert time.monotonic() < deadline, "the subscriber never applied a batch"
            # seq 0 again until it lands: a SUB misses what is sent before it joins
            pub.send_multipart(encode_message("", 0, KVEventBatch(
                ts=0.0, events=[stored(PROMPT, 0, 3)])))
            await asyncio.sleep(0.2)
        [p, x] = hub.states(["p-1", "x-1"])
        assert p.watched and p.health is not None and p.health.blocks == 3
        assert not x.watched and x.health is None
        hub.unwatch("p-1")
        assert not hub.watched("p-1") and hub.index.instances() == []
    finally:
        await hub.close()
        pub.close(0)
        ctx.term()


def _own(tokens: list[int]) -> list[int]:
    from controller.kvevents.hashing import prompt_chain_hashes

    return prompt_chain_hashes(tokens, B)


def rec(rid: str, path: RequestPath, prompt: int, predicted: int | None,
        reported: int | None, decode_held: int | None = None, t: float = 100.0
        ) -> RequestRecord:
    disagg = path is RequestPath.DISAGGREGATED
    return RequestRecord(id=rid, started_at=t, endpoint="/v1/completions", path=path,
                         status="ok", stream=False, prompt_tokens=prompt, output_tokens=1,
                         prefill_instance="p-1" if disagg else None, decode_instance="d-1",
                         kv_bytes=1000 if disagg else 0, cached_tokens_predicted=predicted,
                         cached_tokens=reported, decode_cached_tokens_predicted=decode_held)


def health(name: str, stale: str | None = None) -> InstanceHealth:
    return InstanceHealth(name, 10, 5, stale is not None, stale, 1.0, 20, 0, 0, 0, 0)


def report(records: list[RequestRecord], states: list[IndexState],
           policies: tuple[str, str] = ("cache_aware", "cache_aware")) -> dict:
    return cache_report(records, states, {"p-1": Role.PREFILL, "d-1": Role.DECODE},
                        {Role.PREFILL: policies[0], Role.DECODE: policies[1]},
                        lambda tokens: tokens * 10, 60.0, 30.0, 90.0, 150.0)


def test_the_report_counts_hits_drift_and_decode_bytes_saved() -> None:
    records = [rec("a", RequestPath.DISAGGREGATED, 1000, 800, 800, decode_held=500),
               rec("b", RequestPath.COLOCATED, 1000, 600, 400, t=130.0),
               rec("c", RequestPath.COLOCATED, 200, None, None)]  # nothing known: left out
    out = report(records, [IndexState("p-1", True, health("p-1")),
                           IndexState("d-1", True, health("d-1"))])
    assert (out["requests"], out["prompt_tokens"]) == (2, 2000)
    assert (out["hit_rate"], out["predicted_hit_rate"]) == (0.6, 0.7)
    assert out["drift"] == pytest.approx(0.1)
    assert out["tokens_saved"] == 1200 and out["decode_kv_bytes_saved"] == 5000
    assert out["decode_kv_bytes_moved"] == 1000 and out["warnings"] == []
    by = {i["instance"]: i for i in out["instances"]}
    assert by["p-1"]["hit_rate"] == 0.8 and by["d-1"]["drift"] == pytest.approx(0.2)
    assert [b["hit_rate"] for b in out["buckets"]] == [0.8, 0.4]


def test_a_cache_aware_pool_routed_by_load_is_a_warning() -> None:
    out = report([], [IndexState("p-1", True, health("p-1", "no KV events for 30 s")),
                      IndexState("d-1", False, None)])
    assert len(out["warnings"]) == 2
    assert "prefill pool routes cache_aware but 1 of 1" in out["warnings"][0]
    assert "no KV events for 30 s" in out["warnings"][0]
    assert "publishes no KV events" in out["warnings"][1]
    quiet = report([], [IndexState("p-1", True, health("p-1", "stale"))],
                   ("round_robin", "least_loaded"))
    assert quiet["warnings"] == []  # nobody relies on the index


def test_large_drift_is_a_warning() -> None:
    records = [rec(str(k), RequestPath.COLOCATED, 1000, 900, 100) for k in range(10)]
    out = report(records, [])
    assert any("predicted 80% of prompt tokens more" in w for w in out["warnings"])


async def test_an_instance_whose_events_stop_is_marked_stale_and_routed_by_load() -> None:
    """Sent a prompt with new blocks, an engine that publishes nothing for ``silence_s`` is
    stale: no prefix is predicted on it (the cache-aware policy routes it by load) and the
    console's report warns."""
    hub = KvEventsHub(B, silence_s=0.5, clock=time.monotonic)
    try:
        hub.watch("p-1", (f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"))
        assert hub.index.trusted("p-1")
        hub.sent("p-1")
        deadline = time.monotonic() + 10
        while hub.index.trusted("p-1"):
            assert time.monotonic() < deadline, "a silent publisher was never marked stale"
            await asyncio.sleep(0.1)
        [state] = hub.states(["p-1"])
        assert state.health is not None and "no KV events for 0.5 s" in str(
            state.health.stale_reason)
        assert hub.index.longest_prefix("p-1", _own(PROMPT)) == 0
        out = report([], [state])
        assert "no KV events for 0.5 s" in out["warnings"][0]
    finally:
        await hub.close()
