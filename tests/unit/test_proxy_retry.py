"""The router retries the only decode instance after a connect failure instead of failing
the request (nothing has reached the client yet)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path

import pytest

from controller.metrics import Metrics
from controller.requests_log import RequestLog
from controller.router.proxy import Proxy
from controller.router.upstream import UpstreamError, UpstreamReply
from controller.tokens import EstimatingCounter
from tests.unit.fake_engines import make_table, serve


async def test_single_decode_instance_is_retried_after_a_connect_timeout(tmp_path: Path
                                                                        ) -> None:
    settings, table = make_table(tmp_path, prefill=0, decode=1)
    upstream = FlakyEngine()
    proxy = Proxy(settings, table, upstream, EstimatingCounter(), RequestLog(100), Metrics())
    served = await serve(proxy, b'{"prompt": "hi", "max_tokens": 2}')
    assert served.status == 200 and upstream.calls == ["http://decode-1/v1/completions"] * 2
    assert served.body == b'{"choices": [{"text": "ok"}]}'
    assert served.record.retries == 1 and table.inflight("decode-1") == 0


class Answer:
    status = 200
    content_type = "application/json"

    async def chunks(self) -> AsyncIterator[bytes]:
        yield await self.read()

    async def read(self) -> bytes:
        return b'{"choices": [{"text": "ok"}]}'

    def close(self) -> None:
        pass


class FlakyEngine:
    """An upstream whose first connection attempt times out."""

    closed = None  # Upstream.closed: never shutting down here

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def post(self, url: str, payload: bytes, headers: Mapping[str, str],
                   resend: bool = True) -> UpstreamReply:
        raise AssertionError("no prefill hop expected")

    async def open(self, url: str, payload: bytes, headers: Mapping[str, str],
                   resend: bool = True, on_sent: Callable[[], None] | None = None) -> Answer:
        self.calls.append(url)
        if len(self.calls) == 1:
            raise UpstreamError("ConnectionTimeoutError: slow accept", sent=False)
        return Answer()

    async def close(self) -> None:
        pass


async def test_a_request_cancelled_during_its_prefill_hop_is_recorded_disaggregated(
        tmp_path: Path) -> None:
    settings, table = make_table(tmp_path, prefill=1, decode=1,
                                 routing={"disagg_min_prompt_tokens": 1})

    gate = asyncio.Event()

    class SlowPrefill(FlakyEngine):
        async def post(self, url: str, payload: bytes, headers: Mapping[str, str],
                       resend: bool = True) -> UpstreamReply:
            await gate.wait()
            raise UpstreamError("the engine aborted the request")

    proxy = Proxy(settings, table, SlowPrefill(), EstimatingCounter(), RequestLog(100),
                  Metrics())
    task = asyncio.create_task(serve(proxy, b'{"prompt": "a long prompt", "max_tokens": 2}'))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    [rec] = proxy.requests.recent(1)
    assert rec.path.value == "disaggregated" and rec.status == "cancelled"
    assert rec.kv_bytes == 0  # no KV was produced, so none is counted as moved
    # The hop is left to end (so that KV it may hold is released), then stops counting.
    assert table.inflight("prefill-1") == 1
    gate.set()
    await asyncio.sleep(0.05)
    assert table.inflight("prefill-1") == 0
    assert table.inflight("decode-1") == 0


async def test_a_request_cut_by_the_controllers_shutdown_gets_503_and_is_not_retried(
        tmp_path: Path) -> None:
    """The connection cut as the controller shuts down: not the fleet's failure (502) but
    the service going away (503, send it again); no other instance is tried."""
    settings, table = make_table(tmp_path, prefill=0, decode=2)

    class ShuttingDown(FlakyEngine):
        closed: str | None = None

        async def open(self, url: str, payload: bytes, headers: Mapping[str, str],
                       resend: bool = True, on_sent: Callable[[], None] | None = None
                       ) -> Answer:
            self.calls.append(url)
            self.closed = "the controller is shutting down"
            raise UpstreamError(f"{url}: the controller is shutting down", sent=True)

    upstream = ShuttingDown()
    proxy = Proxy(settings, table, upstream, EstimatingCounter(), RequestLog(100), Metrics())
    served = await serve(proxy, b'{"prompt": "hi", "max_tokens": 2}')
    assert served.status == 503, served.body
    assert b"the controller is shutting down" in served.body
    assert b"service_unavailable" in served.body and len(upstream.calls) == 1
