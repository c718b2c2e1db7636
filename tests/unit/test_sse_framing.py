"""The streaming relay edits whole server-sent events, however the network splits them: the
router's ``kv_transfer_params`` and the usage event the client did not ask for never reach
the client, for a stream split at every byte boundary (and at every pair of them)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import orjson

from controller.router.answer import Answer
from controller.router.request import Ctx
from controller.router.sse import DONE_EVENT, EventFramer


def event(data: dict[str, object]) -> bytes:
    return b"data: " + orjson.dumps(data) + b"\n\n"


FIRST = {"id": "cmpl-1", "choices": [{"index": 0, "text": "a"}]}
SECOND = {"id": "cmpl-1", "choices": [{"index": 0, "text": "b"}]}
USAGE = {"id": "cmpl-1", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
KV = {"remote_engine_id": "p-1", "remote_block_ids": [1, 2], "remote_host": "127.0.0.1"}
STREAM = (event({**FIRST, "kv_transfer_params": KV}) + event(SECOND) + event(USAGE)
          + DONE_EVENT)
EXPECTED = event(FIRST) + event(SECOND) + DONE_EVENT


class Reads:
    """A decode stream (``Stream``) delivered in the given reads."""

    status, content_type = 200, "text/event-stream"

    def __init__(self, reads: list[bytes]) -> None:
        self._reads = reads

    async def chunks(self) -> AsyncIterator[bytes]:
        for read in self._reads:
            yield read

    async def read(self) -> bytes:
        return b"".join(self._reads)

    def close(self) -> None:
        pass


def ctx(strip_usage: bool = True) -> Ctx:
    return Ctx(rid="r", endpoint="/v1/completions", body={}, stream=True, prompt_tokens=3,
               t0=0.0, started_at=0.0, strip_usage=strip_usage)


async def relay(reads: list[bytes], strip_usage: bool = True, ends: bool = True
                ) -> tuple[bytes, Answer, Ctx]:
    """The client's body; ``ends``: the stream's end marker ends it (without one, the data
    plane ends the body after the relay)."""
    c = ctx(strip_usage)
    answer = Answer(200, "text/event-stream", None, ctx=c, resp=Reads(reads))
    out: list[tuple[bytes, bool]] = []

    async def write(chunk: bytes, more: bool) -> None:
        assert not out or out[-1][1], "written after the end of the body"
        out.append((chunk, more))

    await answer.relay(write)
    assert out and (out[-1][1] is False) is ends, out
    return b"".join(c for c, _ in out), answer, c


def splits(data: bytes) -> list[list[bytes]]:
    """``data`` cut at every byte boundary, at every pair of them, and byte by byte."""
    n = len(data)
    cuts = [[data[:i], data[i:]] for i in range(1, n)]
    cuts += [[data[:i], data[i:j], data[j:]] for i in range(1, n) for j in range(i + 1, n)]
    cuts.append([data[k:k + 1] for k in range(n)])
    return cuts


def test_every_split_of_a_stream_reaches_the_client_edited() -> None:
    async def run() -> int:
        for reads in splits(STREAM):
            body, answer, _ = await relay(reads)
            assert body == EXPECTED, reads
            assert answer.outcome == "ok" and answer.done
            status, last, error = answer.result(None)
            assert status == "ok" and error is None
            assert last is not None and last["usage"]["completion_tokens"] == 2  # accounting
        return len(splits(STREAM))

    n = len(STREAM)
    assert asyncio.run(run()) == (n - 1) + (n - 1) * (n - 2) // 2 + 1


def test_a_client_that_asked_for_usage_gets_it_whole_in_every_split() -> None:
    expected = event(FIRST) + event(SECOND) + event(USAGE) + DONE_EVENT

    async def run() -> None:
        for reads in splits(STREAM)[:: 7]:
            body, _, _ = await relay(reads, strip_usage=False)
            assert body == expected, reads

    asyncio.run(run())


def test_one_gap_per_write_of_events_not_per_read() -> None:
    """Half an event is not a token: the gaps the record keeps are between writes."""
    reads = [STREAM[:10], STREAM[10:-5], STREAM[-5:]]

    async def run() -> list[float]:
        _, _, c = await relay(reads)
        return c.gaps

    assert len(asyncio.run(run())) == 0  # one write of events, then the end marker


def test_a_stream_cut_off_mid_event_is_still_edited_and_ended() -> None:
    cut = event({**FIRST, "kv_transfer_params": KV})[:-2]  # no blank line: the engine closed

    async def run() -> bytes:
        body, answer, _ = await relay([cut[:20], cut[20:]], ends=False)
        assert answer.outcome == "ok"
        return body

    body = asyncio.run(run())
    assert b"kv_transfer_params" not in body and b'"text":"a"' in body


def test_framer_passes_whole_reads_through_and_keeps_partial_events() -> None:
    f = EventFramer()
    whole = event(FIRST)
    assert f.feed(whole) is whole  # the usual read: no copy
    assert f.feed(whole[:7]) == b""
    assert f.feed(whole[7:] + whole[:3]) == whole
    assert f.flush() == whole[:3] and f.flush() == b""
    crlf = b"data: {}\r\n\r\ndata: {\"a\""
    assert f.feed(crlf) == b"data: {}\r\n\r\n"
    assert f.feed(b":1}\r\n\r\n") == b"data: {\"a\":1}\r\n\r\n"
