"""Router cost: pdctl and vllm-router against the client doing the P/D hops itself.

Two cases, each with its own engines, a pdctl controller (``external`` backend) and a
vllm-router (``--vllm-pd-disaggregation``) in front of the same two engines, all real
processes on this machine:

- engine-bound: one simulated prefill and one simulated decode engine (llama-3-8b, h100-sxm,
  TP1, time scale 0.1): the engines take milliseconds per request, as real ones do, and
  the router's cost is what it adds to their latency;
- router-bound: ``bench.instant_engine`` (a prefill and a decode port that answer the moment
  a request is parsed, tens of microseconds of CPU per request): the router's own CPU per
  request decides the rate.

Three targets, every request disaggregated:

- direct:      the client does vLLM's NixlConnector two-hop flow itself (prefill hop with
               ``max_tokens: 1``, ``stream: false``, ``kv_transfer_params.do_remote_decode``;
               then the decode hop with the returned ``kv_transfer_params``): no router
- pdctl:       client -> pdctl (prefill hop, decode hop)
- vllm-router: client -> vllm-router (prefill hop, decode hop)

For each concurrency (closed-loop workers, streaming completions) the targets are measured
round-robin inside each round, for several rounds, and the rounds merged. TTFT is the
client's time to the first SSE event carrying a token. Each router's CPU time (process and
children) is read before and after each measurement. Before measuring, a flow check sends a
few requests through each target and reads the engines' counters to confirm that every
request made one prefill (one token) and one KV pull on the decode engine.

``--pdctl-root PATH`` runs the controller from another source tree (e.g. ``git worktree add
/tmp/pdctl-before <commit>``), with this interpreter and ``PYTHONPATH=PATH``: before/after
figures measured the same way in one session. Engines and client stay this checkout's.

    .venv/bin/python -m bench.router                        # ~5 min on 2 cores
    .venv/bin/python -m bench.router --quick                # smoke run, ~1 min
    .venv/bin/python -m bench.router --case router-bound --rounds 4
    .venv/bin/python -m bench.router --pdctl-root /tmp/pdctl-before --json /tmp/before.json

vllm-router 0.1.17 lives in its own venv (``make bench-router`` creates it):

    python3 -m venv .bench/venv-router && .bench/venv-router/bin/pip install vllm-router==0.1.17
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import shlex
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench import cpu, prom
from bench.fleet import (
    Fleet,
    FleetError,
    controller_package,
    free_port,
    healthy,
    instant_engine_argv,
    interrupt_on_signals,
    sim_engine_argv,
    source_of,
    start_controller,
    wait_until,
)
from bench.loadgen import Client, RequestFn, Result, closed_loop, run
from bench.report import ROOT, fmt, ratio, write_json

TITLE = "Router cost: pdctl vs vllm-router 0.1.17"
ABOUT = (
    "Two cases, reached three ways in interleaved rounds: `direct` (the client does the "
    "NixlConnector two-hop flow itself, the no-router baseline), `pdctl` (the controller, "
    "`external` backend) and `vllm-router` (`--vllm-pd-disaggregation`, in its own "
    "virtualenv). **Engine-bound**: one simulated prefill and one simulated decode engine "
    "(llama-3-8b, h100-sxm, TP1, time scale 0.1), closed-loop clients at concurrency 1, 16, 64 "
    "and 256. **Router-bound**: an instant engine pair (`bench/instant_engine.py`: answers "
    "the moment a request is parsed, tens of microseconds of CPU per request), so the "
    "router's own cost decides; concurrency 1 and 64. Streaming completions. Added TTFT is "
    "each router's client TTFT minus direct's; CPU per request is each router process's CPU "
    "time over the requests it served (robust to a noisy machine, unlike latency and rate).")

MODEL = "llama-3-8b"
PROMPT = "benchmark prompt text " * 150  # ~830 tokens (bytes / 4): disaggregated in pdctl
DEFAULT_ROUTER = ROOT / ".bench" / "venv-router" / "bin" / "vllm-router"
INSTALL_HINT = ("python3 -m venv .bench/venv-router && "
                ".bench/venv-router/bin/pip install vllm-router==0.1.17")
TARGETS = ("direct", "pdctl", "vllm-router")
ROUTERS = ("pdctl", "vllm-router")
CASES = ("engine-bound", "router-bound")
ROUTING = {"disagg_min_prompt_tokens": 16, "prefill_policy": "round_robin",
           "decode_policy": "round_robin"}
# NixlConnector's prefill-hop parameters, as vLLM's own proxy (and pdctl) send them.
PREFILL_KV = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
              "remote_block_ids": None, "remote_host": None, "remote_port": None}


@dataclass
class Options:
    cases: tuple[str, ...] = CASES
    duration: float = 5.0  # measured seconds per cell
    warmup: float = 1.0  # seconds per cell before the window
    rounds: int | None = None  # default: engine-bound 2, router-bound 3
    concurrency: list[int] | None = None  # default: engine-bound 1 16 64 256, router-bound 1 64
    max_tokens: int = 4
    time_scale: float = 0.1  # the engine-bound case's sim engines
    vllm_router: Path | None = DEFAULT_ROUTER  # None: measure direct and pdctl only
    pdctl_root: Path | None = None
    quick: bool = False

    def rounds_of(self, case: str) -> int:
        if self.rounds is not None:
            return self.rounds
        return 1 if self.quick else (3 if case == "router-bound" else 2)

    def concurrency_of(self, case: str) -> list[int]:
        if self.concurrency is not None:
            return self.concurrency
        if case == "router-bound":
            return [1, 64]
        return [1, 16] if self.quick else [1, 16, 64, 256]

    @staticmethod
    def defaults(quick: bool) -> Options:
        o = Options(quick=quick)
        if quick:
            o.duration, o.warmup = 1.5, 0.5
        return o


# ---- engine counters --------------------------------------------------------------------

@dataclass(frozen=True)
class Counters:
    prefill_requests: float = 0.0
    prefill_tokens: float = 0.0  # tokens generated by the prefill engine
    decode_requests: float = 0.0
    kv_pulls: float = 0.0  # KV transfers the decode engine made
    kv_tokens: float = 0.0  # prompt tokens the decode engine got over the KV transfer
    stale_reads: float = 0.0  # reads of handles the prefill no longer tracked

    def __sub__(self, o: Counters) -> Counters:
        return Counters(*(a - b for a, b in zip(self.astuple(), o.astuple(), strict=True)))

    def astuple(self) -> tuple[float, ...]:
        return (self.prefill_requests, self.prefill_tokens, self.decode_requests,
                self.kv_pulls, self.kv_tokens, self.stale_reads)


def counters(p_url: str, d_url: str) -> Counters:
    p = prom.parse(httpx.get(f"{p_url}/metrics", timeout=10).text)
    d = prom.parse(httpx.get(f"{d_url}/metrics", timeout=10).text)
    return Counters(p.sum("vllm:request_success_total"), p.sum("vllm:generation_tokens_total"),
                    d.sum("vllm:request_success_total"),
                    d.sum("vllm:nixl_xfer_time_seconds_count"),
                    d.sum("vllm:prompt_tokens_by_source_total", source="external_kv_transfer"),
                    p.sum("vllm:nixl_num_notifications_after_expiry_total"))


# ---- results ----------------------------------------------------------------------------

@dataclass
class FlowCheck:
    requests: int
    ok: int
    errors: int
    error_samples: list[str]
    counters: Counters  # engine counters' growth over the check
    verified: bool  # one prefill (one token) and one KV pull per request, no stale read


@dataclass
class Cell:
    """One measurement: a target at a concurrency in a round."""

    round: int
    concurrency: int
    target: str
    result: Result
    wall_s: float
    router_cpu_s: dict[str, float]  # every router's CPU over this cell (idle ones too)
    engines_cpu_s: float
    client_cpu_s: float
    counters: Counters


@dataclass
class Row:
    """One target at one concurrency, merged over the rounds."""

    p50_ms: float
    p99_ms: float
    rps: float
    errors: int
    requests: int  # incl. warm-up and late finishers: the denominator of CPU per request
    added_p50_ms: float = math.nan  # against direct
    added_p99_ms: float = math.nan
    rps_vs_direct: float = math.nan
    cpu_us_per_request: float = math.nan  # the router's (process + children)
    net_cpu_us_per_request: float = math.nan  # less its idle CPU
    client_cpu_us_per_request: float = math.nan
    engines_cpu_us_per_request: float = math.nan
    kv_pulls: float = 0.0
    rps_round_spread: float = math.nan  # max / min of the rounds' rps
    p50_round_spread_ms: float = math.nan  # max - min of the rounds' p50


@dataclass
class Goal:
    text: str
    met: bool | None  # None: not measured
    detail: str
    unreliable: str | None = None  # why the rounds disagree by more than the goal's margin

    def line(self) -> str:
        verdict = "not measured" if self.met is None else ("MET" if self.met else "NOT MET")
        out = f"  {self.text}: {verdict}" + (f" ({self.detail})" if self.detail else "")
        if self.unreliable:
            out += (f"\n      UNRELIABLE: {self.unreliable}; the machine was too noisy for a "
                    "verdict (rerun on a quiet machine, or with more --rounds)")
        return out


@dataclass
class CaseResult:
    case: str
    engines: str  # what the engines were
    rounds: int
    duration: float
    warmup: float
    concurrency: list[int]
    targets: list[str]
    flow: dict[str, FlowCheck]
    rows: dict[int, dict[str, Row]]
    ratio_pdctl_vllm_router: dict[int, float]
    idle_cpu_percent: dict[str, float]  # a router's CPU while the other targets ran
    goals: list[Goal]
    argv: dict[str, list[str]]
    load_before_after: tuple[float, float]
    logs: str
    cells: list[Cell] = field(default_factory=list)


@dataclass
class RouterResult:
    options: Options
    pdctl_source: str
    model: str
    prompt_chars: int
    machine_cpus: int | None
    cases: list[CaseResult]


# ---- requests ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Urls:
    prefill: str
    decode: str
    pdctl: str
    router: str


def request_fn(target: str, urls: Urls, body: dict[str, Any]) -> RequestFn:
    """``fn(client) -> TTFT seconds`` for one target."""
    if target == "direct":
        p_comp, d_comp = f"{urls.prefill}/v1/completions", f"{urls.decode}/v1/completions"
        pbody = {**body, "stream": False, "max_tokens": 1, "kv_transfer_params": PREFILL_KV}
        pbody.pop("stream_options", None)
        ppayload = orjson.dumps(pbody)

        async def direct(c: Client) -> float:
            t0 = time.perf_counter()
            answer = await c.post_json(p_comp, ppayload)
            kv = answer["kv_transfer_params"]
            # A body carrying a KV handle goes out once (no re-send on a fresh connection).
            return await c.request(d_comp, orjson.dumps({**body, "kv_transfer_params": kv}),
                                   stream=True, t0=t0, resend=False)
        return direct
    url = {"pdctl": urls.pdctl, "vllm-router": urls.router}[target] + "/v1/completions"
    payload = orjson.dumps(body)

    async def routed(c: Client) -> float:
        return await c.request(url, payload, stream=True)
    return routed


def flow_check(targets: list[str], urls: Urls, body: dict[str, Any],
               n: int = 5) -> dict[str, FlowCheck]:
    """Send ``n`` sequential requests through each target and read what the engines did."""
    out: dict[str, FlowCheck] = {}
    for target in targets:
        before = counters(urls.prefill, urls.decode)
        res = run(closed_loop(request_fn(target, urls, body), 1, 60.0, max_requests=n))
        d = counters(urls.prefill, urls.decode) - before
        ok = (res.total_done == n and res.errors == 0 and d.prefill_requests == n
              and d.prefill_tokens == n and d.kv_pulls == n and d.decode_requests == n
              and d.kv_tokens > 0 and d.stale_reads == 0)
        out[target] = FlowCheck(n, res.total_done, res.errors, res.error_samples, d, ok)
    return out


# ---- one case -----------------------------------------------------------------------------

def start_case(case: str, opts: Options, fleet: Fleet, targets: list[str],
               router_bin: str) -> tuple[Urls, str]:
    """Engines, pdctl and vllm-router for ``case``, ready; the URLs and what the engines are."""
    pp, dp, cp, rp, rmp = (free_port() for _ in range(5))
    urls = Urls(*(f"http://127.0.0.1:{p}" for p in (pp, dp, cp, rp)))
    if case == "router-bound":
        fleet.start("engines", instant_engine_argv(pp, dp, MODEL))
        engines = f"instant engine pair (bench.instant_engine, model name {MODEL})"
    else:
        for role, port in (("prefill", pp), ("decode", dp)):
            fleet.start(role, sim_engine_argv(port, role, MODEL, "h100-sxm", 1,
                                              opts.time_scale))
        engines = (f"sim {MODEL} h100-sxm TP1 x (1 prefill + 1 decode), time scale "
                   f"{opts.time_scale}")
    cfg = {"backend": "external", "model": {"name": MODEL},
           "pools": {"prefill": {"urls": [urls.prefill], "tp": 1},
                     "decode": {"urls": [urls.decode], "tp": 1}},
           "routing": ROUTING, "controller": {"port": cp}}
    start_controller(fleet.workdir, cfg, name="pdctl", fleet=fleet,
                     pdctl_root=opts.pdctl_root, log_level="warning", wait="none")
    if "vllm-router" in targets:
        # Round robin on both pools, as pdctl above (the default cache_aware keeps a radix
        # tree of prompts); its own Prometheus port, so parallel runs do not collide on 29000.
        fleet.start("vllm-router", [
            router_bin, "--vllm-pd-disaggregation", "--prefill", urls.prefill,
            "--decode", urls.decode, "--host", "127.0.0.1", "--port", str(rp),
            "--kv-connector", "nixl", "--policy", "round_robin",
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(rmp),
            "--log-level", "warning"])
    for url in (urls.prefill, urls.decode):
        wait_until(url, functools.partial(healthy, url), 90, fleet)
    wait_until("pdctl", lambda: httpx.get(f"{urls.pdctl}/healthz", timeout=2).json()["ready"]
               == {"prefill": 1, "decode": 1}, 90, fleet)
    if "vllm-router" in targets:
        wait_until("vllm-router", lambda: healthy(urls.router), 90, fleet)
    return urls, engines


def measure_case(case: str, opts: Options, targets: list[str], router_bin: str,
                 workdir: Path) -> CaseResult:
    concurrency, rounds = opts.concurrency_of(case), opts.rounds_of(case)
    with Fleet(workdir / case) as fleet:
        print(f"[{case}] starting engines and routers; logs in {fleet.workdir}", flush=True)
        urls, engines = start_case(case, opts, fleet, targets, router_bin)
        body = {"model": MODEL, "prompt": PROMPT, "max_tokens": opts.max_tokens,
                "stream": True}
        print(f"[{case}] flow check: {len(targets)} targets x 5 sequential requests",
              flush=True)
        flow = flow_check(targets, urls, body)
        for target, f in flow.items():
            c = f.counters
            print(f"  {target:12} {'OK ' if f.verified else 'BAD'} ok={f.ok} errors={f.errors}"
                  f" prefill requests +{c.prefill_requests:.0f} (tokens "
                  f"+{c.prefill_tokens:.0f}), decode requests +{c.decode_requests:.0f}, KV "
                  f"pulls +{c.kv_pulls:.0f} ({c.kv_tokens / f.requests:.0f} prompt tokens "
                  f"each), stale reads +{c.stale_reads:.0f}", flush=True)
            for e in f.error_samples:
                print(f"    {e}", flush=True)
        if not all(f.verified for f in flow.values()):
            print(f"[{case}] flow check FAILED: see above; measuring anyway", flush=True)

        fns = {t: request_fn(t, urls, body) for t in targets}
        router_ps = {n: fleet.procs[n].ps for n in ROUTERS if n in fleet.procs}
        engine_ps = [fleet.procs[n].ps for n in ("engines", "prefill", "decode")
                     if n in fleet.procs]
        cells: list[Cell] = []
        n_cells = rounds * len(concurrency) * len(targets)
        print(f"[{case}] measuring {n_cells} cells of {opts.warmup:g}+{opts.duration:g} s",
              flush=True)
        load0 = os.getloadavg()[0]
        for rnd in range(rounds):
            order = targets[rnd % len(targets):] + targets[:rnd % len(targets)]  # rotate
            for conc in concurrency:
                for target in order:
                    fleet.check_alive()
                    before = counters(urls.prefill, urls.decode)
                    cpu0 = {n: cpu.tree_seconds(p) for n, p in router_ps.items()}
                    eng0 = sum(cpu.process_seconds(p) for p in engine_ps)
                    client0, wall0 = time.process_time(), time.perf_counter()
                    res = run(closed_loop(fns[target], conc, opts.duration,
                                          warmup=opts.warmup))
                    wall = time.perf_counter() - wall0
                    client_cpu = time.process_time() - client0
                    router_cpu = {n: cpu.tree_seconds(p) - cpu0[n] for n, p in router_ps.items()}
                    eng = sum(cpu.process_seconds(p) for p in engine_ps) - eng0
                    delta = counters(urls.prefill, urls.decode) - before
                    cells.append(Cell(rnd, conc, target, res, wall, router_cpu, eng,
                                      client_cpu, delta))
                    print(f"  round {rnd} c={conc:<4} {target:12} rps {res.rps:8.1f} "
                          f"p50 {res.pct(.5):7.2f} ms p99 {res.pct(.99):7.2f} ms "
                          f"errors {res.errors} KV pulls {delta.kv_pulls:.0f}/"
                          f"{res.total_done + res.errors} requests", flush=True)
                    for e in res.error_samples[:2]:
                        print(f"    {e}", flush=True)
        load = (load0, os.getloadavg()[0])
        argv = {p.name: p.argv for p in fleet.procs.values()}
        stopped = fleet.stop(first=("pdctl",))
        print(f"[{case}] stopped {len(stopped.exit_codes)} processes in {stopped.seconds} s"
              + (f"; LEFT RUNNING: {stopped.left}" if stopped.left else ""), flush=True)
    return summarize(case, engines, rounds, opts, concurrency, targets, flow, cells, argv,
                     load, str(workdir / case))


# ---- summary -----------------------------------------------------------------------------

def _merged(cells: list[Cell], target: str, conc: int) -> tuple[Result, list[Cell]]:
    mine = [c for c in cells if c.target == target and c.concurrency == conc]
    return Result.merge([c.result for c in mine]), mine


def summarize(case: str, engines: str, rounds: int, opts: Options, concurrency: list[int],
              targets: list[str], flow: dict[str, FlowCheck], cells: list[Cell],
              argv: dict[str, list[str]], load: tuple[float, float], logs: str
              ) -> CaseResult:
    routers = [t for t in targets if t != "direct"]
    # A router's CPU while the other targets were measured: its idle cost (health checks,
    # metrics polls, reconcile ticks), included in its CPU per request; "net" takes it out.
    idle: dict[str, float] = {}
    for r in routers:
        others = [c for c in cells if c.target != r]
        secs = sum(c.wall_s for c in others)
        idle[r] = sum(c.router_cpu_s[r] for c in others) / secs if secs else 0.0
    rows: dict[int, dict[str, Row]] = {}
    ratios: dict[int, float] = {}
    for conc in concurrency:
        rows[conc] = {}
        for t in targets:
            res, mine = _merged(cells, t, conc)
            n = sum(c.result.total_done + c.result.errors for c in mine)
            rps = [c.result.rps for c in mine]
            p50s = [p for p in (c.result.pct(.5) for c in mine) if not math.isnan(p)]
            row = Row(res.pct(.5), res.pct(.99), res.rps, res.errors, n,
                      client_cpu_us_per_request=(sum(c.client_cpu_s for c in mine) / n * 1e6
                                                 if n else math.nan),
                      engines_cpu_us_per_request=(sum(c.engines_cpu_s for c in mine) / n * 1e6
                                                  if n else math.nan),
                      kv_pulls=sum(c.counters.kv_pulls for c in mine),
                      rps_round_spread=(max(rps) / min(rps) if rps and min(rps) > 0
                                        else math.inf),
                      p50_round_spread_ms=max(p50s) - min(p50s) if p50s else math.nan)
            if t in routers:
                cpu_s = sum(c.router_cpu_s[t] for c in mine)
                wall = sum(c.wall_s for c in mine)
                row.cpu_us_per_request = cpu_s / n * 1e6 if n else math.nan
                row.net_cpu_us_per_request = ((cpu_s - idle[t] * wall) / n * 1e6 if n
                                              else math.nan)
            rows[conc][t] = row
        d = rows[conc]["direct"]
        for r in routers:
            x = rows[conc][r]
            x.added_p50_ms, x.added_p99_ms = x.p50_ms - d.p50_ms, x.p99_ms - d.p99_ms
            x.rps_vs_direct = ratio(x.rps, d.rps)
        if len(routers) == 2:
            ratios[conc] = ratio(rows[conc]["pdctl"].rps, rows[conc]["vllm-router"].rps)
    return CaseResult(case, engines, rounds, opts.duration, opts.warmup, concurrency, targets,
                      flow, rows, ratios, {r: v * 100 for r, v in idle.items()},
                      goals(case, rows, routers), argv, load, logs, cells)


def goals(case: str, rows: dict[int, dict[str, Row]], routers: list[str]) -> list[Goal]:
    tag = " (router-bound)" if case == "router-bound" else ""
    out: list[Goal] = []
    text = f"pdctl rps >= vllm-router rps at c=64{tag}"
    if "vllm-router" in routers and 64 in rows:
        p, v = rows[64]["pdctl"], rows[64]["vllm-router"]
        spread = max(p.rps_round_spread, v.rps_round_spread)
        out.append(Goal(text, p.rps >= v.rps,
                        f"pdctl {p.rps:.1f} rps, vllm-router {v.rps:.1f} rps, ratio "
                        f"{ratio(p.rps, v.rps):.2f}; router CPU per request "
                        f"{fmt(p.cpu_us_per_request, '.0f')} vs "
                        f"{fmt(v.cpu_us_per_request, '.0f')} us",
                        f"the rounds' rps differ up to {spread:.2f}x" if spread > 1.5
                        else None))
    else:
        out.append(Goal(text, None, ""))
    text = f"pdctl added p50 TTFT <= 1 ms at c=1{tag}"
    if 1 in rows:
        p, d = rows[1]["pdctl"], rows[1]["direct"]
        spread_ms = max(p.p50_round_spread_ms, d.p50_round_spread_ms)
        extra = ""
        if "vllm-router" in routers:
            extra = f"; vllm-router {rows[1]['vllm-router'].added_p50_ms:+.2f} ms"
        out.append(Goal(text, p.added_p50_ms <= 1.0,
                        f"added {p.added_p50_ms:+.2f} ms: pdctl {p.p50_ms:.2f} ms, direct "
                        f"{d.p50_ms:.2f} ms{extra}",
                        f"the rounds' p50 differ by up to {spread_ms:.2f} ms"
                        if spread_ms > 1.0 else None))
    else:
        out.append(Goal(text, None, ""))
    return out


# ---- report ------------------------------------------------------------------------------

def case_report(c: CaseResult, opts: Options) -> str:
    routers = [t for t in c.targets if t != "direct"]
    lines = [f"{c.case}: {c.rounds} interleaved round(s) x {c.duration:g} s per cell "
             f"(+{c.warmup:g} s warm-up), {c.engines}, {len(PROMPT)}-char prompt, "
             f"{opts.max_tokens} tokens, streaming, closed loop; {os.cpu_count()} CPUs, load "
             f"average {fmt(c.load_before_after[0], '.1f')} before, "
             f"{fmt(c.load_before_after[1], '.1f')} after",
             "", "TTFT (ms) and requests/s; +p50/+p99: added TTFT against direct"]
    hdr = f"{'conc':>5} | {'direct p50':>10} {'p99':>7} {'rps':>7}"
    for r in routers:
        hdr += f" | {r + ' p50':>15} {'p99':>7} {'rps':>7} {'+p50':>7} {'+p99':>7}"
    lines.append(hdr)
    for conc in c.concurrency:
        d = c.rows[conc]["direct"]
        line = f"{conc:>5} | {fmt(d.p50_ms, '10.2f')} {fmt(d.p99_ms)} {fmt(d.rps, '7.1f')}"
        for r in routers:
            x = c.rows[conc][r]
            line += (f" | {fmt(x.p50_ms, '15.2f')} {fmt(x.p99_ms)} {fmt(x.rps, '7.1f')} "
                     f"{fmt(x.added_p50_ms, '+7.2f')} {fmt(x.added_p99_ms, '+7.2f')}")
        lines.append(line)
    lines += ["", "request-rate ratios; router CPU per request (process + children, over all "
              "requests of the cell incl. warm-up; net: less the router's idle CPU); client "
              "and engines CPU per request; errors",
              f"(client and engines CPU: {'/'.join(c.targets)})"]
    hdr = f"{'conc':>5} |"
    for r in routers:
        hdr += f" {r + '/direct':>18}"
    if len(routers) == 2:
        hdr += f" {'pdctl/vllm-router':>18}"
    for r in routers:
        hdr += f" | {r + ' CPU us/req (net)':>28}"
    hdr += f" | {'client CPU us/req':>17} | {'engines CPU us/req':>18} | {'errors':>6}"
    lines.append(hdr)
    for conc in c.concurrency:
        row = c.rows[conc]
        line = f"{conc:>5} |"
        for r in routers:
            line += f" {fmt(row[r].rps_vs_direct, '18.2f')}"
        if len(routers) == 2:
            line += f" {fmt(c.ratio_pdctl_vllm_router[conc], '18.2f')}"
        for r in routers:
            cell = (f"{fmt(row[r].cpu_us_per_request, '.0f')} "
                    f"({fmt(row[r].net_cpu_us_per_request, '.0f')})")
            line += f" | {cell:>28}"
        client = "/".join(fmt(row[t].client_cpu_us_per_request, ".0f") for t in c.targets)
        engines = "/".join(fmt(row[t].engines_cpu_us_per_request, ".0f") for t in c.targets)
        line += (f" | {client:>17} | {engines:>18} | "
                 f"{sum(row[t].errors for t in c.targets):>6}")
        lines.append(line)
    lines.append("idle CPU while other targets ran: " + ", ".join(
        f"{r} {fmt(v, '.2f')}% of a core" for r, v in c.idle_cpu_percent.items()))
    bad = [t for t, f in c.flow.items() if not f.verified]
    lines.append("flow check (one prefill of one token and one KV pull per request): "
                 + (f"FAILED for {', '.join(bad)}" if bad else "verified for every target"))
    lines += ["", "goals", *(g.line() for g in c.goals)]
    return "\n".join(lines)


def report(res: RouterResult) -> str:
    out = [f"router cost, pdctl from {res.pdctl_source}"]
    for c in res.cases:
        out += ["", case_report(c, res.options)]
    if res.cases:
        argv = res.cases[-1].argv
        out.append("")
        if "pdctl" in argv:
            out.append("pdctl:       " + shlex.join(argv["pdctl"][1:]) + "  # routing: "
                       + orjson.dumps(ROUTING).decode())
        if "vllm-router" in argv:
            out.append("vllm-router: " + shlex.join(argv["vllm-router"]))
        out.append(f"logs: {', '.join(c.logs for c in res.cases)}")
    return "\n".join(out)


# ---- entry points ----------------------------------------------------------------------

def router_binary(opts: Options) -> str | None:
    """The vllm-router executable, or None when ``opts`` skips it; ``FleetError`` if it is
    asked for and missing."""
    if opts.vllm_router is None:
        return None
    found = shutil.which(str(opts.vllm_router)) or str(opts.vllm_router)
    if not (os.path.isfile(found) and os.access(found, os.X_OK)):
        raise FleetError(f"vllm-router not found at {opts.vllm_router}. Install vllm-router "
                         f"0.1.17 in its own venv:\n    {INSTALL_HINT}\nor pass "
                         "--vllm-router PATH (or --no-vllm-router to skip it).")
    return found


def run_router(opts: Options) -> RouterResult:
    """Every case of ``opts``; processes are stopped on return, error and Ctrl-C."""
    router_bin = router_binary(opts)
    targets = [t for t in TARGETS if router_bin is not None or t != "vllm-router"]
    if opts.pdctl_root is not None:
        found = controller_package(opts.pdctl_root)
        if found != (opts.pdctl_root / "controller").resolve():
            raise FleetError(f"--pdctl-root {opts.pdctl_root}: the controller would be "
                             f"imported from {found}")
    workdir = Path(tempfile.mkdtemp(prefix="pdctl-bench-router-"))
    source = source_of(opts.pdctl_root)
    print(f"router cost: pdctl from {source}; work directory {workdir}", flush=True)
    cases = [measure_case(case, opts, targets, router_bin or "", workdir)
             for case in opts.cases]
    return RouterResult(opts, source, MODEL, len(PROMPT), os.cpu_count(), cases)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--case", choices=CASES, nargs="+", default=list(CASES),
                    help="which cases (default: both)")
    ap.add_argument("--duration", type=float, help="measured seconds per cell (default 5)")
    ap.add_argument("--warmup", type=float,
                    help="seconds per cell before the measured window (default 1)")
    ap.add_argument("--rounds", type=int,
                    help="interleaved repetitions (default: engine-bound 2, router-bound 3)")
    ap.add_argument("--concurrency", type=int, nargs="+",
                    help="closed-loop workers per cell (default: engine-bound 1 16 64 256, "
                         "router-bound 1 64)")
    ap.add_argument("--max-tokens", type=int, default=4, help="tokens per request")
    ap.add_argument("--time-scale", type=float, default=0.1,
                    help="the engine-bound case's sim engines' time scale")
    ap.add_argument("--vllm-router", type=Path, default=DEFAULT_ROUTER,
                    help="the vllm-router executable (default: .bench/venv-router/bin/...)")
    ap.add_argument("--no-vllm-router", action="store_true",
                    help="measure direct and pdctl only")
    ap.add_argument("--pdctl-root", type=Path,
                    help="run the pdctl controller from this source tree (PYTHONPATH), e.g. "
                         "a `git worktree` of an older commit")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 1 round of 1.5 s; engine-bound at concurrency 1 and 16")


def options_from(args: argparse.Namespace) -> Options:
    o = Options.defaults(args.quick)
    o.cases = tuple(args.case)
    o.duration = args.duration if args.duration is not None else o.duration
    o.warmup = args.warmup if args.warmup is not None else o.warmup
    o.rounds, o.concurrency = args.rounds, args.concurrency
    o.max_tokens, o.time_scale = args.max_tokens, args.time_scale
    o.vllm_router = None if args.no_vllm_router else args.vllm_router
    o.pdctl_root = args.pdctl_root.resolve() if args.pdctl_root else None
    return o


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.router",
                                 description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    add_arguments(ap)
    ap.add_argument("--json", type=Path, default=ROOT / "bench-results" / "router.json",
                    help="raw results (default: bench-results/router.json)")
    args = ap.parse_args(argv)
    try:
        with interrupt_on_signals():
            res = run_router(options_from(args))
    except FleetError as exc:
        print(f"bench.router: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted; every process started here has been stopped", file=sys.stderr)
        return 130
    print("\n" + report(res))
    write_json(args.json, res)
    print(f"\nraw results: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
