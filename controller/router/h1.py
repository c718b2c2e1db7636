"""A lean HTTP/1.1 client for the data path: keep-alive connections to engine instances, the
request written in one ``write``, responses parsed by ``httptools`` (the C parser uvicorn
uses).

Why not a general client: the router only ever POSTs JSON to plain-HTTP engines it knows,
and on the benchmark box a general client's per-request Python (URL objects, cookie jars,
tracing hooks, header multidicts) was most of the router's CPU -- aiohttp 0.28 ms per
request against 0.06 ms for this, measured against the same engine. What it does:

- one request at a time per connection; idle connections are reused, newest first, until
  ``keepalive_s`` (shorter than the engines' own keep-alive, so a request is never written
  to a connection the engine is closing);
- a reused connection that closes before any byte of the answer is retried once on a new
  one (the engine never saw that request), unless the caller says ``resend=False``;
- ``connect_timeout_s`` for connecting, ``read_timeout_s`` for each wait on the engine (a
  number, or a function read at each request: the routing table's live setting);
- a response not read to its end (client gone, error) closes its connection, which aborts
  the request on the engine; bodies are buffered up to ``HIGH_WATER`` bytes before reading
  from the engine pauses.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from functools import lru_cache
from typing import cast
from urllib.parse import urlsplit

import httptools

from controller.router.upstream import UpstreamError, UpstreamReply

HIGH_WATER = 1 << 20


@lru_cache(maxsize=4096)
def _target(url: str) -> tuple[str, int, bytes, bytes]:
    """``http://host:port/path`` -> host, port, path bytes, Host header value."""
    u = urlsplit(url)
    if u.scheme != "http" or not u.hostname:
        raise UpstreamError(f"unsupported engine URL {url!r}: plain http://host:port only",
                            sent=False)
    port = u.port or 80
    path = (u.path or "/") + (f"?{u.query}" if u.query else "")
    return u.hostname, port, path.encode("latin-1"), (u.netloc or u.hostname).encode("latin-1")


def _expire(waiter: asyncio.Future[None], timeout_s: float) -> None:
    if not waiter.done():
        waiter.set_exception(UpstreamError(f"no answer from the engine within {timeout_s:g} s"))


