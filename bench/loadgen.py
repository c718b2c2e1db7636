"""The benchmarks' one load generator: closed-loop workers and open-loop arrivals.

HTTP client: ``controller.router.h1.H1Upstream``, the router's own HTTP/1.1 client
(keep-alive pool, ``httptools`` parser, one ``write`` per request). Chosen for client CPU,
which on a 2-core machine is taken from the router under test: against the instant engine
(``bench.instant_engine``) a streamed 4-token completion costs this client about 20 us of
CPU, aiohttp about 95 us and httpx about 1,300 us (measured on the benchmark machine, 3,000
requests at concurrency 16, uvloop). httpx remains for the benchmarks' control calls
(readiness, the controller's API, /metrics scrapes): a few per second, where convenience
wins. The loop is uvloop's.

A request (``Client.request``) is one POST; it succeeds only with a 200 answer that carries a
token -- streamed: an SSE event with text, no error event, and ``[DONE]`` at the end; not
streamed: a JSON body without ``error`` and, when asked, ``completion_tokens`` equal to
``max_tokens``. Anything else raises ``RequestError`` whose ``kind`` is a short category
(``http 503``, ``stream without [DONE]``, ``connection``, ``client timeout``...).

- ``closed_loop(fn, concurrency, duration, warmup)``: ``concurrency`` workers each call
  ``fn(client)`` (returning a TTFT in seconds) back to back. Only requests started after the
  warm-up and finished inside the measured window count; ``rps`` is completions per second
  of the window.
- ``OpenLoop``: arrivals at a rate (Poisson or evenly spaced), each sent at its time whatever
  the earlier ones are doing, up to an in-flight cap (arrivals beyond it are dropped and
  counted), each with a total timeout.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from uvloop import run as run  # re-exported: every load runs on a fresh uvloop loop

from bench import stats
from controller.router.h1 import H1Upstream
from controller.router.upstream import Stream, UpstreamError

#: Idle keep-alive connections are dropped after this many seconds: below uvicorn's (so the
#: controller's, vLLM's and the sim engine's) 5 s, so that the client never reuses a
#: connection the server is closing at that instant.
KEEPALIVE_S = 4.0
JSON = {"content-type": "application/json"}


class RequestError(Exception):
    """A failed request: ``kind`` is its category (counted), the message its detail."""

    def __init__(self, kind: str, detail: str = "") -> None:
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind = kind


def body(obj: dict[str, Any]) -> bytes:
    """A JSON request body."""
    return orjson.dumps(obj)


def _has_token(event: bytes) -> bool:
    """Whether one SSE event (``data: {...}``) carries generated text (completion or chat);
    ``RequestError`` for an error event."""
    if not event.startswith(b"data:"):
        return False
    payload = event[5:].strip()
    if payload == b"[DONE]":
        return False
    try:
        obj = orjson.loads(payload)
    except orjson.JSONDecodeError:
        raise RequestError("bad stream event", repr(payload[:200])) from None
    if "error" in obj:
        raise RequestError("stream error event", repr(payload[:200]))
    for choice in obj.get("choices") or ():
        if choice.get("text") or (choice.get("delta") or {}).get("content"):
            return True
    return False


def _whole_answer(status: int, data: bytes, t0: float, max_tokens: int | None) -> float:
    """Seconds from ``t0`` to a whole (not streamed) answer, now read; ``RequestError``
    unless it is a 200 JSON body without ``error`` (with ``max_tokens`` tokens, when
    asked)."""
    if status != 200:
        raise RequestError(f"http {status}", repr(data[:200]))
    took = time.perf_counter() - t0
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise RequestError("bad body", repr(data[:200])) from None
    if not isinstance(obj, dict) or "error" in obj:
        raise RequestError("error body", repr(data[:200]))
    if max_tokens is not None and (
            (obj.get("usage") or {}).get("completion_tokens") != max_tokens):
        raise RequestError("wrong token count", repr(obj.get("usage")))
    return took


async def _streamed(resp: Stream, t0: float, gaps: list[float] | None) -> float:
    """Seconds from ``t0`` to the first token event of a streamed answer, read to its end;
    ``RequestError`` for an error event, no token, or no ``[DONE]``."""
    ttft: float | None = None
    buf = b""
    tail = b""
    last = 0.0
    async for chunk in resp.chunks():
        if ttft is None:
            buf += chunk
            while ttft is None and b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                if _has_token(event.strip()):
                    ttft = time.perf_counter() - t0
            if ttft is not None:
                if b'"error"' in buf:
                    raise RequestError("stream error event", repr(buf[:200]))
                tail = buf[-64:]
                last = time.perf_counter()
        else:
            if b'"error"' in chunk:
                raise RequestError("stream error event", repr(chunk[:200]))
            tail = (tail + chunk)[-64:]
            if gaps is not None:
                now = time.perf_counter()
                gaps.append(now - last)
                last = now
    if ttft is None:
        raise RequestError("stream without a token", repr(buf[:200]))
    if b"[DONE]" not in tail:
        raise RequestError("stream without [DONE]", repr(tail))
    return ttft


class Client:
    """HTTP/1.1 keep-alive client for load (see the module docstring). Create it inside the
    event loop that uses it: its connections belong to that loop."""

    def __init__(self, read_timeout_s: float = 120.0, keepalive_s: float = KEEPALIVE_S,
                 max_idle: int = 4096) -> None:
        self.upstream = H1Upstream(read_timeout_s, keepalive_s=keepalive_s,
                                   max_idle_per_host=max_idle)

    async def close(self) -> None:
        await self.upstream.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def request(self, url: str, payload: bytes, *, stream: bool,
                      t0: float | None = None, max_tokens: int | None = None,
                      headers: dict[str, str] | None = None, resend: bool = True,
                      gaps: list[float] | None = None) -> float:
        """POST ``payload``; seconds from ``t0`` (default: now) to the first token event
        (streamed) or to the whole answer (not streamed). Reads the whole answer. ``gaps``
        (streamed): gets the seconds between the chunks read after the first token."""
        t0 = time.perf_counter() if t0 is None else t0
        try:
            resp = await self.upstream.open(url, payload, headers or JSON, resend)
        except UpstreamError as exc:
            raise RequestError("connection", str(exc)) from None
        try:
            if resp.status != 200 or not stream:
                return _whole_answer(resp.status, await resp.read(), t0, max_tokens)
            return await _streamed(resp, t0, gaps)
        except UpstreamError as exc:
            raise RequestError("connection", str(exc)) from None
        finally:
            resp.close()

    async def post_json(self, url: str, payload: bytes, resend: bool = True) -> Any:
        """POST and return the parsed JSON answer; ``RequestError`` if it is not 200."""
        try:
            reply = await self.upstream.post(url, payload, JSON, resend)
        except UpstreamError as exc:
            raise RequestError("connection", str(exc)) from None
        if reply.status != 200:
            raise RequestError(f"http {reply.status}", repr(reply.body[:200]))
        try:
            return orjson.loads(reply.body)
        except orjson.JSONDecodeError:
            raise RequestError("bad body", repr(reply.body[:200])) from None


# ---- closed loop ---------------------------------------------------------------------------

RequestFn = Callable[[Client], Awaitable[float]]


@dataclass
class ClosedLoopResult:
    """One closed-loop measurement: TTFTs (seconds) of the requests in the window."""

    ttft: list[float] = field(default_factory=list)
    done: int = 0
    errors: int = 0
    seconds: float = 0.0
    total_done: int = 0  # including warm-up and requests that finished after the window
    error_samples: list[str] = field(default_factory=list)

    def pct(self, q: float) -> float:
        """Percentile of TTFT in milliseconds (``bench.stats``; NaN without samples)."""
        return stats.quantile_or_nan(self.ttft, q) * 1e3

    @property
    def rps(self) -> float:
        return self.done / self.seconds if self.seconds > 0 else math.nan

    @staticmethod
    def merge(results: list[ClosedLoopResult]) -> ClosedLoopResult:
        return ClosedLoopResult([t for r in results for t in r.ttft],
                                sum(r.done for r in results), sum(r.errors for r in results),
                                sum(r.seconds for r in results),
                                sum(r.total_done for r in results),
                                [e for r in results for e in r.error_samples][:5])


async def closed_loop(fn: RequestFn, concurrency: int, duration: float, *,
                      warmup: float = 0.0, max_requests: int | None = None,
                      read_timeout_s: float = 120.0) -> ClosedLoopResult:
    """``concurrency`` workers calling ``fn(client)`` back to back for ``warmup + duration``
    seconds (or until ``max_requests`` were sent). Requests started in the warm-up, or
    finished after the window, are not counted (but waited for)."""
    res = ClosedLoopResult(seconds=duration)
    sent = 0
    async with Client(read_timeout_s) as client:
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
                    ttft = await fn(client)
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


# ---- open loop -----------------------------------------------------------------------------

DROPPED = "dropped by client (in-flight cap)"
TIMEOUT = "client timeout (gave up)"


@dataclass
class Arrival:
    """One open-loop request: when it was due, sent and done (monotonic), and its outcome."""

    due: float
    stream: bool
    sent: float = 0.0
    done: float = 0.0
    ttft: float | None = None  # streamed requests
    error: str | None = None
    gaps: list[float] | None = None  # streamed, when ``OpenLoop.record_gaps``


@dataclass
class OpenLoop:
    """Arrivals at ``rate`` per second for ``warmup + duration`` seconds; ``run`` sends them
    and waits for the stragglers (up to the timeout). ``make(i, stream)`` gives the i-th
    request's URL, body and ``max_tokens`` (checked in non-streamed answers)."""

    make: Callable[[int, bool], tuple[str, bytes, int]]
    rate: float
    duration: float
    warmup: float = 0.0
    poisson: bool = True
    stream_share: float = 0.0
    max_inflight: int = 1000
    timeout_s: float = 15.0
    seed: int = 1
    record_gaps: bool = False  # streamed requests keep their inter-chunk gaps
    arrivals: list[Arrival] = field(default_factory=list)
    window: tuple[float, float] = (0.0, 0.0)  # monotonic
    inflight: set[asyncio.Task[None]] = field(default_factory=set)
    unfinished: int = 0
    error_samples: dict[str, list[str]] = field(default_factory=dict)

    async def _one(self, client: Client, url: str, payload: bytes, a: Arrival,
                   max_tokens: int) -> None:
        a.sent = time.monotonic()
        try:
            async with asyncio.timeout(self.timeout_s):
                if a.stream and self.record_gaps:
                    a.gaps = []
                took = await client.request(url, payload, stream=a.stream,
                                            max_tokens=None if a.stream else max_tokens,
                                            gaps=a.gaps)
            if a.stream:
                a.ttft = took
        except TimeoutError:
            a.error = TIMEOUT
        except Exception as exc:  # every failure is counted by its kind
            a.error = exc.kind if isinstance(exc, RequestError) else type(exc).__name__
            samples = self.error_samples.setdefault(a.error, [])
            if len(samples) < 3:
                samples.append(str(exc)[:300])
        finally:
            a.done = time.monotonic()

    async def run(self) -> None:
        rng = random.Random(self.seed)
        loop = asyncio.get_running_loop()
        async with Client(read_timeout_s=self.timeout_s, max_idle=self.max_inflight) as client:
            t_start = time.monotonic()
            w0, w1 = t_start + self.warmup, t_start + self.warmup + self.duration
            self.window = (w0, w1)
            nxt, i = t_start, 0
            while nxt < w1:
                now = time.monotonic()
                while nxt <= now and nxt < w1:
                    a = Arrival(due=nxt, stream=rng.random() < self.stream_share)
                    self.arrivals.append(a)
                    if len(self.inflight) >= self.max_inflight:
                        a.sent = a.done = now
                        a.error = DROPPED
                    else:
                        url, payload, max_tokens = self.make(i, a.stream)
                        t = loop.create_task(self._one(client, url, payload, a, max_tokens))
                        self.inflight.add(t)
                        t.add_done_callback(self.inflight.discard)
                    i += 1
                    nxt += rng.expovariate(self.rate) if self.poisson else 1.0 / self.rate
                await asyncio.sleep(max(0.0, min(nxt, w1) - time.monotonic()))
            if self.inflight:
                _, pending = await asyncio.wait(set(self.inflight), timeout=self.timeout_s + 5)
                self.unfinished = len(pending)
                for t in pending:
                    t.cancel()
