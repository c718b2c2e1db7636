"""``pdctl replay``'s sender: the planned requests sent open loop to ``/v1/completions``,
streamed, each measured client-side (TTFT, its own inter-token gaps, end to end) into a
``ReplayRow``; progress on stderr at most once a second; a stop (Ctrl-C) ends sending and marks
the requests in flight as failed ("interrupted")."""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

import httpx

from controller.replay.prompts import Fitted, PromptMaker
from controller.replay.schedule import Slice
from controller.replay.summary import ReplayRow
from controller.replay.trace import TraceRequest
from pdctl_api.stats import quantiles

PROGRESS_EVERY_S = 1.0


@dataclass(frozen=True, slots=True)
class Planned:
    request: TraceRequest
    fitted: Fitted
    due_s: float


@dataclass
class ReplayOutcome:
    """What a run did: a row per request sent, how many were never sent, its wall time."""

    rows: list[ReplayRow]
    not_sent: int
    wall_s: float
    interrupted: bool = False
    progress: list[str] = field(default_factory=list)


def reason_of(status: int, body: bytes) -> tuple[str, str]:
    """(``reason``: the failure's kind, digits masked so alike failures count together;
    ``detail``: the controller's message) of an HTTP error answer."""
    try:
        err = json.loads(body).get("error", {})
        message = str(err.get("message", "")) if isinstance(err, dict) else str(err)
    except (ValueError, AttributeError):
        message = body[:200].decode("utf-8", "replace")
    kind = re.sub(r"\d+", "N", message)[:90]
    return f"http {status}: {kind}" if kind else f"http {status}", message


def _to_ms(seconds: float) -> float:
    return round(seconds * 1e3, 3)


def request_body(model: str, prompt_json: str, max_tokens: int) -> bytes:
    """The ``/v1/completions`` body: the prompt's token ids or text (JSON, spliced in as is),
    ``max_tokens`` with ``ignore_eos`` (vLLM then stops at ``max_tokens`` only), streamed
    with the usage chunk asked for (cached tokens)."""
    rest = json.dumps({"model": model, "max_tokens": max_tokens, "ignore_eos": True,
                       "temperature": 0.0, "stream": True,
                       "stream_options": {"include_usage": True}})
    return ('{"prompt":' + prompt_json + "," + rest[1:]).encode()


async def send_one(client: httpx.AsyncClient, url: str, row: ReplayRow, body: bytes,
                   t_run: float) -> None:
    """Send one request and fill ``row``; never raises but ``CancelledError`` (after marking
    the row "interrupted")."""
    t0 = time.monotonic()
    row.sent_s = round(t0 - t_run, 4)
    stamps: list[float] = []
    done = False
    try:
        async with client.stream("POST", f"{url}/v1/completions", content=body,
                                 headers={"content-type": "application/json"}) as resp:
            row.request_id = resp.headers.get("x-request-id")
            if resp.status_code != 200:
                row.reason, row.detail = reason_of(resp.status_code, await resp.aread())
                return
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                    break
                event = json.loads(data)
                if event.get("error"):
                    row.reason, row.detail = reason_of(500, data.encode())
                    row.reason = "stream error: " + row.reason.partition(": ")[2]
                    return
                if event.get("choices"):
                    stamps.append(time.monotonic())
                usage = event.get("usage")
                if usage:
                    row.completion_tokens = usage.get("completion_tokens")
                    details = usage.get("prompt_tokens_details")
                    if isinstance(details, dict) and details.get("cached_tokens") is not None:
                        row.cached_tokens = int(details["cached_tokens"])
    except asyncio.CancelledError:
        row.reason = "interrupted"
        raise
    except httpx.TimeoutException as e:
        row.reason, row.detail = "timeout", type(e).__name__
        return
    except (httpx.HTTPError, ValueError) as e:
        row.reason, row.detail = f"connection: {type(e).__name__}", str(e)[:200]
        return
    end = time.monotonic()
    row.output_chunks = len(stamps)
    if not done or not stamps:
        row.reason = "stream ended early" if not done else "no tokens streamed"
        return
    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    row.ttft_ms, row.e2e_ms, row.gaps = _to_ms(stamps[0] - t0), _to_ms(end - t0), len(gaps)
    if gaps:
        p99, worst = quantiles(gaps, (0.99, 1.0)) or (0.0, 0.0)
        row.gap_p99_ms, row.gap_max_ms = _to_ms(p99), _to_ms(worst)
    row.ok = True


