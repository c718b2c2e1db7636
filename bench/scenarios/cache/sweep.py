"""The controller's CPU per request against prompt length, per routing policy: one pdctl
controller (``external`` backend) in front of an instant engine pair (``bench.instant_engine``:
answers the moment a request is parsed), text prompts of each length, closed loop. The policy
is changed between cells with ``PATCH /api/v1/routing`` (both pools), lengths and policies
interleaved; then the highest rate at the 12k length, per policy.

The instant engines publish no KV events, so the controller's block index stays empty: with
``cache_aware`` it still tokenizes every prompt and hashes its blocks to look them up, which
is the cost measured here, but never finds a hit."""

from __future__ import annotations

import functools
import random
import time
from pathlib import Path

import httpx
import orjson

from bench import cpu
from bench.fleet import (
    ControllerProc,
    free_port,
    healthy,
    instant_engine_argv,
    start_controller,
)
from bench.loadgen import Client, RequestFn, closed_loop, run
from bench.processes import FleetError, ProcessFleet, wait_until
from bench.scenarios.cache.model import (
    CPU_SWEEP_TOKENS,
    MODEL,
    RATE_TOKENS,
    SWEEP_POLICIES,
    CacheOptions,
    RateCell,
    Sweep,
    SweepCell,
)

DISTINCT = 32  # distinct prompts per length, sent in turn


def prompts(tokens: int, n: int = DISTINCT, seed: int = 7) -> list[bytes]:
    """``n`` request bodies whose text prompts are ``tokens`` tokens (4 bytes each) and
    differ from their first piece on."""
    rng = random.Random(seed + tokens)
    out = []
    for i in range(n):
        pieces = [f"{i:03d} "[-4:]] + [f"{rng.randrange(1000):03d} " for _ in range(tokens - 1)]
        out.append(orjson.dumps({"model": MODEL, "prompt": "".join(pieces), "max_tokens": 4,
                                 "ignore_eos": True, "stream": True}))
    return out


def _fn(url: str, bodies: list[bytes]) -> RequestFn:
    turn = iter(range(1 << 62))

    async def one(c: Client) -> float:
        return await c.request(url, bodies[next(turn) % len(bodies)], stream=True)
    return one


def set_policy(ctl: ControllerProc, policy: str) -> None:
    r = ctl.api("PATCH", "/routing", {"prefill_policy": policy, "decode_policy": policy})
    r.raise_for_status()


def measure_sweep(o: CacheOptions, workdir: Path) -> Sweep:
    """Every length x policy cell, then the rate at ``RATE_TOKENS`` per policy."""
    sweep = Sweep()
    with ProcessFleet(workdir / "sweep") as fleet:
        try:
            _measure(o, fleet, sweep)
        except (FleetError, httpx.HTTPError, OSError) as exc:
            sweep.error = f"{type(exc).__name__}: {exc}"[:600]
            print(f"  sweep FAILED: {sweep.error}", flush=True)
        finally:
            fleet.stop(first=("pdctl",))
    return sweep


def _measure(o: CacheOptions, fleet: ProcessFleet, sweep: Sweep) -> None:
    pp, dp = free_port(), free_port()
    p_url, d_url = f"http://127.0.0.1:{pp}", f"http://127.0.0.1:{dp}"
    fleet.start("engines", instant_engine_argv(pp, dp, MODEL))
    cfg = {"backend": "external", "model": {"name": MODEL},
           "pools": {"prefill": {"urls": [p_url], "tp": 1},
                     "decode": {"urls": [d_url], "tp": 1}},
           "routing": {"prefill_policy": "round_robin", "decode_policy": "round_robin"}}
    ctl = start_controller(fleet.workdir, cfg, name="pdctl", fleet=fleet, log_level="warning",
                           wait="up", timeout_s=60)
    for u in (p_url, d_url):
        wait_until(u, functools.partial(healthy, u), 60, fleet)
    wait_until("pdctl", lambda: ctl.ready() == {"prefill": 1, "decode": 1}, 60, fleet)
    ps = fleet.procs["pdctl"].ps
    url = f"{ctl.url}/v1/completions"
    for tokens in CPU_SWEEP_TOKENS:
        bodies = prompts(tokens)
        for policy in SWEEP_POLICIES:
            set_policy(ctl, policy)
            run(closed_loop(_fn(url, bodies), o.sweep_concurrency, 60.0,
                            max_requests=min(20, o.sweep_requests)))  # warm-up
            fleet.check_alive()
            c0 = cpu.process_seconds(ps)
            res = run(closed_loop(_fn(url, bodies), o.sweep_concurrency, 600.0,
                                  max_requests=o.sweep_requests))
            cell = SweepCell(tokens, policy, res.total_done + res.errors, res.errors,
                             cpu.process_seconds(ps) - c0)
            sweep.cells.append(cell)
            print(f"  sweep {tokens:>6} tokens {policy:12} {cell.cpu_us_per_request:8.0f} us "
                  f"controller CPU/request, errors {res.errors}", flush=True)
    bodies = prompts(RATE_TOKENS)
    for policy in SWEEP_POLICIES:
        set_policy(ctl, policy)
        fleet.check_alive()
        c0, t0 = cpu.process_seconds(ps), time.monotonic()
        res = run(closed_loop(_fn(url, bodies), o.rate_concurrency, o.rate_seconds,
                              warmup=1.0))
        n = res.total_done + res.errors
        used = cpu.process_seconds(ps) - c0
        rate = RateCell(policy, RATE_TOKENS, o.rate_concurrency, res.rps, res.errors,
                        used / n * 1e6 if n else float("nan"))
        sweep.rate.append(rate)
        print(f"  rate {RATE_TOKENS} tokens {policy:12} {res.rps:7.1f} requests/s at "
              f"concurrency {o.rate_concurrency} ({time.monotonic() - t0:.1f} s), controller "
              f"{rate.controller_cpu_us_per_request:.0f} us/request, errors {res.errors}",
              flush=True)
