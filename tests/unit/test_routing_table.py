"""The routing table: leases that end exactly once on every exit path of a request (ok,
error, engine failure mid-stream, cancellation at every stage, a bug), and live settings."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from controller.errors import InvalidChange
from controller.models import Instance, Role
from controller.router.upstream import UpstreamError
from tests.unit.fake_engines import (
    Answer,
    Call,
    FakeEngines,
    died,
    idle,
    make_proxy,
    make_table,
    serve,
)

LONG = b'{"prompt": "a prompt long enough to go disaggregated", "max_tokens": 2}'
LONG_STREAM = (b'{"prompt": "a prompt long enough to go disaggregated", "max_tokens": 2, '
               b'"stream": true}')


def test_a_lease_counts_once_and_ends_once(tmp_path: Path) -> None:
    _, table = make_table(tmp_path)
    inst = table.ready(Role.DECODE)[0]
    with table.lease(inst) as lease, table.lease(inst):
        assert table.inflight(inst.id) == 2
        lease.release()
        lease.release()  # harmless
        assert table.inflight(inst.id) == 1
    assert table.inflight(inst.id) == 0 and idle(table)


def test_a_lease_ends_when_its_block_raises(tmp_path: Path) -> None:
    _, table = make_table(tmp_path)
    inst = table.ready(Role.DECODE)[0]
    with pytest.raises(RuntimeError), table.lease(inst):
        raise RuntimeError("boom")
    assert table.inflight(inst.id) == 0


class Stream(Answer):
    """A 200 event stream: ``events`` then, if ``die``, a lost connection."""

    def __init__(self, events: list[bytes], die: bool = False) -> None:
        super().__init__(200, {})
        self.content_type = "text/event-stream"
        self.events, self.die = events, die

    async def chunks(self) -> AsyncIterator[bytes]:
        for e in self.events:
            yield e
        if self.die:
            raise UpstreamError("connection lost mid-stream")


TOKEN = b'data: {"choices":[{"text":"a"}]}\n\n'
END = (b'data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2}}\n\n'
       b"data: [DONE]\n\n")


async def one_record(proxy: object) -> str:
    recs = proxy.requests.recent(10)  # type: ignore[attr-defined]
    assert len(recs) == 1, recs
    return str(recs[0].status)


@pytest.mark.parametrize(("raw", "decode", "status"), [
    (LONG, "ok", 200), (LONG_STREAM, "ok", 200), (LONG, "died", 502),
    (LONG_STREAM, "mid_stream", 200), (LONG, "503", 502)])
async def test_every_ending_leaves_no_request_in_flight(tmp_path: Path, raw: bytes,
                                                        decode: str, status: int) -> None:
    async def decode_behaviour(call: Call) -> Answer:
        if call.is_release:
            return Answer(400, {})
        if decode == "died":
            return await died(call)
        if decode == "503":
            return Answer(503, {"error": {"message": "dead"}})
        if call.body.get("stream"):
            return Stream([TOKEN, END], die=decode == "mid_stream")
        return Answer(200, {"choices": [{"text": "ok"}]})

    engines = FakeEngines({"decode-1": decode_behaviour, "decode-2": decode_behaviour})
    proxy, table = make_proxy(tmp_path, engines)
    served = await serve(proxy, raw)
    assert served.status == status
    expected = {"ok": "ok", "died": "error", "503": "error"}.get(decode, "ok")
    assert await one_record(proxy) == expected and idle(table)


async def test_no_decode_instance_leaves_nothing_counted(tmp_path: Path) -> None:
    proxy, table = make_proxy(tmp_path, FakeEngines(), decode=0)
    assert (await serve(proxy, LONG)).status == 503
    assert await one_record(proxy) == "error" and idle(table)


async def test_an_engine_that_ends_a_stream_early_gets_the_client_an_error_event(
        tmp_path: Path) -> None:
    async def breaks_off(call: Call) -> Answer:
        return Stream([TOKEN], die=True)

    proxy, table = make_proxy(tmp_path, FakeEngines({"decode-1": breaks_off}), prefill=0)
    served = await serve(proxy, b'{"prompt": "hi", "max_tokens": 2, "stream": true}')
    assert served.body.startswith(TOKEN) and b"upstream_error" in served.body
    assert served.body.endswith(b"data: [DONE]\n\n")
    assert served.record.status == "error" and "mid-stream" in (served.record.error or "")
    assert idle(table)


@pytest.mark.parametrize("stage", ["decode_open", "relay"])
async def test_cancellation_at_any_stage_is_recorded_once_and_leaks_nothing(
        tmp_path: Path, stage: str) -> None:
    gate = asyncio.Event()

    async def slow(call: Call) -> Answer:
        if stage == "decode_open":
            await gate.wait()
        return Stream([TOKEN, END])

    proxy, table = make_proxy(tmp_path, FakeEngines({"decode-1": slow}), prefill=0)
    ctx = proxy.new_ctx("/v1/completions", b'{"prompt": "hi", "stream": true}', None)

    async def client() -> None:
        async def write(chunk: bytes, more: bool) -> None:
            await gate.wait()  # a client that reads nothing

        async with proxy.serve(ctx) as answer:
            await answer.relay(write)

    task = asyncio.create_task(client())
    await asyncio.sleep(0.02)
    assert table.inflight("decode-1") == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await one_record(proxy) == "cancelled" and idle(table)


async def test_a_bug_while_answering_is_recorded_as_an_error_and_leaks_nothing(
        tmp_path: Path) -> None:
    proxy, table = make_proxy(tmp_path, FakeEngines(), prefill=0)
    ctx = proxy.new_ctx("/v1/completions", b'{"prompt": "hi", "stream": true}', None)

    async def broken_write(chunk: bytes, more: bool) -> None:
        raise RuntimeError("bug in the writer")

    with pytest.raises(RuntimeError):
        async with proxy.serve(ctx) as answer:
            await answer.relay(broken_write)
    [rec] = proxy.requests.recent(1)
    assert rec.status == "error" and "bug in the writer" in (rec.error or "")
    assert idle(table)


async def test_a_bug_while_routing_answers_500_and_leaks_nothing(tmp_path: Path) -> None:
    async def broken(call: Call) -> Answer:
        raise ValueError("bug in an upstream client")

    proxy, table = make_proxy(tmp_path, FakeEngines({"decode-1": broken}), prefill=0)
    served = await serve(proxy, b'{"prompt": "hi"}')
    assert served.status == 500 and b"internal error in the router" in served.body
    assert served.record.status == "error" and idle(table)


def test_settings_change_live_is_recorded_and_invalid_changes_nothing(tmp_path: Path) -> None:
    _, table = make_table(tmp_path)
    new = table.update({"request_timeout_s": 7.5, "decode_policy": "least_loaded"}, "test")
    assert table.settings is new and new.request_timeout_s == 7.5
    [event] = table.store.events(kind="routing.update")
    assert event["after"] == {"request_timeout_s": 7.5, "decode_policy": "least_loaded"}
    for bad in ({}, {"max_attempts": 0}):
        with pytest.raises(InvalidChange):
            table.update(bad, "test")
    assert table.settings is new and len(table.store.events(kind="routing.update")) == 1


def test_an_unreachable_instance_is_avoided_briefly_and_reported(tmp_path: Path) -> None:
    _, table = make_table(tmp_path, decode=2)
    seen: list[tuple[str, str]] = []
    table.on_unreachable = lambda inst, err: seen.append((inst.id, err))
    first: Instance = table.ready(Role.DECODE)[0]
    table.report_unreachable(first, "refused")
    assert seen == [("decode-1", "refused")] and table.suspect("decode-1")
    assert {table.pick(Role.DECODE, set()).id for _ in range(4)} == {"decode-2"}  # type: ignore[union-attr]
    table.clock.t += 3  # type: ignore[attr-defined]
    assert not table.suspect("decode-1")
