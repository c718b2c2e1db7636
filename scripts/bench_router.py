#!/usr/bin/env python3
"""Router cost: pdctl and vllm-router against the client doing the P/D hops itself.

Starts one simulated prefill and one simulated decode engine, a pdctl controller (``external``
backend) and a vllm-router (``--vllm-pd-disaggregation``) in front of the same two engines,
all as real processes on this machine. Three targets, every request disaggregated:

- direct:      the client does vLLM's NixlConnector two-hop flow itself (prefill hop with
               ``max_tokens: 1``, ``stream: false``, ``kv_transfer_params.do_remote_decode``;
               then the decode hop with the returned ``kv_transfer_params``): no router
- pdctl:       client -> pdctl (prefill hop, decode hop)
- vllm-router: client -> vllm-router (prefill hop, decode hop)

For each concurrency (closed-loop workers, streaming completions) the targets are measured
round-robin inside each round, for several rounds, and the rounds merged. TTFT is the
client's time to the first SSE event carrying a token. Each router's CPU time (process and
children) is read before and after each measurement: CPU per request holds up on a noisy,
shared machine where latency and rate do not. Before measuring, a flow check sends a few
requests through each target and reads the engines' counters to confirm that every request
made one prefill (one token) and one KV pull on the decode engine.

    .venv/bin/python scripts/bench_router.py                 # ~3 min on 2 cores
    .venv/bin/python scripts/bench_router.py --quick         # smoke run, ~30 s
    .venv/bin/python scripts/bench_router.py --concurrency 1 64 --duration 10 --rounds 3

vllm-router 0.1.17 lives in its own venv (``make bench`` creates it):

    python3 -m venv .bench/venv-router && .bench/venv-router/bin/pip install vllm-router==0.1.17
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from loadgen import RequestFn, Result, closed_loop, post_json, run, stream_ttft  # noqa: E402

from controller.launchers.process import free_port, tail  # noqa: E402

MODEL = "llama-3-8b"
PROMPT = "benchmark prompt text " * 150  # ~830 tokens (bytes / 4): disaggregated in pdctl
DEFAULT_ROUTER = ROOT / ".bench" / "venv-router" / "bin" / "vllm-router"
INSTALL_HINT = ("python3 -m venv .bench/venv-router && "
                ".bench/venv-router/bin/pip install vllm-router==0.1.17")
TARGETS = ("direct", "pdctl", "vllm-router")
ROUTERS = ("pdctl", "vllm-router")
# NixlConnector's prefill-hop parameters, as vLLM's own proxy (and pdctl) send them.
PREFILL_KV = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
              "remote_block_ids": None, "remote_host": None, "remote_port": None}


# --- processes -------------------------------------------------------------------------------

@dataclass
class Proc:
    name: str
    argv: list[str]
    log: Path
    popen: subprocess.Popen[bytes]

    @property
    def ps(self) -> psutil.Process:
        return psutil.Process(self.popen.pid)


@dataclass
class Fleet:
    tmp: Path
    procs: dict[str, Proc] = field(default_factory=dict)

    def start(self, name: str, argv: list[str]) -> Proc:
        log = self.tmp / f"{name}.log"
        with open(log, "wb") as f:
            popen = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        proc = self.procs[name] = Proc(name, argv, log, popen)
        return proc

    def check_alive(self) -> None:
        for p in self.procs.values():
            if p.popen.poll() is not None:
                raise SystemExit(f"{p.name} exited with {p.popen.returncode}; its log, "
                                 f"{p.log}:\n{tail(p.log, 20)}")

    def stop(self) -> None:
        """SIGTERM every process group, SIGKILL what is left after 10 s."""
        for p in self.procs.values():
            signal_group(p.popen, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for p in self.procs.values():
            try:
                p.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            signal_group(p.popen, signal.SIGKILL)  # stragglers in the group, if any
            p.popen.wait()


def signal_group(popen: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    try:
        os.killpg(popen.pid, sig)  # start_new_session: the group id is the leader's pid
    except ProcessLookupError:
        pass


def http_get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def wait_until(what: str, ok: Callable[[], bool], fleet: Fleet, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        fleet.check_alive()
        try:
            if ok():
                return
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.2)
    raise SystemExit(f"{what} did not come up within {timeout:.0f} s")


def cpu_seconds(proc: psutil.Process) -> float:
    """User + system CPU seconds of a process and its live children."""
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


# --- engine counters -------------------------------------------------------------------------

def metric_sum(text: str, name: str, label: str = "") -> float:
    """Sum of a Prometheus metric's samples (optionally only those whose labels hold
    ``label``)."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name)] in "{ " and label in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


@dataclass(frozen=True)
class Counters:
    prefill_requests: float
    prefill_tokens: float  # tokens generated by the prefill engine
    decode_requests: float
    kv_pulls: float  # KV transfers the decode engine made
    kv_tokens: float  # prompt tokens the decode engine got over the KV transfer

    def __sub__(self, o: Counters) -> Counters:
        return Counters(*(a - b for a, b in zip(self.astuple(), o.astuple(), strict=True)))

    def astuple(self) -> tuple[float, ...]:
        return (self.prefill_requests, self.prefill_tokens, self.decode_requests,
                self.kv_pulls, self.kv_tokens)


def counters(p_url: str, d_url: str) -> Counters:
    p = http_get(f"{p_url}/metrics")[1].decode()
    d = http_get(f"{d_url}/metrics")[1].decode()
    return Counters(metric_sum(p, "vllm:request_success_total"),
                    metric_sum(p, "vllm:generation_tokens_total"),
                    metric_sum(d, "vllm:request_success_total"),
                    metric_sum(d, "vllm:nixl_xfer_time_seconds_count"),
                    metric_sum(d, "vllm:prompt_tokens_by_source_total",
                               'source="external_kv_transfer"'))


# --- requests --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Urls:
    prefill: str
    decode: str
    pdctl: str
    router: str


def request_fn(target: str, urls: Urls, body: dict[str, Any]) -> RequestFn:
    """``fn(session) -> TTFT seconds`` for one target."""
    if target == "direct":
        p_comp, d_comp = f"{urls.prefill}/v1/completions", f"{urls.decode}/v1/completions"
        pbody = {**body, "stream": False, "max_tokens": 1, "kv_transfer_params": PREFILL_KV}
        pbody.pop("stream_options", None)

        async def direct(s: aiohttp.ClientSession) -> float:
            t0 = time.perf_counter()
            answer = await post_json(s, p_comp, pbody)
            kv = answer["kv_transfer_params"]
            return await stream_ttft(s, d_comp, {**body, "kv_transfer_params": kv}, t0)
        return direct
    url = {"pdctl": urls.pdctl, "vllm-router": urls.router}[target] + "/v1/completions"

    async def routed(s: aiohttp.ClientSession) -> float:
        return await stream_ttft(s, url, body)
    return routed


def flow_check(targets: list[str], urls: Urls, body: dict[str, Any],
               n: int = 5) -> dict[str, dict[str, Any]]:
    """Send ``n`` sequential requests through each target and read what the engines did."""
    out: dict[str, dict[str, Any]] = {}
    for target in targets:
        before = counters(urls.prefill, urls.decode)
        res = run(closed_loop(request_fn(target, urls, body), 1, 60.0, max_requests=n))
        delta = counters(urls.prefill, urls.decode) - before
        ok = (res.total_done == n and res.errors == 0 and delta.prefill_requests == n
              and delta.prefill_tokens == n and delta.kv_pulls == n
              and delta.decode_requests == n and delta.kv_tokens > 0)
        out[target] = {"requests": n, "ok": res.total_done, "errors": res.errors,
                       "error_samples": res.error_samples,
                       "prefill_requests": delta.prefill_requests,
                       "prefill_generated_tokens": delta.prefill_tokens,
                       "decode_requests": delta.decode_requests,
                       "decode_kv_pulls": delta.kv_pulls,
                       "kv_prompt_tokens_per_request": delta.kv_tokens / n,
                       "two_hops_verified": ok}
    return out


# --- main ------------------------------------------------------------------------------------

def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=5.0, help="measured seconds per cell")
    ap.add_argument("--warmup", type=float, default=1.0,
                    help="seconds per cell before the measured window (connections, caches)")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved repetitions")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64, 256],
                    help="closed-loop workers per cell (default: 1 16 64 256)")
    ap.add_argument("--max-tokens", type=int, default=4, help="tokens per request")
    ap.add_argument("--time-scale", type=float, default=0.1, help="sim engines' time scale")
    ap.add_argument("--json", type=Path, default=ROOT / "bench-results" / "router.json",
                    help="raw per-cell results (default: bench-results/router.json)")
    ap.add_argument("--vllm-router", type=Path, default=DEFAULT_ROUTER,
                    help="the vllm-router executable (default: .bench/venv-router/bin/...)")
    ap.add_argument("--no-vllm-router", action="store_true",
                    help="measure direct and pdctl only")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: concurrency 1 and 16, 1 round of 1.5 s")
    args = ap.parse_args()
    if args.quick:
        args.concurrency, args.rounds, args.duration, args.warmup = [1, 16], 1, 1.5, 0.5
    return args


