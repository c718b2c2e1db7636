"""A lean async load generator for the benchmark scripts.

One aiohttp ``ClientSession`` per measurement, keep-alive connections (a pool at least as big
as the concurrency, times the hops a request makes), uvloop when it is installed. Closed-loop
workers: each sends its next request as soon as its last one finished.

    from loadgen import closed_loop, stream_ttft

    async def one(session):
        return await stream_ttft(session, "http://127.0.0.1:8080/v1/completions", body)

    result = run(closed_loop(one, concurrency=16, duration=5.0, warmup=1.0))
    print(result.rps, result.pct(0.5), result.errors)

``fn(session)`` returns the request's TTFT in seconds and raises on failure. Only requests
that start after the warm-up and finish inside the measured window count; the window is
``duration`` seconds long, so ``rps`` is completions per second of that window.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import aiohttp

T = TypeVar("T")

#: Idle keep-alive connections are dropped after this many seconds: below uvicorn's (and so
#: vLLM's and the sim engine's) 5 s, so the client never reuses a connection the server is
#: closing at that instant.
KEEPALIVE_S = 4.0

RequestFn = Callable[[aiohttp.ClientSession], Awaitable[float]]


class RequestError(Exception):
    """A request failed: a non-200 status, an error event in the stream, no token at all."""


@dataclass
class Result:
    """One measurement: TTFTs (seconds) of the requests in the window, and their count."""

    ttft: list[float] = field(default_factory=list)
    done: int = 0
    errors: int = 0
    seconds: float = 0.0
    total_done: int = 0  # including warm-up and requests that finished after the window
    error_samples: list[str] = field(default_factory=list)

    def pct(self, q: float) -> float:
        """Nearest-rank percentile of TTFT in milliseconds (nan without samples)."""
        if not self.ttft:
            return math.nan
        s = sorted(self.ttft)
        return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))] * 1e3

    @property
    def rps(self) -> float:
        return self.done / self.seconds if self.seconds > 0 else math.nan

    def to_json(self) -> dict[str, Any]:
        return {"p50_ms": self.pct(0.5), "p99_ms": self.pct(0.99), "rps": self.rps,
                "done": self.done, "errors": self.errors, "seconds": self.seconds,
                "total_done": self.total_done, "error_samples": self.error_samples}

    @staticmethod
    def merge(results: list[Result]) -> Result:
        return Result([t for r in results for t in r.ttft], sum(r.done for r in results),
                      sum(r.errors for r in results), sum(r.seconds for r in results),
                      sum(r.total_done for r in results),
                      [e for r in results for e in r.error_samples][:5])


def session(connections: int, timeout_s: float = 120.0) -> aiohttp.ClientSession:
    """A session with a keep-alive pool of ``connections`` (no per-host limit)."""
    connector = aiohttp.TCPConnector(limit=connections, limit_per_host=0,
                                     keepalive_timeout=KEEPALIVE_S, ttl_dns_cache=None)
    return aiohttp.ClientSession(connector=connector,
                                 timeout=aiohttp.ClientTimeout(total=timeout_s),
                                 auto_decompress=False, skip_auto_headers=("User-Agent",))


def _has_token(event: bytes) -> bool:
    """Whether one SSE event (``data: {...}``) carries generated text (completion or chat)."""
    if not event.startswith(b"data:"):
        return False
    payload = event[5:].strip()
    if payload == b"[DONE]":
        return False
    obj = json.loads(payload)
    if "error" in obj:
        raise RequestError(f"error event: {payload[:200]!r}")
    for choice in obj.get("choices") or ():
        if choice.get("text") or (choice.get("delta") or {}).get("content"):
            return True
    return False


async def stream_ttft(session: aiohttp.ClientSession, url: str, body: dict[str, Any],
                      t0: float | None = None, headers: dict[str, str] | None = None) -> float:
    """POST a streaming request; seconds from ``t0`` (default: now) to the first SSE event
    that carries a token. Reads the whole stream; raises ``RequestError`` on a non-200
    answer, an error event, a stream without a token or without ``[DONE]``."""
    t0 = time.perf_counter() if t0 is None else t0
    ttft: float | None = None
    buf = b""
    tail = b""
    async with session.post(url, json=body, headers=headers) as r:
        if r.status != 200:
            raise RequestError(f"HTTP {r.status}: {(await r.read())[:200]!r}")
        async for chunk in r.content.iter_any():
            if ttft is None:
                buf += chunk
                while ttft is None and b"\n\n" in buf:
                    event, buf = buf.split(b"\n\n", 1)
                    if _has_token(event.strip()):
                        ttft = time.perf_counter() - t0
                if ttft is not None:
                    tail = buf[-64:]
            else:
                if b'"error"' in chunk:
                    raise RequestError(f"error event after the first token: {chunk[:200]!r}")
                tail = (tail + chunk)[-64:]
    if ttft is None:
        raise RequestError(f"stream carried no token: {buf[:200]!r}")
    if b"[DONE]" not in tail:
        raise RequestError(f"stream ended without [DONE]: {tail!r}")
    return ttft


async def post_json(session: aiohttp.ClientSession, url: str, body: dict[str, Any],
                    headers: dict[str, str] | None = None) -> Any:
    """POST a non-streaming request and return its JSON answer; ``RequestError`` if not 200."""
    async with session.post(url, json=body, headers=headers) as r:
        data = await r.read()
        if r.status != 200:
            raise RequestError(f"HTTP {r.status}: {data[:200]!r}")
    return json.loads(data)


async def closed_loop(fn: RequestFn, concurrency: int, duration: float, *,
                      warmup: float = 0.0, hops: int = 2, max_requests: int | None = None,
                      session_factory: Callable[[int], aiohttp.ClientSession] = session,
                      ) -> Result:
    """``concurrency`` workers, each calling ``fn(session)`` back to back for ``warmup +
    duration`` seconds (or until ``max_requests`` have been sent). Requests started in the
    warm-up, or finished after the window, are not counted (but are waited for). ``hops``:
    connections one request may hold at once (2 for a client doing both P/D hops)."""
    res = Result(seconds=duration)
    sent = 0
    async with session_factory(max(1, concurrency * hops)) as s:
        start = time.perf_counter()
        window0, window1 = start + warmup, start + warmup + duration

        async def worker() -> None:
            nonlocal sent
            while (t := time.perf_counter()) < window1:
                if max_requests is not None:
                    if sent >= max_requests:
                        return
                    sent += 1
                try:
                    ttft = await fn(s)
                except Exception as e:  # every failure is an error sample
                    if t >= window0:
                        res.errors += 1
                        if len(res.error_samples) < 5:
                            res.error_samples.append(f"{type(e).__name__}: {e}"[:300])
                    continue
                res.total_done += 1
                if t >= window0 and time.perf_counter() <= window1:
                    res.ttft.append(ttft)
                    res.done += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return res


def run(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on uvloop when it is installed."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)
