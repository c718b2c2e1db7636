"""The router keeps vLLM's KV contract (proxy module docstring): decode chosen before the
prefill hop, a KV handle delivered at most once, late hops colocated, unread handles
released, at most two failed attempts that reached an engine."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from controller.models import RequestPath, Role
from controller.router.proxy import Proxy
from tests.unit.fake_engines import (
    KV,
    Answer,
    Call,
    Clock,
    FakeEngines,
    answers_503,
    decode_ok,
    died,
    idle,
    make_proxy,
    prefill_ok,
    refused,
    serve,
    settle,
)

LONG = b'{"prompt": "a prompt long enough to go disaggregated", "max_tokens": 2}'
LONG_STREAM = (b'{"prompt": "a prompt long enough to go disaggregated", "max_tokens": 2, '
               b'"stream": true}')


async def status_path(proxy: Proxy, raw: bytes = LONG) -> tuple[int, RequestPath]:
    served = await serve(proxy, raw)
    assert served.body
    return served.status, served.ctx.path


def releases(metric_proxy: Proxy, reason: str, result: str = "ok") -> float:
    return metric_proxy.metrics.kv_releases.labels(reason, result)._value.get()


async def test_no_ready_decode_means_503_and_no_prefill_hop(tmp_path: Path) -> None:
    engines = FakeEngines()
    proxy, _ = make_proxy(tmp_path, engines, decode=0)
    served = await serve(proxy, LONG)
    assert served.status == 503 and b"no ready decode instance" in served.body
    assert served.record.status == "error"
    assert engines.attempts == []  # the prefill was never asked to hold blocks for nobody


async def test_handshake_goes_to_the_decode_chosen_first_and_exactly_once(tmp_path: Path
                                                                          ) -> None:
    engines = FakeEngines()
    proxy, table = make_proxy(tmp_path, engines)
    status, path = await status_path(proxy)
    assert (status, path) == (200, RequestPath.DISAGGREGATED)
    [hop] = engines.kv_deliveries()
    assert hop.kv == KV and hop.resend is False  # not even the HTTP client may re-send it
    assert [c.host for c in engines.calls] == ["prefill-1", hop.host]
    assert idle(table)


@pytest.mark.parametrize("failure", [died, answers_503])
async def test_a_failed_decode_hop_is_retried_colocated_never_with_the_same_handle(
        tmp_path: Path, failure: object) -> None:
    engines = FakeEngines({"decode-1": failure})  # type: ignore[dict-item]
    proxy, table = make_proxy(tmp_path, engines)
    status, path = await status_path(proxy)
    await settle(proxy)
    assert (status, path) == (200, RequestPath.COLOCATED)
    assert [c.host for c in engines.kv_deliveries()] == ["decode-1"]
    last = engines.calls[-1]
    assert last.host == "decode-2" and last.kv is None
    rec = proxy.requests.recent(1)[0]
    assert rec.kv_handle == "handle-1" and rec.prefill_instance == "prefill-1"
    assert rec.kv_bytes == 0 and rec.retries == 1
    assert releases(proxy, "decode_unavailable") == 0  # the engine may be reading it: no release
    assert idle(table)


async def test_an_unreachable_decode_never_received_the_handle_so_another_may(tmp_path: Path
                                                                              ) -> None:
    engines = FakeEngines({"decode-1": refused})
    proxy, _ = make_proxy(tmp_path, engines)
    status, path = await status_path(proxy)
    assert (status, path) == (200, RequestPath.DISAGGREGATED)
    assert [c.host for c in engines.kv_deliveries()] == ["decode-2"]


async def test_a_handle_no_decode_could_take_is_released_and_the_request_fails_clearly(
        tmp_path: Path) -> None:
    engines = FakeEngines({"decode-1": refused, "decode-2": refused})
    proxy, _ = make_proxy(tmp_path, engines, routing={"max_attempts": 2,
                                                      "disagg_min_prompt_tokens": 4})
    served = await serve(proxy, LONG)
    assert served.status == 502 and served.record.error
    await settle(proxy)
    assert engines.kv_deliveries() == []
    assert releases(proxy, "decode_unavailable", "failed") == 1  # no engine to release through


async def test_a_late_decode_hop_goes_colocated_and_the_handle_is_released(tmp_path: Path
                                                                          ) -> None:
    clock = Clock()

    async def connect_timeout(call: Call) -> Answer:
        clock.t += 16.0  # the next decode hop would leave 16 s into a 30 s lease
        return await refused(call)

    engines = FakeEngines({"decode-1": connect_timeout})
    proxy, _ = make_proxy(tmp_path, engines, clock=clock)
    status, path = await status_path(proxy)
    await settle(proxy)
    assert (status, path) == (200, RequestPath.COLOCATED)
    [release] = engines.kv_deliveries()
    assert release.is_release and release.kv == KV and release.path == "/v1/completions"
    assert releases(proxy, "late") == 1
    served = [c for c in engines.calls if c.host.startswith("decode") and not c.is_release]
    assert [c.kv for c in served] == [None]


async def test_a_handle_of_a_prefill_restarted_in_place_is_not_sent(tmp_path: Path) -> None:
    """The controller saw the prefill engine restart behind its address (a new incarnation)
    while the decode hop was being placed: the handle names blocks of a process that is gone,
    so no decode engine gets it and nothing is released through one; served colocated."""
    tables = []

    async def restart_seen(call: Call) -> Answer:
        [prefill] = tables[0].ready(Role.PREFILL)
        prefill.incarnation += 1  # what Registry.restarted does
        return await refused(call)

    engines = FakeEngines({"decode-1": restart_seen})
    proxy, table = make_proxy(tmp_path, engines)
    tables.append(table)
    status, path = await status_path(proxy)
    await settle(proxy)
    assert (status, path) == (200, RequestPath.COLOCATED)
    assert engines.kv_deliveries() == []  # decode-1 refused the connection; decode-2 not sent it
    rec = proxy.requests.recent(1)[0]
    assert rec.kv_handle is None and rec.decode_instance == "decode-2"
    assert engines.calls[-1].host == "decode-2" and engines.calls[-1].kv is None
    assert releases(proxy, "late") == releases(proxy, "decode_unavailable") == 0
    assert idle(table)


async def test_in_time_hop_is_not_late(tmp_path: Path) -> None:
    clock = Clock()

    async def prefill_14s(call: Call) -> Answer:
        clock.t += 14.0  # the prefill itself took long; the lease starts when it answered
        return await prefill_ok(call)

    engines = FakeEngines({"prefill-1": prefill_14s})
    proxy, _ = make_proxy(tmp_path, engines, clock=clock)
    assert await status_path(proxy) == (200, RequestPath.DISAGGREGATED)


async def test_a_client_gone_during_the_prefill_hop_gets_its_blocks_released(tmp_path: Path
                                                                             ) -> None:
    gate = asyncio.Event()

    async def gated_prefill(call: Call) -> Answer:
        await gate.wait()
        return await prefill_ok(call)

    engines = FakeEngines({"prefill-1": gated_prefill})
    proxy, table = make_proxy(tmp_path, engines)
    task = asyncio.create_task(serve(proxy, LONG))
    await asyncio.sleep(0.02)
    task.cancel()  # the client left while the prefill was computing
    with pytest.raises(asyncio.CancelledError):
        await task
    [rec] = proxy.requests.recent(1)  # recorded once, as cancelled
    assert rec.status == "cancelled" and rec.error == "client disconnected"
    assert rec.path is RequestPath.DISAGGREGATED and rec.kv_bytes == 0
    assert table.inflight("prefill-1") == 1  # the hop is still running
    assert table.inflight("decode-1") == 0  # the decode lease ended with the request
    gate.set()
    await settle(proxy)
    [release] = engines.kv_deliveries()
    assert release.is_release and release.kv == KV
    assert releases(proxy, "client_gone") == 1
    assert idle(table)


@pytest.mark.parametrize("written", [False, True])
async def test_a_client_gone_while_the_decode_hop_connects_gets_its_blocks_released(
        tmp_path: Path, written: bool) -> None:
    """Before the hop is written no engine has the handle: the router releases it. Once
    written, the decode engine aborts the request and frees the blocks itself."""
    connect, hop = asyncio.Event(), asyncio.Event()

    async def gated_decode(call: Call) -> Answer:
        if call.is_release:
            return await decode_ok(call)
        await hop.wait()
        return Answer(200, {"choices": [{"text": "ok"}]})

    engines = FakeEngines({"decode-1": gated_decode}, connecting={"decode-1": connect})
    if written:
        connect.set()
    proxy, table = make_proxy(tmp_path, engines, decode=1)
    task = asyncio.create_task(serve(proxy, LONG))
    for _ in range(100):
        await asyncio.sleep(0.01)
        if [c for c in engines.attempts if c.host == "decode-1"]:
            break
    assert [c.host for c in engines.attempts] == ["prefill-1", "decode-1"]
    task.cancel()  # the client left while the decode hop was connecting (or running)
    with pytest.raises(asyncio.CancelledError):
        await task
    connect.set()
    await settle(proxy)
    [rec] = proxy.requests.recent(1)
    assert rec.status == "cancelled" and rec.path is RequestPath.DISAGGREGATED
    released = [c for c in engines.calls if c.is_release]
    if written:
        assert released == [] and releases(proxy, "client_gone") == 0
    else:
        [release] = released
        assert release.kv == KV and releases(proxy, "client_gone") == 1
    assert idle(table)


async def test_at_most_two_attempts_that_reach_an_engine(tmp_path: Path) -> None:
    """A request that kills decode engines cannot walk the whole pool."""
    engines = FakeEngines({"decode-1": died, "decode-2": died, "decode-3": died})
    proxy, table = make_proxy(tmp_path, engines, decode=3, routing={
        "max_attempts": 5, "disagg_min_prompt_tokens": 4, "decode_policy": "round_robin"})
    served = await serve(proxy, LONG)
    assert served.status == 502
    reached = [c for c in engines.calls if c.host.startswith("decode") and not c.is_release]
    assert len(reached) == 2 and len({c.host for c in reached}) == 2
    assert reached[0].kv is not None and reached[1].kv is None
    assert served.record.status == "error" and idle(table)


async def test_colocated_request_is_retried_once_after_its_engine_died(tmp_path: Path) -> None:
    engines = FakeEngines({"decode-1": died})
    proxy, _ = make_proxy(tmp_path, engines, prefill=0)
    status, path = await status_path(proxy, b'{"prompt": "hi", "max_tokens": 2}')
    assert (status, path) == (200, RequestPath.COLOCATED)
    assert [c.host for c in engines.calls] == ["decode-1", "decode-2"]


async def test_client_errors_from_the_decode_engine_are_passed_on_not_retried(tmp_path: Path
                                                                             ) -> None:
    async def bad_request(call: Call) -> Answer:
        return Answer(400, {"error": {"message": "max_tokens must be at least 1"}})

    engines = FakeEngines({"decode-1": bad_request, "decode-2": bad_request})
    proxy, _ = make_proxy(tmp_path, engines)
    status, path = await status_path(proxy)
    assert (status, path) == (400, RequestPath.DISAGGREGATED)
    assert len(engines.kv_deliveries()) == 1  # vLLM releases a rejected handle itself


class StuckStream(Answer):
    """A 200 stream whose first token never comes (a KV read that does not complete)."""

    closed = False

    async def chunks(self) -> AsyncIterator[bytes]:
        await asyncio.Event().wait()
        yield b""

    def close(self) -> None:
        StuckStream.closed = True


async def test_a_stuck_kv_read_is_aborted_at_the_late_budget_and_served_colocated(
        tmp_path: Path) -> None:
    async def stuck(call: Call) -> Answer:
        return StuckStream(200, {})

    engines = FakeEngines({"decode-1": stuck})
    # lease 6 s x share 0.02: the first token must come within 0.12 s of the prefill answer.
    proxy, table = make_proxy(tmp_path, engines, kv={"lease_s": 6, "late_hop_share": 0.02})
    served = await asyncio.wait_for(serve(proxy, LONG_STREAM), 5)
    assert served.body  # the colocated attempt's answer
    rec = served.record
    assert StuckStream.closed  # the stuck hop was aborted on its engine
    assert rec.path is RequestPath.COLOCATED and rec.decode_instance == "decode-2"
    assert rec.kv_handle is None  # its late read answered nobody
    assert [c.host for c in engines.kv_deliveries()] == ["decode-1"]
    assert engines.calls[-1].host == "decode-2" and engines.calls[-1].kv is None
    assert proxy.metrics.kv_stuck_reads._value.get() == 1
    assert idle(table)


async def test_a_stream_whose_first_token_comes_in_time_is_relayed_whole(tmp_path: Path
                                                                        ) -> None:
    engines = FakeEngines()
    proxy, _ = make_proxy(tmp_path, engines)
    served = await serve(proxy, LONG_STREAM)
    assert b'"ok"' in served.body and served.ctx.first_at is not None
    assert served.ctx.path is RequestPath.DISAGGREGATED and served.record.status == "ok"


async def test_with_one_decode_instance_the_colocated_attempt_goes_to_it_again(
        tmp_path: Path) -> None:
    """The engine behind a stuck read is alive: with no other decode instance, the colocated
    attempt goes to it (seen on the real lab: otherwise the request failed)."""
    calls = 0

    async def stuck_then_fine(call: Call) -> Answer:
        nonlocal calls
        calls += 1
        return StuckStream(200, {}) if call.kv else Answer(200, {"choices": [{"text": "ok"}]})

    engines = FakeEngines({"decode-1": stuck_then_fine})
    proxy, _ = make_proxy(tmp_path, engines, decode=1,
                          kv={"lease_s": 6, "late_hop_share": 0.02})
    served = await asyncio.wait_for(serve(proxy, LONG_STREAM), 5)
    assert b'"ok"' in served.body
    assert calls == 2 and served.ctx.path is RequestPath.COLOCATED
    assert [c.kv is None for c in engines.calls if c.host == "decode-1"] == [False, True]