def main() -> int:
    args = parse_args()
    targets = [t for t in TARGETS if not (args.no_vllm_router and t == "vllm-router")]
    router_bin = shutil.which(str(args.vllm_router)) or str(args.vllm_router)
    if "vllm-router" in targets and not (os.path.isfile(router_bin)
                                          and os.access(router_bin, os.X_OK)):
        print(f"vllm-router not found at {args.vllm_router}. Install vllm-router 0.1.17 in its "
              f"own venv:\n    {INSTALL_HINT}\nor pass --vllm-router PATH "
              "(or --no-vllm-router to skip it).", file=sys.stderr)
        return 2

    # SIGINT, SIGTERM and SIGHUP unwind like Ctrl-C, so the finally below stops every process.
    def interrupted(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with it ignored
    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGHUP, interrupted)

    tmp = Path(tempfile.mkdtemp(prefix="pdctl-bench-router-"))
    fleet = Fleet(tmp)
    try:
        return bench(args, targets, router_bin, fleet)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    finally:
        fleet.stop()
        print(f"(stopped {len(fleet.procs)} processes; logs in {tmp})", file=sys.stderr)


def bench(args: argparse.Namespace, targets: list[str], router_bin: str, fleet: Fleet) -> int:
    pp, dp, cp, rp, rmp = (free_port() for _ in range(5))
    urls = Urls(*(f"http://127.0.0.1:{p}" for p in (pp, dp, cp, rp)))
    for role, port in (("prefill", pp), ("decode", dp)):
        fleet.start(role, [sys.executable, "-m", "controller.engines.sim", "--port", str(port),
                           "--role", role, "--model", MODEL, "--hardware", "h100-sxm",
                           "--tp", "1", "--time-scale", str(args.time_scale)])
    cfg = {"backend": "external", "model": {"name": MODEL},
           "pools": {"prefill": {"urls": [urls.prefill], "tp": 1},
                     "decode": {"urls": [urls.decode], "tp": 1}},
           "routing": {"disagg_min_prompt_tokens": 16, "prefill_policy": "round_robin",
                       "decode_policy": "round_robin"},
           "controller": {"port": cp, "state_dir": str(fleet.tmp / "state")}}
    (fleet.tmp / "pdctl.yaml").write_text(yaml.safe_dump(cfg))
    fleet.start("pdctl", [sys.executable, "-m", "controller.cli", "controller", "--config",
                          str(fleet.tmp / "pdctl.yaml"), "--log-level", "warning"])
    if "vllm-router" in targets:
        # Round robin on both pools, as pdctl above (the default cache_aware keeps a radix
        # tree of prompts); its own Prometheus port, so parallel runs do not collide on 29000.
        fleet.start("vllm-router", [
            router_bin, "--vllm-pd-disaggregation", "--prefill", urls.prefill,
            "--decode", urls.decode, "--host", "127.0.0.1", "--port", str(rp),
            "--kv-connector", "nixl", "--policy", "round_robin",
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(rmp),
            "--log-level", "warning"])

    def healthy(url: str) -> Callable[[], bool]:
        return lambda: http_get(f"{url}/health")[0] == 200

    for url in (urls.prefill, urls.decode):
        wait_until(url, healthy(url), fleet)
    wait_until("pdctl", lambda: json.loads(http_get(f"{urls.pdctl}/healthz")[1])["ready"]
               == {"prefill": 1, "decode": 1}, fleet)
    if "vllm-router" in targets:
        wait_until("vllm-router", healthy(urls.router), fleet)

    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": args.max_tokens, "stream": True}
    print(f"flow check: {len(targets)} targets x 5 sequential requests", file=sys.stderr)
    flow = flow_check(targets, urls, body)
    for target, f in flow.items():
        print(f"  {target:12} {'OK ' if f['two_hops_verified'] else 'BAD'} "
              f"ok={f['ok']} errors={f['errors']} prefill requests +{f['prefill_requests']:.0f}"
              f" (tokens +{f['prefill_generated_tokens']:.0f}), decode requests "
              f"+{f['decode_requests']:.0f}, KV pulls +{f['decode_kv_pulls']:.0f} "
              f"({f['kv_prompt_tokens_per_request']:.0f} prompt tokens each)", file=sys.stderr)
        for e in f["error_samples"]:
            print(f"    {e}", file=sys.stderr)
    if not all(f["two_hops_verified"] for f in flow.values()):
        print("flow check FAILED: see above; measuring anyway", file=sys.stderr)

    fns = {t: request_fn(t, urls, body) for t in targets}
    router_ps = {name: fleet.procs[name].ps for name in ROUTERS if name in fleet.procs}
    cells: list[dict[str, Any]] = []
    n_cells = args.rounds * len(args.concurrency) * len(targets)
    print(f"measuring {n_cells} cells of {args.warmup:g}+{args.duration:g} s", file=sys.stderr)
    load0 = os.getloadavg()[0]
    for rnd in range(args.rounds):
        order = targets[rnd % len(targets):] + targets[:rnd % len(targets)]  # rotate per round
        for conc in args.concurrency:
            for target in order:
                fleet.check_alive()
                before = counters(urls.prefill, urls.decode)
                cpu0 = {n: cpu_seconds(p) for n, p in router_ps.items()}
                client0, wall0 = time.process_time(), time.perf_counter()
                res = run(closed_loop(fns[target], conc, args.duration, warmup=args.warmup))
                wall = time.perf_counter() - wall0
                client_cpu = time.process_time() - client0
                cpu = {n: cpu_seconds(p) - cpu0[n] for n, p in router_ps.items()}
                delta = counters(urls.prefill, urls.decode) - before
                cells.append({"round": rnd, "concurrency": conc, "target": target,
                              **res.to_json(), "ttft_s": res.ttft, "wall_s": wall,
                              "router_cpu_s": cpu, "client_cpu_s": client_cpu,
                              "engine_counters": delta.__dict__})
                print(f"  round {rnd} c={conc:<4} {target:12} rps {res.rps:8.1f} "
                      f"p50 {res.pct(.5):7.2f} ms p99 {res.pct(.99):7.2f} ms "
                      f"errors {res.errors} KV pulls {delta.kv_pulls:.0f}/"
                      f"{res.total_done + res.errors} requests", file=sys.stderr)
                for e in res.error_samples[:2]:
                    print(f"    {e}", file=sys.stderr)

    load = (load0, os.getloadavg()[0])
    summary = report(cells, targets, args, load)
    print("\npdctl:       " + shlex.join(fleet.procs["pdctl"].argv[1:]) + "  # routing: "
          + json.dumps(cfg["routing"]))
    if "vllm-router" in fleet.procs:
        print("vllm-router: " + shlex.join(fleet.procs["vllm-router"].argv))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(no_nan({
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "model": MODEL, "prompt_chars": len(PROMPT), "machine_cpus": os.cpu_count(),
        "loadavg_1m_before_after": load,
        "argv": {p.name: p.argv for p in fleet.procs.values()},
        "flow_check": flow, "summary": summary, "cells": cells}), indent=1))
    print(f"\nraw results: {args.json}")
    return 0


