"""The router's HTTP/1.1 client against real sockets: a scripted engine server on loopback
answers each request the way a test needs (whole, chunked, late, never, cut off)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from controller.router.h1 import HIGH_WATER, H1Upstream
from controller.router.upstream import UpstreamError

Handler = Callable[[bytes, asyncio.StreamWriter, int], Awaitable[bool]]
HEADERS = {"Content-Type": "application/json", "X-Request-Id": "r-1"}


class Engine:
    """Accepts connections; for each request calls ``handler(request, writer, n)`` (n counts
    requests over all connections); the handler returns False to close the connection."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[bytes] = []
        self.connections = 0
        self.closed_by_client = 0
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> Engine:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    @property
    def url(self) -> str:
        assert self.server is not None
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/v1/completions"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length"))
                request = head + await reader.readexactly(length)
                self.requests.append(request)
                if not await self.handler(request, writer, len(self.requests)):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            self.closed_by_client += 1
        finally:
            writer.close()


def whole(body: bytes, extra: bytes = b"") -> bytes:
    return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + extra
            + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


async def answer_whole(request: bytes, writer: asyncio.StreamWriter, n: int) -> bool:
    writer.write(whole(b'{"n": %d}' % n))
    await writer.drain()
    return True


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


async def answer_stream(request: bytes, writer: asyncio.StreamWriter, n: int) -> bool:
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                 b"Transfer-Encoding: chunked\r\n\r\n")
    for i in range(3):
        writer.write(chunk(b"data: %d\n\n" % i))
        await writer.drain()
        await asyncio.sleep(0.01)
    writer.write(chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
    await writer.drain()
    return True


async def collect(stream: AsyncIterator[bytes]) -> list[bytes]:
    return [c async for c in stream]


async def test_post_writes_one_request_and_reuses_the_connection() -> None:
    async with Engine(answer_whole) as engine:
        client = H1Upstream(read_timeout_s=5)
        for n in (1, 2, 3):
            reply = await client.post(engine.url, b'{"prompt": "hi"}', HEADERS)
            assert (reply.status, reply.body) == (200, b'{"n": %d}' % n)
        assert engine.connections == 1
        first = engine.requests[0]
        assert first.startswith(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:")
        assert b"\r\nContent-Length: 16\r\n" in first and b"\r\nX-Request-Id: r-1\r\n" in first
        assert first.endswith(b'\r\n\r\n{"prompt": "hi"}')
        await client.close()


async def test_a_stream_arrives_chunk_by_chunk_and_frees_its_connection() -> None:
    async with Engine(answer_stream) as engine:
        client = H1Upstream(read_timeout_s=5)
        for _ in range(2):
            resp = await client.open(engine.url, b"{}", HEADERS)
            assert (resp.status, resp.content_type) == (200, "text/event-stream")
            got = await collect(resp.chunks())
            resp.close()
            assert b"".join(got) == b"data: 0\n\ndata: 1\n\ndata: 2\n\ndata: [DONE]\n\n"
            assert len(got) >= 2  # relayed as it came, not buffered to the end
        assert engine.connections == 1
        await client.close()


async def test_a_response_closed_before_its_end_closes_the_connection() -> None:
    async with Engine(answer_stream) as engine:
        client = H1Upstream(read_timeout_s=5)
        resp = await client.open(engine.url, b"{}", HEADERS)
        async for _ in resp.chunks():
            break
        resp.close()  # as when the client goes away mid-stream: the engine sees it
        for _ in range(100):
            if engine.closed_by_client:
                break
            await asyncio.sleep(0.01)
        assert engine.closed_by_client == 1
        reply = await client.post(engine.url, b"{}", HEADERS)  # a fresh connection
        assert reply.status == 200 and engine.connections == 2
        await client.close()


async def test_connection_close_answers_are_not_reused() -> None:
    async def close_each(request: bytes, writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(whole(b"{}", b"Connection: close\r\n"))
        await writer.drain()
        return False

    async with Engine(close_each) as engine:
        client = H1Upstream(read_timeout_s=5)
        for _ in range(3):
            assert (await client.post(engine.url, b"{}", HEADERS)).status == 200
        assert engine.connections == 3
        await client.close()


async def test_an_idle_connection_the_engine_closed_is_replaced_transparently() -> None:
    async def once_per_connection(request: bytes, writer: asyncio.StreamWriter,
                                  n: int) -> bool:
        writer.write(whole(b"{}"))  # keep-alive advertised, then closed anyway
        await writer.drain()
        return False

    async with Engine(once_per_connection) as engine:
        client = H1Upstream(read_timeout_s=5)
        assert (await client.post(engine.url, b"{}", HEADERS)).status == 200
        await asyncio.sleep(0.05)  # the engine's close reaches us: the idle one is dead
        assert (await client.post(engine.url, b"{}", HEADERS)).status == 200
        assert engine.connections == 2 and len(engine.requests) == 2
        await client.close()


async def test_idle_connections_expire_after_keepalive() -> None:
    async with Engine(answer_whole) as engine:
        client = H1Upstream(read_timeout_s=5, keepalive_s=0.05)
        await client.post(engine.url, b"{}", HEADERS)
        await asyncio.sleep(0.1)
        await client.post(engine.url, b"{}", HEADERS)
        assert engine.connections == 2
        await client.close()


async def test_refused_and_silent_engines_raise_upstream_error() -> None:
    async with Engine(answer_whole) as engine:
        url = engine.url
    client = H1Upstream(read_timeout_s=5)
    with pytest.raises(UpstreamError, match="connect to 127.0.0.1:.* failed"):
        await client.post(url, b"{}", HEADERS)

    async def silent(request: bytes, writer: asyncio.StreamWriter, n: int) -> bool:
        await asyncio.sleep(5)
        return False

    async with Engine(silent) as engine:
        client = H1Upstream(read_timeout_s=0.2)
        with pytest.raises(UpstreamError, match="no answer from the engine within 0.2 s"):
            await client.post(engine.url, b"{}", HEADERS)


async def test_a_slow_answer_on_a_reused_connection_is_not_sent_twice() -> None:
    async def second_hangs(request: bytes, writer: asyncio.StreamWriter, n: int) -> bool:
        if n == 2:
            await asyncio.sleep(1)
            return False
        return await answer_whole(request, writer, n)

    async with Engine(second_hangs) as engine:
        client = H1Upstream(read_timeout_s=0.2)
        assert (await client.post(engine.url, b"{}", HEADERS)).status == 200
        with pytest.raises(UpstreamError, match="no answer from the engine"):
            await client.post(engine.url, b"{}", HEADERS)
        assert len(engine.requests) == 2 and engine.connections == 1
        await client.close()


async def test_an_engine_dying_mid_stream_raises_after_what_it_sent() -> None:
    async def dies(request: bytes, writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                     + chunk(b"data: 0\n\n"))
        await writer.drain()
        await asyncio.sleep(0.05)
        return False

    async with Engine(dies) as engine:
        client = H1Upstream(read_timeout_s=5)
        resp = await client.open(engine.url, b"{}", HEADERS)
        got: list[bytes] = []
        with pytest.raises(UpstreamError, match="closed before the response was complete"):
            async for c in resp.chunks():
                got.append(c)
        assert got == [b"data: 0\n\n"]
        resp.close()


async def test_cut_ends_every_connection_to_an_engine_now() -> None:
    """A stream mid-answer and a request with no answer yet on one engine both end at once
    when the controller writes the engine off; another engine's connections are untouched."""
    async def stalls(request: bytes, writer: asyncio.StreamWriter, n: int) -> bool:
        if n == 1:  # answers whole: the stream reuses its connection
            return await answer_whole(request, writer, n)
        if n == 2:  # a stream that sends one event, then nothing
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                         + chunk(b"data: 0\n\n"))
            await writer.drain()
        await asyncio.sleep(30)
        return False

    async with Engine(stalls) as engine, Engine(answer_whole) as other:
        client = H1Upstream(read_timeout_s=60)
        assert (await client.post(engine.url, b"{}", HEADERS)).status == 200
        assert (await client.post(other.url, b"{}", HEADERS)).status == 200
        resp = await client.open(engine.url, b"{}", HEADERS)
        got: list[bytes] = []

        async def relay() -> None:
            async for c in resp.chunks():
                got.append(c)

        streaming = asyncio.ensure_future(relay())
        waiting = asyncio.ensure_future(client.post(engine.url, b"{}", HEADERS))
        while len(engine.requests) < 3 or not got:
            await asyncio.sleep(0.01)
        assert client.cut(engine.url, "decode-1 failed: 3 failed health checks") == 2
        for task in (streaming, waiting):
            with pytest.raises(UpstreamError, match="decode-1 failed: 3 failed health checks"):
                await asyncio.wait_for(task, 1)
        assert got == [b"data: 0\n\n"]
        resp.close()
        assert client.cut(engine.url, "again") == 0
        assert (await client.post(other.url, b"{}", HEADERS)).status == 200
        assert other.connections == 1  # its idle connection was kept and reused
        # Shutting down: the rest end, and no request starts any more.
        assert client.cut_all("the controller is shutting down") == 1
        with pytest.raises(UpstreamError, match="the controller is shutting down"):
            await client.post(other.url, b"{}", HEADERS)
        assert other.connections == 1
        await client.close()


async def test_malformed_answers_raise_upstream_error() -> None:
    async def garbage(request: bytes, writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.1)
        return False

    async with Engine(garbage) as engine:
        with pytest.raises(UpstreamError, match="malformed response"):
            await H1Upstream(read_timeout_s=5).post(engine.url, b"{}", HEADERS)


async def test_a_large_body_pauses_reading_and_arrives_whole() -> None:
    big = bytes(range(256)) * (3 * HIGH_WATER // 256)

    async def large(request: bytes, writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(whole(big))
        await writer.drain()
        return True

    async with Engine(large) as engine:
        client = H1Upstream(read_timeout_s=5)
        resp = await client.open(engine.url, b"{}", HEADERS)
        await asyncio.sleep(0.2)  # nobody reads: the client stops reading at its high water
        conn = resp._conn
        assert conn.paused and conn.buffered <= HIGH_WATER + (1 << 18)
        assert await resp.read() == big
        resp.close()
        assert (await client.post(engine.url, b"{}", HEADERS)).status == 200
        assert engine.connections == 1
        await client.close()


async def test_cancelling_a_request_closes_its_connection() -> None:
    async def slow(request: bytes, writer: asyncio.StreamWriter, n: int) -> bool:
        await asyncio.sleep(1)
        writer.write(whole(b"{}"))
        return True

    async with Engine(slow) as engine:
        client = H1Upstream(read_timeout_s=5)
        task = asyncio.create_task(client.post(engine.url, b"{}", HEADERS))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert client._idle.get(("127.0.0.1", int(engine.url.split(":")[2].split("/")[0]))
                                ) in (None, [])


async def test_on_sent_marks_a_request_written_whole_even_if_cancelled_at_once() -> None:
    async def slow(request: bytes, writer: asyncio.StreamWriter, n: int) -> bool:
        await asyncio.sleep(1)
        return False

    sent: list[str] = []
    async with Engine(slow) as engine:
        client = H1Upstream(read_timeout_s=5)
        task = asyncio.create_task(client.open(engine.url, b'{"kv": 1}', HEADERS, False,
                                               lambda: (sent.append("sent"), task.cancel())))
        with pytest.raises(asyncio.CancelledError):
            await task
        assert sent == ["sent"]
        for _ in range(100):  # the request reaches the engine whole, then the connection ends
            if engine.requests:
                break
            await asyncio.sleep(0.01)
        assert engine.requests and engine.requests[0].endswith(b'{"kv": 1}')
        refused = H1Upstream(read_timeout_s=1)
        with pytest.raises(UpstreamError) as exc:
            await refused.open("http://127.0.0.1:1/v1/completions", b"{}", HEADERS, False,
                               lambda: sent.append("refused"))
        assert exc.value.sent is False and sent == ["sent"]


def test_only_plain_http_urls() -> None:
    with pytest.raises(UpstreamError, match="plain http"):
        asyncio.run(H1Upstream(read_timeout_s=1).post("https://x:1/v1", b"{}", HEADERS))