class _Conn(asyncio.Protocol):
    """One connection and the response currently arriving on it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # Kept: on Python 3.11 every asyncio.get_running_loop() is a getpid() system call.
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.lost = False  # the connection ended (either side)
        self.idle_since = 0.0
        self.live: set[_Conn] | None = None  # its engine's open connections (``H1Upstream.cut``)
        self._reset()

    def _reset(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.content_type = "application/json"
        self.keep_alive = False
        self.headers_done = False
        self.complete = False
        self.received = False  # any byte of the current response
        self.error: UpstreamError | None = None
        self.body: deque[bytes] = deque()
        self.buffered = 0
        self.paused = False
        self.waiter: asyncio.Future[None] | None = None

    # ---- asyncio.Protocol -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.received = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(f"malformed response: {exc}")
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = self.lost = True
        if self.live is not None:
            self.live.discard(self)
        if not self.complete:
            what = f": {exc}" if exc else ""
            self._fail(f"connection closed before the response was complete{what}")

    # ---- httptools callbacks ------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"content-type":
            self.content_type = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.keep_alive = self.parser.should_keep_alive()
        self.headers_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.body.append(bytes(body))
        self.buffered += len(body)
        if self.buffered > HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self._wake()

    # ---- for the client -----------------------------------------------------------------

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def _fail(self, message: str) -> None:
        if self.error is None:
            self.error = UpstreamError(message)
        self._wake()

    async def wait(self, timeout_s: float) -> None:
        """Until the parser has more for the reader (or the connection failed). A plain timer
        rather than ``asyncio.timeout``: this runs for every chunk relayed."""
        loop = self.loop
        waiter = self.waiter = loop.create_future()
        timer = loop.call_later(timeout_s, _expire, waiter, timeout_s)
        try:
            await waiter
        finally:
            timer.cancel()
            self.waiter = None

    def take(self) -> bytes:
        """Everything received so far, as one piece: pieces that arrived together go on
        together (one write to the client instead of several)."""
        body = self.body
        chunk = body.popleft() if len(body) == 1 else b"".join(body)
        body.clear()
        self.buffered = 0
        if self.paused and self.buffered < HIGH_WATER // 2 and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        return chunk

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.closed = True
            self.transport.close()

    def cut(self, message: str) -> None:
        """End the connection now, its current exchange failing with ``message``."""
        self._fail(message)
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


class _Response:
    """A response being read (``Stream``); hands its connection back when read to the end."""

    def __init__(self, client: H1Upstream, key: tuple[str, int], conn: _Conn) -> None:
        self._client, self._key, self._conn = client, key, conn
        self.status = conn.status
        self.content_type = conn.content_type
        self._done = False

    async def chunks(self) -> AsyncIterator[bytes]:
        conn, timeout = self._conn, self._client.read_timeout_s
        while True:
            while conn.body:
                yield conn.take()
            if conn.complete:
                return
            if conn.error is not None:
                raise conn.error
            await conn.wait(timeout)

    async def read(self) -> bytes:
        return b"".join([c async for c in self.chunks()])

    def close(self) -> None:
        if self._done:
            return
        self._done = True
        conn = self._conn
        if conn.complete and conn.keep_alive and not conn.closed and not conn.body:
            self._client.release(self._key, conn)
        else:
            conn.close()


class H1Upstream:
    """``Upstream`` over pooled HTTP/1.1 connections (see the module docstring)."""

    def __init__(self, read_timeout_s: float | Callable[[], float],
                 connect_timeout_s: float = 5.0, keepalive_s: float = 2.0,
                 max_idle_per_host: int = 1024) -> None:
        self._read_timeout = (read_timeout_s if callable(read_timeout_s)
                              else lambda: read_timeout_s)
        self.connect_timeout_s = connect_timeout_s
        self.keepalive_s = keepalive_s
        self.max_idle = max_idle_per_host
        self._idle: dict[tuple[str, int], list[_Conn]] = {}
        self._live: dict[tuple[str, int], set[_Conn]] = {}  # every open connection, by engine
        self._closed: str | None = None  # why no request may start any more (``cut_all``)

    @property
    def read_timeout_s(self) -> float:
        return self._read_timeout()

    # ---- the pool ---------------------------------------------------------------------

    def _reuse(self, key: tuple[str, int]) -> _Conn | None:
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if not conn.closed and now - conn.idle_since < self.keepalive_s:
                return conn
            conn.close()
        return None

    async def _connect(self, key: tuple[str, int]) -> _Conn:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, conn = await loop.create_connection(lambda: _Conn(loop), key[0], key[1])
        except TimeoutError:
            raise UpstreamError(f"connect to {key[0]}:{key[1]} timed out after "
                                f"{self.connect_timeout_s:g} s", sent=False) from None
        except OSError as exc:
            raise UpstreamError(f"connect to {key[0]}:{key[1]} failed: "
                                f"{exc.strerror or exc}", sent=False) from None
        if not conn.lost:
            conn.live = self._live.setdefault(key, set())
            conn.live.add(conn)
        return conn

    def cut(self, url: str, message: str) -> int:
        """The engine at ``url`` is written off (failed by the controller, perhaps unreachable
        with connections that would otherwise wait out the read timeout): every connection to
        it ends now, each exchange on one failing with ``message``. How many were open."""
        host, port, _, _ = _target(url)
        return self._cut((host, port), message)

    def _cut(self, key: tuple[str, int], message: str) -> int:
        self._idle.pop(key, None)
        conns = self._live.pop(key, set())
        for conn in conns:
            conn.live = None
            conn.cut(message)
        return len(conns)

    @property
    def closed(self) -> str | None:
        """Why no request may start any more (``cut_all``); None while they may."""
        return self._closed

    def cut_all(self, message: str) -> int:
        """The controller is going away: every connection ends now, as ``cut`` ends one
        engine's, and no request starts any more (each fails with ``message`` at once, so no
        retry outlives the shutdown). How many were open."""
        self._closed = message
        return sum(self._cut(key, message) for key in list(self._live))

    def release(self, key: tuple[str, int], conn: _Conn) -> None:
        idle = self._idle.setdefault(key, [])
        if len(idle) >= self.max_idle:
            conn.close()
            return
        conn.idle_since = time.monotonic()
        idle.append(conn)

    # ---- requests ---------------------------------------------------------------------

    async def open(self, url: str, payload: bytes, headers: Mapping[str, str],
                   resend: bool = True, on_sent: Callable[[], None] | None = None
                   ) -> _Response:
        if self._closed is not None:
            raise UpstreamError(self._closed, sent=False)
        host, port, path, host_header = _target(url)
        key = (host, port)
        head = [b"POST ", path, b" HTTP/1.1\r\nHost: ", host_header,
                b"\r\nContent-Length: ", str(len(payload)).encode(), b"\r\n"]
        for name, value in headers.items():
            head += [name.encode("latin-1"), b": ", value.encode("latin-1"), b"\r\n"]
        data = b"".join(head) + b"\r\n" + payload
        conn = self._reuse(key)
        if conn is not None:
            try:
                return await self._exchange(key, conn, data, on_sent)
            except UpstreamError:
                if conn.received or not conn.lost or not resend:
                    raise  # an answer began, the engine is slow, or the caller forbids it
                # The engine closed the idle connection as the request went out: it never
                # saw the request, so send it once more on a new connection.
        return await self._exchange(key, await self._connect(key), data, on_sent)

    async def _exchange(self, key: tuple[str, int], conn: _Conn, data: bytes,
                        on_sent: Callable[[], None] | None) -> _Response:
        conn._reset()
        assert conn.transport is not None
        try:
            conn.transport.write(data)  # closing the transport later still sends it whole
            if on_sent is not None:
                on_sent()
            while not conn.headers_done:
                if conn.error is not None:
                    raise conn.error
                await conn.wait(self.read_timeout_s)
        except BaseException:
            conn.close()
            raise
        return _Response(self, key, conn)

    async def post(self, url: str, payload: bytes, headers: Mapping[str, str],
                   resend: bool = True) -> UpstreamReply:
        resp = await self.open(url, payload, headers, resend)
        try:
            return UpstreamReply(resp.status, await resp.read())
        finally:
            resp.close()

    async def close(self) -> None:
        """Close the idle connections (a response still being read closes its own)."""
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()
