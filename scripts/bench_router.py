#!/usr/bin/env python3
"""Router cost: pdctl's added TTFT (p50/p99) and request rate against direct-to-engine.

Starts one simulated prefill and one simulated decode engine, and a controller (``external``
backend) in front of them, all as real processes on this machine. For concurrency 1 and 64 it
runs, interleaved in one session:

- colocated:     client -> decode engine            vs  client -> pdctl -> decode engine
- disaggregated: client does both hops itself       vs  client -> pdctl (prefill hop, decode hop)

TTFT is the client's time to the first streamed byte. Figures are printed as ratios against
the direct run measured in the same session, because this machine is noisy.

    .venv/bin/python scripts/bench_router.py [--duration 8] [--concurrency 1 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controller.launchers.process import free_port  # noqa: E402

MODEL = "llama-3-8b"
PROMPT = "benchmark prompt text " * 150  # ~830 tokens: disaggregated at threshold 512
SHORT = "short prompt"


def start(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as f:
        return subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)


def wait_http(url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} did not come up")


def engine(port: int, role: str, scale: float, tmp: Path) -> subprocess.Popen[bytes]:
    return start([sys.executable, "-m", "controller.engines.sim", "--port", str(port),
                  "--role", role, "--model", MODEL, "--hardware", "h100-sxm", "--tp", "1",
                  "--time-scale", str(scale)], tmp / f"{role}.log")


@dataclass
class Result:
    ttft: list[float]
    done: int
    errors: int
    seconds: float

    def pct(self, q: float) -> float:
        s = sorted(self.ttft)
        return s[min(len(s) - 1, int(q * len(s)))] * 1e3 if s else float("nan")

    @property
    def rate(self) -> float:
        return self.done / self.seconds


async def first_byte(client: httpx.AsyncClient, url: str, body: dict[str, Any],
                     t0: float | None = None) -> float:
    """Seconds from ``t0`` (default: now) to the first streamed byte; reads the whole stream."""
    t0 = time.perf_counter() if t0 is None else t0
    ttft = None
    async with client.stream("POST", url, json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{r.status_code}")
        async for _ in r.aiter_raw():
            if ttft is None:
                ttft = time.perf_counter() - t0
    assert ttft is not None
    return ttft


async def two_hop_direct(client: httpx.AsyncClient, p_url: str, d_url: str,
                         body: dict[str, Any]) -> float:
    """The client does the NixlConnector two-hop flow itself: the no-router baseline."""
    t0 = time.perf_counter()
    pbody = {**body, "stream": False, "max_tokens": 1,
             "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False}}
    r = await client.post(f"{p_url}/v1/completions", json=pbody)
    kv = r.json()["kv_transfer_params"]
    return await first_byte(client, f"{d_url}/v1/completions",
                            {**body, "kv_transfer_params": kv}, t0)


async def run(fn: Any, concurrency: int, duration: float) -> Result:
    ttfts: list[float] = []
    errors = 0
    stop = time.perf_counter() + duration
    n = concurrency * 2
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        async def worker() -> None:
            nonlocal errors
            while time.perf_counter() < stop:
                try:
                    ttfts.append(await fn(client))
                except Exception:
                    errors += 1
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return Result(ttfts, len(ttfts), errors, time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=8.0, help="seconds per measurement")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--time-scale", type=float, default=0.1)
    ap.add_argument("--rounds", type=int, default=2, help="interleaved repetitions")
    ap.add_argument("--json", type=Path, help="write raw results here")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="pdctl-bench-"))
    pp, dp, cp = free_port(), free_port(), free_port()
    procs = [engine(pp, "prefill", args.time_scale, tmp),
             engine(dp, "decode", args.time_scale, tmp)]
    cfg = {"backend": "external", "model": {"name": MODEL},
           "pools": {"prefill": {"urls": [f"http://127.0.0.1:{pp}"], "tp": 1},
                     "decode": {"urls": [f"http://127.0.0.1:{dp}"], "tp": 1}},
           "routing": {"disagg_min_prompt_tokens": 512},
           "controller": {"port": cp, "state_dir": str(tmp / "state")}}
    (tmp / "pdctl.yaml").write_text(yaml.safe_dump(cfg))
    procs.append(start([sys.executable, "-m", "controller.cli", "controller", "--config",
                        str(tmp / "pdctl.yaml"), "--log-level", "warning"], tmp / "ctl.log"))
    try:
        for port in (pp, dp):
            wait_http(f"http://127.0.0.1:{port}/health")
        wait_http(f"http://127.0.0.1:{cp}/healthz")
        token = (tmp / "state" / "token").read_text().strip()
        hdr = {"Authorization": f"Bearer {token}"}
        deadline = time.monotonic() + 30
        while httpx.get(f"http://127.0.0.1:{cp}/healthz").json()["ready"] != {
                "prefill": 1, "decode": 1}:
            if time.monotonic() > deadline:
                raise SystemExit("controller pools not ready")
            time.sleep(0.2)
        del hdr
        p_url, d_url, c_url = (f"http://127.0.0.1:{p}" for p in (pp, dp, cp))
        body_long = {"model": MODEL, "prompt": PROMPT, "max_tokens": 4, "stream": True}
        body_short = {"model": MODEL, "prompt": SHORT, "max_tokens": 4, "stream": True}
        d_comp, c_comp = f"{d_url}/v1/completions", f"{c_url}/v1/completions"
        cases = {
            ("colocated", "direct"): lambda c: first_byte(c, d_comp, body_short),
            ("colocated", "pdctl"): lambda c: first_byte(c, c_comp, body_short),
            ("disaggregated", "direct"): lambda c: two_hop_direct(c, p_url, d_url, body_long),
            ("disaggregated", "pdctl"): lambda c: first_byte(c, c_comp, body_long),
        }
        results: dict[tuple[str, str, int], list[Result]] = {}
        for _ in range(args.rounds):
            for conc in args.concurrency:
                for key, fn in cases.items():
                    res = asyncio.run(run(fn, conc, args.duration))
                    results.setdefault((*key, conc), []).append(res)
        report(results, args)
        if args.json:
            args.json.write_text(json.dumps({f"{k[0]}/{k[1]}/c{k[2]}": [
                {"p50_ms": r.pct(0.5), "p99_ms": r.pct(0.99), "rps": r.rate,
                 "errors": r.errors} for r in v] for k, v in results.items()}, indent=2))
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(timeout=30)
    return 0


def merged(rs: list[Result]) -> Result:
    return Result([t for r in rs for t in r.ttft], sum(r.done for r in rs),
                  sum(r.errors for r in rs), sum(r.seconds for r in rs))


def report(results: dict[tuple[str, str, int], list[Result]], args: argparse.Namespace) -> None:
    print(f"\nrouter cost, {args.rounds} interleaved rounds x {args.duration:.0f} s "
          f"(sim {MODEL}, time scale {args.time_scale})")
    print(f"{'path':14} {'conc':>4} | {'direct p50':>10} {'p99':>8} {'rps':>7} | "
          f"{'pdctl p50':>9} {'p99':>8} {'rps':>7} | {'added p50':>9} {'added p99':>9} "
          f"{'rps ratio':>9} {'errors':>6}")
    for path in ("colocated", "disaggregated"):
        for conc in args.concurrency:
            d = merged(results[(path, "direct", conc)])
            p = merged(results[(path, "pdctl", conc)])
            print(f"{path:14} {conc:>4} | {d.pct(.5):>8.2f}ms {d.pct(.99):>6.2f}ms "
                  f"{d.rate:>7.1f} | {p.pct(.5):>7.2f}ms {p.pct(.99):>6.2f}ms {p.rate:>7.1f} | "
                  f"{p.pct(.5) - d.pct(.5):>7.2f}ms {p.pct(.99) - d.pct(.99):>7.2f}ms "
                  f"{p.rate / d.rate:>9.2f} {d.errors + p.errors:>6}")


if __name__ == "__main__":
    sys.exit(main())