class Progress:
    """At most one stderr line a second: sent, finished, failed, elapsed against trace time."""

    def __init__(self, total: int, sl: Slice, out: TextIO = sys.stderr) -> None:
        self.total, self.sl, self.out = total, sl, out
        self.sent = self.finished = self.failed = 0
        self._last = 0.0
        self.lines: list[str] = []

    def line(self, elapsed: float) -> str:
        return (f"replay: {elapsed:6.1f} s (trace {self.sl.trace_s(elapsed):,.1f} s)  sent "
                f"{self.sent}/{self.total}  finished {self.finished}  failed {self.failed}  "
                f"in flight {self.sent - self.finished - self.failed}")

    def tick(self, elapsed: float, force: bool = False) -> None:
        if force or elapsed - self._last >= PROGRESS_EVERY_S:
            self._last = elapsed
            text = self.line(elapsed)
            self.lines.append(text)
            print(text, file=self.out, flush=True)


async def _ticker(progress: Progress, t_run: float) -> None:
    while True:
        await asyncio.sleep(PROGRESS_EVERY_S)
        progress.tick(time.monotonic() - t_run)


async def send_trace(url: str, model: str, plan: list[Planned], sl: Slice, stop: asyncio.Event,
                     timeout_s: float = 600.0, progress_out: TextIO = sys.stderr,
                     make_client: Callable[..., httpx.AsyncClient] = httpx.AsyncClient,
                     text_prompts: bool = False,
                     headers: dict[str, str] | None = None) -> ReplayOutcome:
    """Send ``plan`` on its schedule until done or ``stop`` is set; ``text_prompts``: text
    prompts (``PromptMaker(text=True)``) instead of token ids; ``headers``: on every request
    (the API key)."""
    maker = PromptMaker(text=text_prompts)
    rows: list[ReplayRow] = []
    progress = Progress(len(plan), sl, progress_out)
    tasks: list[asyncio.Task[None]] = []

    def finished(row: ReplayRow) -> Callable[[asyncio.Task[None]], None]:
        def count(_: asyncio.Task[None]) -> None:
            if row.ok:
                progress.finished += 1
            else:
                progress.failed += 1
        return count

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
    async with make_client(timeout=httpx.Timeout(timeout_s, connect=10.0),
                           limits=limits, headers=headers or {}) as client:
        t_run = time.monotonic()  # the client is made (its TLS context takes ~0.1 s)
        ticker = asyncio.create_task(_ticker(progress, t_run))
        stopper = asyncio.create_task(stop.wait())
        try:
            for i, p in enumerate(plan):
                delay = t_run + p.due_s - time.monotonic()
                if delay > 0:
                    await asyncio.wait({stopper}, timeout=delay)
                if stop.is_set():
                    break
                r, f = p.request, p.fitted
                row = ReplayRow(i, r.line, r.time_s, round(p.due_s, 4), r.input_length,
                                f.prompt_tokens, f.max_tokens, f.clamped)
                rows.append(row)
                body = request_body(model, maker.prompt_json(r.hash_ids, f.prompt_tokens),
                                    f.max_tokens)
                task = asyncio.create_task(send_one(client, url, row, body, t_run))
                task.add_done_callback(finished(row))
                tasks.append(task)
                progress.sent += 1
            if tasks and not stop.is_set():
                everything: asyncio.Future[Any] = asyncio.gather(*tasks, return_exceptions=True)
                await asyncio.wait({stopper, everything}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            stopper.cancel()
            ticker.cancel()
    wall = time.monotonic() - t_run
    progress.tick(wall, force=True)
    return ReplayOutcome(rows, len(plan) - len(rows), wall, stop.is_set(), progress.lines)
