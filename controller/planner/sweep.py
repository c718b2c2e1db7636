"""``pdctl profile``: measure one engine and write its performance profile.

The engine is a real process (a simulated engine or real vLLM, started here through the same
launcher the controller uses, or one already running at ``--url``), measured over HTTP as a
client sees it:

- prefill: for each prompt length, requests of that many token ids with ``max_tokens`` 1, one
  at a time; TTFT is the median answer time and throughput prompt tokens / TTFT;
- decode: for each context length and concurrency C, C requests at once; the engine's own
  counters (``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``) are read once every
  prompt is prefilled and again after each sequence made ``decode_tokens`` more: throughput
  is tokens over that window, the ITL C / throughput (no per-token work in this client, which
  would otherwise set the pace at high concurrency). Points whose C sequences would not fit
  the engine's KV cache are skipped, and a simulated engine that fell behind its model (this
  machine's CPU) ends the concurrency ladder.

Prompts are random token ids (no prefix-cache hits). Simulated engines run at ``time_scale``
and their times are divided by it (profiles hold modelled time)."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import httpx

from controller.planner.profile import DecodePoint, PerfProfile, PrefillPoint
from controller.vllm_metrics import sum_series
from pdctl_api.stats import quantile

Say = Callable[[str], None]


@dataclass(frozen=True)
class SweepPlan:
    prompts: Sequence[int]
    contexts: Sequence[int]
    concurrency: Sequence[int]
    decode_tokens: int = 32  # tokens each decode request generates
    repeats: int = 3
    kv_capacity_tokens: int | None = None
    vocab: int = 1000
    max_model_len: int | None = None


def token_prompt(n: int, vocab: int, rng: random.Random) -> list[int]:
    return [rng.randrange(10, max(11, vocab - 1)) for _ in range(n)]


async def _one(client: httpx.AsyncClient, url: str, model: str, prompt: list[int],
               max_tokens: int, stream: bool, sink: list[float] | None = None) -> list[float]:
    """Arrival times (perf_counter) of the answer's events, appended to ``sink`` as they
    come; one time for a whole answer."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": stream,
            "ignore_eos": True, "temperature": 0.0}
    times: list[float] = [] if sink is None else sink
    if not stream:
        r = await client.post(f"{url}/v1/completions", json=body)
        r.raise_for_status()
        times.append(time.perf_counter())
        return times
    async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                times.append(time.perf_counter())
    return times


async def engine_counters(client: httpx.AsyncClient, url: str) -> dict[str, float]:
    """The engine's own counters this sweep reads (vLLM's names; the simulator's too)."""
    text = (await client.get(f"{url}/metrics")).text
    out = dict.fromkeys(COUNTERS, 0.0) | sum_series(text, COUNTERS)
    out["t"] = time.perf_counter()
    return out


PROMPT = "vllm:prompt_tokens_total"
GENERATED = "vllm:generation_tokens_total"
BUSY = "pdctl_sim_busy_seconds_total"
LAG = "pdctl_sim_lag_seconds_total"
COUNTERS = (PROMPT, GENERATED, BUSY, LAG)


async def decode_window(client: httpx.AsyncClient, url: str, model: str,
                        prompts: list[list[int]], tokens: int, cap: int, timeout_s: float,
                        poll_s: float = 0.05) -> tuple[dict[str, float], dict[str, float]] | None:
    """Send the prompts at once (whole answers: no per-token work in this client) and read
    the engine's counters once every prompt is prefilled and again after each sequence made
    ``tokens`` more; both readings, or None when that window never came. The requests are
    then abandoned (closed)."""
    base = await engine_counters(client, url)
    prompt_total = sum(len(p) for p in prompts)
    tasks = [asyncio.create_task(_one(client, url, model, p, cap, False)) for p in prompts]
    deadline = time.monotonic() + timeout_s
    first = None
    try:
        while time.monotonic() < deadline and not any(t.done() for t in tasks):
            await asyncio.sleep(poll_s)
            now = await engine_counters(client, url)
            if first is None:
                if now[PROMPT] - base[PROMPT] >= prompt_total:
                    first = now
            elif now[GENERATED] - first[GENERATED] >= tokens * len(prompts):
                return first, now
    finally:
        for t in tasks:
            t.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for r in results:
            if isinstance(r, httpx.HTTPStatusError):
                raise r
    return None


MAX_LAG_SHARE = 0.1  # a simulated engine this far behind its model measures this machine