def no_nan(x: Any) -> Any:
    """NaN (no samples) and infinity as null, so the file is strict JSON."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: no_nan(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [no_nan(v) for v in x]
    return x


# --- report ----------------------------------------------------------------------------------

def merged_cells(cells: list[dict[str, Any]], target: str,
                 conc: int) -> tuple[Result, dict[str, Any]]:
    mine = [c for c in cells if c["target"] == target and c["concurrency"] == conc]
    res = Result.merge([Result(c["ttft_s"], c["done"], c["errors"], c["seconds"],
                               c["total_done"], c["error_samples"]) for c in mine])
    requests = sum(c["total_done"] + c["errors"] for c in mine)
    cpu = {n: sum(c["router_cpu_s"][n] for c in mine) for n in mine[0]["router_cpu_s"]}
    rps = [c["rps"] for c in mine]
    p50 = [c["p50_ms"] for c in mine if not math.isnan(c["p50_ms"])]
    return res, {"requests": requests, "cpu": cpu,
                 "rps_spread": max(rps) / min(rps) if rps and min(rps) > 0 else math.inf,
                 "p50_spread_ms": max(p50) - min(p50) if p50 else math.nan,
                 "client_cpu": sum(c["client_cpu_s"] for c in mine),
                 "wall": sum(c["wall_s"] for c in mine),
                 "kv_pulls": sum(c["engine_counters"]["kv_pulls"] for c in mine)}


def fmt(x: float, spec: str = "7.2f") -> str:
    return "n/a".rjust(len(format(0.0, spec))) if math.isnan(x) else format(x, spec)


def report(cells: list[dict[str, Any]], targets: list[str], args: argparse.Namespace,
           load: tuple[float, float] = (math.nan, math.nan)) -> dict[str, Any]:
    routers = [t for t in targets if t != "direct"]
    print(f"\nrouter cost: {args.rounds} interleaved round(s) x {args.duration:g} s per cell "
          f"(+{args.warmup:g} s warm-up), sim {MODEL} h100-sxm TP1 x (1 prefill + 1 decode), "
          f"time scale {args.time_scale}, {len(PROMPT)}-char prompt, {args.max_tokens} tokens, "
          f"streaming, closed loop; {os.cpu_count()} CPUs, load average {fmt(load[0], '.1f')} "
          f"before, {fmt(load[1], '.1f')} after (on a shared machine latency and rate are "
          "noisy, CPU per request is not)")
    summary: dict[str, Any] = {}
    hdr = f"{'conc':>5} | {'direct p50':>10} {'p99':>7} {'rps':>7}"
    for r in routers:
        hdr += f" | {r + ' p50':>15} {'p99':>7} {'rps':>7} {'+p50':>7} {'+p99':>7}"
    print("\nTTFT (ms) and requests/s; +p50/+p99: added TTFT against direct")
    print(hdr)
    for conc in args.concurrency:
        d, _ = merged_cells(cells, "direct", conc)
        line = f"{conc:>5} | {fmt(d.pct(.5), '10.2f')} {fmt(d.pct(.99))} {fmt(d.rps, '7.1f')}"
        _, dx = merged_cells(cells, "direct", conc)
        row: dict[str, Any] = {"direct": {"p50_ms": d.pct(.5), "p99_ms": d.pct(.99),
                                          "rps": d.rps, "errors": d.errors,
                                          "rps_round_spread": dx["rps_spread"],
                                          "p50_round_spread_ms": dx["p50_spread_ms"]}}
        for r in routers:
            x, extra = merged_cells(cells, r, conc)
            added50, added99 = x.pct(.5) - d.pct(.5), x.pct(.99) - d.pct(.99)
            line += (f" | {fmt(x.pct(.5), '15.2f')} {fmt(x.pct(.99))} {fmt(x.rps, '7.1f')} "
                     f"{fmt(added50, '+7.2f')} {fmt(added99, '+7.2f')}")
            cpu_us = extra["cpu"][r] / extra["requests"] * 1e6 if extra["requests"] else math.nan
            row[r] = {"p50_ms": x.pct(.5), "p99_ms": x.pct(.99), "rps": x.rps,
                      "errors": x.errors, "added_p50_ms": added50, "added_p99_ms": added99,
                      "rps_vs_direct": x.rps / d.rps if d.rps else math.nan,
                      "cpu_us_per_request": cpu_us, "requests": extra["requests"],
                      "kv_pulls": extra["kv_pulls"], "rps_round_spread": extra["rps_spread"],
                      "p50_round_spread_ms": extra["p50_spread_ms"]}
        summary[str(conc)] = row
        print(line)

    # A router's CPU while the other targets were measured: its idle cost (health checks,
    # metrics polls, reconcile ticks), included in its CPU per request; "net" takes it out.
    idle: dict[str, float] = {}
    for r in routers:
        others = [c for c in cells if c["target"] != r]
        secs = sum(c["wall_s"] for c in others)
        idle[r] = sum(c["router_cpu_s"][r] for c in others) / secs if secs else 0.0
    summary["idle_cpu_percent"] = {r: v * 100 for r, v in idle.items()}
    for conc in args.concurrency:
        for r in routers:
            _, extra = merged_cells(cells, r, conc)
            n = extra["requests"]
            summary[str(conc)][r]["net_cpu_us_per_request"] = (
                (extra["cpu"][r] - idle[r] * extra["wall"]) / n * 1e6 if n else math.nan)

    print("\nrequest-rate ratios; router CPU per request (process + children, over all requests "
          "of the cell incl. warm-up; net: less the router's idle CPU); client CPU per "
          "request; errors")
    hdr = f"{'conc':>5} |"
    for r in routers:
        hdr += f" {r + '/direct':>18}"
    if len(routers) == 2:
        hdr += f" {'pdctl/vllm-router':>18}"
    for r in routers:
        hdr += f" | {r + ' CPU us/req (net)':>28}"
    hdr += f" | {'client CPU us/req':>17} | {'errors':>6}"
    print(f"(client CPU: {'/'.join(targets)})")
    print(hdr)
    for conc in args.concurrency:
        row = summary[str(conc)]
        line = f"{conc:>5} |"
        for r in routers:
            line += f" {fmt(row[r]['rps_vs_direct'], '18.2f')}"
        if len(routers) == 2:
            pv = row["pdctl"]["rps"] / row["vllm-router"]["rps"] if row["vllm-router"][
                "rps"] else math.nan
            row["rps_pdctl_vs_vllm_router"] = pv
            line += f" {fmt(pv, '18.2f')}"
        for r in routers:
            cell = (f"{fmt(row[r]['cpu_us_per_request'], '.0f')} "
                    f"({fmt(row[r]['net_cpu_us_per_request'], '.0f')})")
            line += f" | {cell:>28}"
        client = []
        for t in targets:
            _, extra = merged_cells(cells, t, conc)
            client.append(extra["client_cpu"] / extra["requests"] * 1e6
                          if extra["requests"] else math.nan)
        row["client_cpu_us_per_request"] = dict(zip(targets, client, strict=True))
        line += f" | {'/'.join(fmt(c, '.0f') for c in client):>17}"
        line += f" | {row['direct']['errors'] + sum(row[r]['errors'] for r in routers):>6}"
        print(line)
    print("idle CPU while other targets ran: " + ", ".join(
        f"{r} {fmt(v * 100, '.2f')}% of a core" for r, v in idle.items()))

    print("\ngoals")
    goals: dict[str, Any] = {}
    if "vllm-router" in routers and "64" in summary:
        p, v = summary["64"]["pdctl"]["rps"], summary["64"]["vllm-router"]["rps"]
        met = p >= v
        goals["pdctl_rps_ge_vllm_router_c64"] = met
        spread = max(summary["64"][t]["rps_round_spread"] for t in ("pdctl", "vllm-router"))
        print(f"  pdctl rps >= vllm-router rps at c=64: {'MET' if met else 'NOT MET'} "
              f"(pdctl {p:.1f} rps, vllm-router {v:.1f} rps, ratio {p / v:.2f}; "
              f"CPU per request {summary['64']['pdctl']['cpu_us_per_request']:.0f} vs "
              f"{summary['64']['vllm-router']['cpu_us_per_request']:.0f} us)"
              + unreliable(spread > 1.5, f"the rounds' rps differ up to {spread:.2f}x"))
    else:
        print("  pdctl rps >= vllm-router rps at c=64: not measured")
    if "1" in summary:
        a = summary["1"]["pdctl"]["added_p50_ms"]
        met = a <= 1.0
        goals["pdctl_added_p50_le_1ms_c1"] = met
        spread_ms = max(summary["1"][t]["p50_round_spread_ms"] for t in ("direct", "pdctl"))
        print(f"  pdctl added p50 TTFT <= 1 ms at c=1: {'MET' if met else 'NOT MET'} "
              f"(added {a:+.2f} ms: pdctl {summary['1']['pdctl']['p50_ms']:.2f} ms, direct "
              f"{summary['1']['direct']['p50_ms']:.2f} ms)"
              + unreliable(spread_ms > 1.0, f"the rounds' p50 differ by up to {spread_ms:.2f} ms"))
    else:
        print("  pdctl added p50 TTFT <= 1 ms at c=1: not measured")
    summary["goals"] = goals
    return summary


def unreliable(flag: bool, why: str) -> str:
    """A warning under a goal whose rounds disagree by more than the goal's margin."""
    return (f"\n      UNRELIABLE: {why}; the machine was too noisy for a verdict (rerun on a "
            "quiet machine, or with more --rounds)") if flag else ""


if __name__ == "__main__":
    sys.exit(main())
