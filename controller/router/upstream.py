"""The router's HTTP client to engine instances: one pooled aiohttp session.

The data path is the controller's hottest code, and the HTTP client is most of its cost: on
this project's 2-core benchmark box an httpx request/stream costs about 0.9 ms of CPU, an
aiohttp one about 0.27 ms (``scripts/bench_router.py`` measures the router as a whole). The
proxy sees only this module's small surface -- ``post``, ``open`` and one error type -- so a
test can stand in a fake engine without sockets.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Protocol

import aiohttp


class UpstreamError(Exception):
    """The instance could not be reached, or the connection failed before an answer."""


@dataclass
class Reply:
    status: int
    body: bytes


class Stream(Protocol):
    """An open response: status and content type read, body not yet consumed."""

    status: int
    content_type: str

    def chunks(self) -> AsyncIterator[bytes]:
        """Body bytes as they arrive; raises UpstreamError if the connection fails."""
        ...

    async def read(self) -> bytes: ...

    def close(self) -> None:
        """Release the connection; an unread body closes it rather than reuse it."""
        ...


class Upstream(Protocol):
    async def post(self, url: str, payload: bytes, headers: Mapping[str, str]) -> Reply: ...

    async def open(self, url: str, payload: bytes, headers: Mapping[str, str]) -> Stream: ...

    async def close(self) -> None: ...


TRANSPORT_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError)


class _AiohttpStream:
    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp
        self.status = resp.status
        self.content_type = resp.headers.get("Content-Type", "application/json")

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._resp.content.iter_any():
                yield chunk
        except TRANSPORT_ERRORS as exc:
            raise UpstreamError(_describe(exc)) from exc

    async def read(self) -> bytes:
        try:
            return await self._resp.read()
        except TRANSPORT_ERRORS as exc:
            raise UpstreamError(_describe(exc)) from exc

    def close(self) -> None:
        if self._resp.content.at_eof():
            self._resp.release()  # the connection goes back to the pool
        else:
            self._resp.close()  # the engine sees the disconnect and aborts the request


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class AiohttpUpstream:
    """Keep-alive connections to every instance. Idle connections expire before the engines'
    own 5 s keep-alive (uvicorn), so a request is never written to a closing connection."""

    def __init__(self, request_timeout_s: float, connect_timeout_s: float = 5.0,
                 keepalive_s: float = 2.0, max_connections: int = 4096) -> None:
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s,
                                              sock_read=request_timeout_s)
        self._keepalive_s = keepalive_s
        self._max = max_connections
        self._session: aiohttp.ClientSession | None = None

    def _get(self) -> aiohttp.ClientSession:
        # Created on first use: a session belongs to the running event loop.
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self._max, limit_per_host=0,
                                             keepalive_timeout=self._keepalive_s,
                                             use_dns_cache=True, ttl_dns_cache=60)
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=self._timeout, auto_decompress=False,
                skip_auto_headers=("User-Agent", "Accept-Encoding"))
        return self._session

    async def post(self, url: str, payload: bytes, headers: Mapping[str, str]) -> Reply:
        try:
            async with self._get().post(url, data=payload, headers=headers) as resp:
                return Reply(resp.status, await resp.read())
        except TRANSPORT_ERRORS as exc:
            raise UpstreamError(_describe(exc)) from exc

    async def open(self, url: str, payload: bytes, headers: Mapping[str, str]) -> Stream:
        try:
            resp = await self._get().post(url, data=payload, headers=headers)
        except TRANSPORT_ERRORS as exc:
            raise UpstreamError(_describe(exc)) from exc
        return _AiohttpStream(resp)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