async def prefill_points(client: httpx.AsyncClient, url: str, model: str, plan: SweepPlan,
                         scale: float, rng: random.Random, say: Say) -> list[PrefillPoint]:
    out = []
    for n in plan.prompts:
        samples = []
        for _ in range(plan.repeats):
            t0 = time.perf_counter()
            await _one(client, url, model, token_prompt(n, plan.vocab, rng), 1, False)
            samples.append((time.perf_counter() - t0) / scale)
        ttft = quantile(samples, 0.5) or 0.0
        out.append(PrefillPoint(n, round(ttft * 1e3, 3), round(n / ttft, 1)))
        say(f"  prefill {n:>6} tokens: TTFT {ttft * 1e3:9.1f} ms, {n / ttft:12,.0f} tokens/s")
    return out


async def decode_points(client: httpx.AsyncClient, url: str, model: str, plan: SweepPlan,
                        scale: float, rng: random.Random, say: Say) -> list[DecodePoint]:
    out = []
    for ctx in plan.contexts:
        prompt_len = max(1, ctx - plan.decode_tokens // 2)
        if plan.max_model_len and prompt_len + 2 * plan.decode_tokens > plan.max_model_len:
            say(f"  decode context {ctx}: over max_model_len {plan.max_model_len}; skipped")
            continue
        done = 0
        for want in plan.concurrency:
            c = want
            need = prompt_len + 2 * plan.decode_tokens  # what a sequence holds at most
            if plan.kv_capacity_tokens and c * need > plan.kv_capacity_tokens:
                c = plan.kv_capacity_tokens // need  # the most the KV cache holds
                say(f"  decode {want:>4} x {ctx:>6}: over the KV cache "
                    f"({plan.kv_capacity_tokens:,} tokens)"
                    + (f"; measuring {c}, the most it holds" if c > done else ""))
                if c <= done:
                    break
            done = c
            prompts = [token_prompt(prompt_len, plan.vocab, rng) for _ in range(c)]
            # Long enough to outlast the others' prefills (chunks of ~2k tokens) and the
            # window; abandoned once the window is read.
            cap = plan.decode_tokens * 2 + -(-c * prompt_len // 2048) + 8
            if plan.max_model_len:
                cap = min(cap, plan.max_model_len - prompt_len - 1)
            window = await decode_window(client, url, model, prompts, plan.decode_tokens, cap,
                                         600.0)
            if window is None:
                say(f"  decode {c:>4} x {ctx:>6}: every prompt prefilled and "
                    f"{plan.decode_tokens} tokens each never happened together; skipped")
                continue
            a, b = window
            busy, lag = b[BUSY] - a[BUSY], b[LAG] - a[LAG]
            if busy > 0 and lag / busy > MAX_LAG_SHARE:
                say(f"  decode {c:>4} x {ctx:>6}: the simulated engine ran {lag / busy:.0%} "
                    "behind its model (this machine's CPU, not the modelled hardware, set the "
                    "pace); not recorded, no higher concurrency tried")
                break
            itl = c * (b["t"] - a["t"]) / (b[GENERATED] - a[GENERATED])
            itl /= scale
            out.append(DecodePoint(c, ctx, round(itl * 1e3, 3), round(c / itl, 1)))
            say(f"  decode {c:>4} x {ctx:>6} context: ITL {itl * 1e3:8.2f} ms, "
                f"{c / itl:10,.0f} tokens/s")
            if c < want:
                break
    return out


async def sweep(url: str, model: str, plan: SweepPlan, scale: float, say: Say,
                engine: str, model_name: str, accelerator: str, tp: int, source: str,
                seed: int = 0) -> PerfProfile:
    rng = random.Random(seed)
    limits = httpx.Limits(max_connections=max(plan.concurrency) + 8)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits) as client:
        # One warm-up request: first-request costs (vLLM's lazy initialisation) are no point.
        await _one(client, url, model, token_prompt(8, plan.vocab, rng), 2, False)
        say("prefill sweep")
        prefill = await prefill_points(client, url, model, plan, scale, rng, say)
        say("decode sweep")
        decode = await decode_points(client, url, model, plan, scale, rng, say)
    if not prefill or not decode:
        raise RuntimeError("the sweep measured no prefill or no decode point")
    return PerfProfile(engine, model_name, accelerator, tp, tuple(prefill), tuple(decode),
                       plan.kv_capacity_tokens, source)
