"""The scale scenario's load: open-loop arrivals at the offered rate (``bench.loadgen``),
while a monitor follows the in-flight requests, the controller's file descriptors and the
ready instances, and the window's edges get a CPU snapshot and a /metrics scrape each."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from dataclasses import dataclass, field

import httpx
import psutil

from bench import prom
from bench.fleet import SIM_MODEL_70B, ControllerProc
from bench.loadgen import OpenLoop, body
from bench.processes import ProcessFleet
from bench.scenarios.scale.model import ScaleOptions
from bench.scenarios.scale.observe import CpuSnap, cpu_snap

SCALE_PROMPT_WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo "
                      "lima mike november oscar papa quebec romeo sierra tango uniform victor "
                      "whiskey xray yankee zulu model token cache prefill decode router engine"
                      ).split()


@dataclass
class LoadObserved:
    """What the monitor saw while the load ran."""

    snaps: list[CpuSnap] = field(default_factory=list)  # at the window's start and end
    scrapes: list[prom.Page | None] = field(default_factory=list)
    peak_inflight: int = 0
    peak_fds: int = 0
    ready_min: dict[str, int] = field(default_factory=dict)


def filler_text(rng: random.Random, nbytes: int) -> str:
    """``nbytes`` (or a word more) of random words: the text prompts are cut from."""
    out: list[str] = []
    n = 0
    while n < nbytes:
        w = rng.choice(SCALE_PROMPT_WORDS)
        out.append(w)
        n += len(w) + 1
    return " ".join(out)


async def scrape(http: httpx.AsyncClient, url: str) -> prom.Page | None:
    """The controller's /metrics, with when it was asked for and answered (under overload
    the answer can take seconds: the deltas then cover a shifted interval)."""
    t_sent = time.monotonic()
    try:
        text = (await http.get(f"{url}/metrics", timeout=30)).text
    except httpx.HTTPError:
        return None
    return prom.parse(text, t_sent, time.monotonic())


async def monitor(http: httpx.AsyncClient, load: OpenLoop, seen: LoadObserved,
                  ctl: ControllerProc, fleet: ProcessFleet) -> None:
    """Every second until cancelled: peaks of in-flight requests and of the controller's
    file descriptors, the fewest ready instances per role, and the engines seen."""
    while True:
        fleet.note_descendants()
        seen.peak_inflight = max(seen.peak_inflight, len(load.inflight))
        with contextlib.suppress(psutil.Error):
            seen.peak_fds = max(seen.peak_fds, psutil.Process(ctl.proc.pid).num_fds())
        with contextlib.suppress(httpx.HTTPError, ValueError):
            r = await http.get(f"{ctl.url}/healthz")
            for role, n in (r.json().get("ready") or {}).items():
                seen.ready_min[role] = min(seen.ready_min.get(role, n), n)
        await asyncio.sleep(1.0)


async def drive(o: ScaleOptions, ctl: ControllerProc, fleet: ProcessFleet
                ) -> tuple[OpenLoop, LoadObserved]:
    rng = random.Random(o.seed)
    text = filler_text(rng, 64 * 1024)
    url = f"{ctl.url}/v1/completions"

    def make(i: int, stream: bool) -> tuple[str, bytes, int]:
        nbytes = 4 * rng.randint(*o.prompt_tokens)
        off = rng.randrange(0, len(text) - nbytes)
        return url, body({"model": SIM_MODEL_70B,
                          "prompt": f"request {i}: " + text[off:off + nbytes],
                          "max_tokens": o.max_tokens, "stream": stream,
                          "temperature": 0}), o.max_tokens

    load = OpenLoop(make, o.rate, o.duration, o.warmup, o.poisson, o.stream_share,
                    o.max_inflight, o.timeout, o.seed)
    seen = LoadObserved()
    async with httpx.AsyncClient(timeout=10) as http:
        async def at(edge: int) -> None:
            await asyncio.sleep(0)  # load.run has set its window by now
            await asyncio.sleep(max(0.0, load.window[edge] - time.monotonic()))
            seen.snaps.append(cpu_snap(ctl, fleet))
            seen.scrapes.append(await scrape(http, ctl.url))

        marks = [asyncio.create_task(at(0)), asyncio.create_task(at(1))]
        mon = asyncio.create_task(monitor(http, load, seen, ctl, fleet))
        try:
            await load.run()
            await asyncio.gather(*marks)
        finally:
            mon.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await mon
    return load, seen
