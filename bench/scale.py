"""Scale on simulated engines: one ``pdctl controller`` with 16 prefill + 48 decode instances
at 1,000 requests/s open-loop.

The controller is a real process started with a YAML config (backend ``sim``: Llama-3-70B on
H100 SXM, prefill TP4, decode TP2, 8 accelerators per node and just enough nodes for the
fleet), and it starts every engine itself: on two sim host processes (``sim.processes`` 2,
each engine on its own port; ``--sim-processes 0``: a ``controller.engines.sim`` process per
engine, as before). The
load generator (``bench.loadgen.OpenLoop``) in this process sends open-loop arrivals (Poisson
by default) at the offered rate, warms up, then measures a window:

- achieved rate (200 OK completions per second) against offered, and what the client really
  sent (its own scheduling lag shows when it is starved of CPU);
- errors: any non-200, any stream error event or missing ``[DONE]``, a wrong token count,
  connection errors, and requests the client gave up on (its timeout, or arrivals dropped
  because ``--max-inflight`` requests were already open);
- client TTFT p50/p99 (streamed requests: time to the first token event) and end-to-end
  latency (non-streamed requests);
- CPU from psutil over the window: the controller (cores = CPU s / wall s, and CPU ms per
  completed request), the engines together, this client, and the rest of the machine;
- routing-decision latency p50/p99 from the controller's histogram
  ``pdctl_routing_decision_seconds`` (bucket deltas between scrapes at the window's start and
  end);
- fleet start time: controller spawned until all instances are ready.

Workload: prompts of 1,024-1,536 estimated tokens (text, unique per request, so every request
takes the disaggregated path at the default threshold of 512), ``max_tokens`` 16, a quarter of
the requests streamed. At ``time_scale`` 1.0 the 16 modelled prefill instances can prefill
only ~170 such prompts per second (compute-bound roofline), so the fleet runs at
``sim.time_scale`` 0.1 (modelled hardware 10x faster) to have room for 1,000 req/s; the
report prints the modelled capacity.

    .venv/bin/python -m bench.scale                 # 16P+48D, 1000 req/s, 25 s window
    .venv/bin/python -m bench.scale --quick         # 4P+12D, 200 req/s, 10 s window
    .venv/bin/python -m bench.scale --rate 300 --duration 20 --json /tmp/s.json

Everything started here is stopped on exit, also on Ctrl-C: the controller gets SIGTERM (it
stops its engines), then any engine process left is killed by process group and reported.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench import cpu, prom, stats
from bench.fleet import (
    ControllerProc,
    Fleet,
    FleetError,
    StopReport,
    interrupt_on_signals,
    start_controller,
)
from bench.loadgen import DROPPED, OpenLoop, body
from bench.report import ROOT, finish, fmt
from pdctl_api import profiles

TITLE = "Scale: 16 prefill + 48 decode simulated 70B/H100 instances"
ABOUT = ("`pdctl controller` starts 16 prefill (TP4) and 48 decode (TP2) simulated "
         "Llama-3-70B/H100 instances on 20 nodes x 8 (hosted by two sim host processes, "
         "`sim.processes`) and is driven open-loop at 1,000 requests/s (Poisson). Reported: "
         "achieved rate, errors, TTFT, where the CPU went, and the routing decision's latency "
         "from `pdctl_routing_decision_seconds`.")

MODEL = "llama-3-70b"
HARDWARE = "h100-sxm"
PREFILL_TP, DECODE_TP, PER_NODE = 4, 2, 8
ROUTING_HIST = "pdctl_routing_decision_seconds"
ENGINE_MATCH = "controller.engines.sim"
WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike "
         "november oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee "
         "zulu model token cache prefill decode router engine").split()


@dataclass
class Options:
    rate: float = 1000.0  # offered requests/s
    duration: float = 25.0  # measured seconds
    warmup: float = 8.0  # seconds of load before measuring
    prefill: int = 16
    decode: int = 48
    time_scale: float = 0.1
    poisson: bool = True  # else evenly spaced arrivals
    prompt_tokens: tuple[int, int] = (1024, 1536)  # estimated tokens (bytes / 4)
    max_tokens: int = 16
    stream_share: float = 0.25
    timeout: float = 15.0  # the client gives up on a request after this many seconds
    max_inflight: int = 1000  # arrivals beyond this many open requests are dropped
    start_timeout: float = 180.0  # controller start_timeout_s per instance
    idle: float = 5.0  # seconds of idle CPU measurement with the fleet ready
    engine_nice: int = 0
    sim_processes: int = 2  # sim.processes: host processes for all engines; 0: one each
    seed: int = 1
    keep: bool = False  # keep the work directory (logs)

    @staticmethod
    def defaults(quick: bool) -> Options:
        if quick:
            return Options(rate=200.0, duration=10.0, warmup=4.0, prefill=4, decode=12)
        return Options()


def _processes(n: int) -> str:
    return f"engines on {n} sim host process(es)" if n else "a process per engine"


def nodes_for(prefill: int, decode: int) -> int:
    # Both TPs divide the node size, so any packing is exact.
    return max(1, math.ceil((prefill * PREFILL_TP + decode * DECODE_TP) / PER_NODE))


def controller_config(o: Options) -> dict[str, Any]:
    return {
        "backend": "sim",
        "model": {"name": MODEL},
        "hardware": {"accelerator": HARDWARE, "accelerators_per_node": PER_NODE,
                     "nodes": nodes_for(o.prefill, o.decode), "kv_link": "ib-ndr"},
        "pools": {"prefill": {"size": o.prefill, "tp": PREFILL_TP},
                  "decode": {"size": o.decode, "tp": DECODE_TP}},
        "routing": {"disagg_min_prompt_tokens": 512},
        "sim": {"time_scale": o.time_scale, "processes": o.sim_processes},
        # Everything else at its default (health every 2 s, engine /metrics every 1 s), except
        # a start limit that 64 engines starting at once on 2 shared cores can meet.
        "controller": {"start_timeout_s": float(o.start_timeout)},
    }


def modelled_capacity(o: Options) -> float:
    """Prefills per wall second the modelled prefill pool can do for the mean prompt."""
    m, hw = profiles.model(MODEL), profiles.hardware(HARDWARE)
    mean = sum(o.prompt_tokens) // 2
    return o.prefill / (profiles.step_seconds(m, hw, PREFILL_TP, mean, 0, []) * o.time_scale)


# ---- results ----------------------------------------------------------------------------

@dataclass
class FleetStart:
    fleet_start_s: float  # controller spawned -> every instance ready
    controller_up_s: float
    instance_start_s_p50: float
    instance_start_s_max: float
    engine_processes: int


@dataclass
class IdleCpu:
    seconds: float
    controller_cores: float
    engines_cores: float


@dataclass
class CpuUse:
    wall_s: float
    controller_cores: float
    controller_cpu_ms_per_req: float
    controller_cpu_ms_per_handled: float  # per request the controller recorded
    controller_cpu_ms_per_req_above_idle: float
    engines_cores: float
    engines_cpu_ms_per_req: float
    engines_cpu_ms_per_req_above_idle: float
    engines_exited_in_window: int  # their CPU is lost (counted in "other")
    client_cores: float
    client_cpu_ms_per_req: float
    machine_busy_cores: float
    other_cores: float
    machine_cores: int | None
    top_other_processes: list[str]


@dataclass
class ControllerView:
    """What the controller's /metrics say about the window (deltas between two scrapes)."""

    start_s: float  # when the first scrape was answered, from the window's start
    end_s: float
    scrape_latency_s: list[float]
    ttft_ms_p50: float
    ttft_ms_p99: float
    ttft_parts_mean_ms: dict[str, float]
    requests_by_path: dict[str, int]
    routing_decision: str  # "p50 / p99 ms (n)" or why it is unavailable
    routing_ms_p50: float = math.nan
    routing_ms_p99: float = math.nan
    routing_count: float = 0.0


@dataclass
class Summary:
    window_s: float
    offered_rps: float
    arrivals_in_window: int
    sent_rps: float
    achieved_rps: float
    ok_of_window_arrivals: int
    errors: dict[str, int]
    error_samples: dict[str, list[str]]
    error_total: int
    error_share: float
    client_ttft_ms_p50: float
    client_ttft_ms_p99: float
    streamed_ok: int
    client_e2e_ms_p50: float
    client_e2e_ms_p99: float
    send_lag_ms_p50: float
    send_lag_ms_p99: float
    peak_inflight: int
    unfinished_at_end: int
    controller_peak_fds: int
    ready_min_during_run: dict[str, int]
    cpu: CpuUse | None
    controller: ControllerView | None


@dataclass
class Cleanup:
    stop_s: float
    controller_exit: int | None
    engines_left_after_sigterm: int
    processes_tracked: int
    engine_processes_left: int


@dataclass
class ScaleResult:
    options: Options
    nodes: int
    modelled_prefill_capacity_rps: float
    cpu_count: int | None
    loadavg_before: tuple[float, float, float]
    loadavg_after: tuple[float, float, float] | None = None
    fleet: FleetStart | None = None
    idle: IdleCpu | None = None
    summary: Summary | None = None
    instance_failures: list[str] = field(default_factory=list)
    cleanup: Cleanup | None = None
    total_s: float = 0.0
    logs: str = ""


# ---- CPU snapshots ------------------------------------------------------------------------

@dataclass
class CpuSnap:
    t: float
    ctl: float
    engines: dict[int, float]
    client: float
    machine_busy: float
    ctl_fds: int
    others: dict[int, tuple[str, float]]


def cpu_snap(ctl: ControllerProc, fleet: Fleet) -> CpuSnap:
    ctl_ps = psutil.Process(ctl.proc.pid)
    engine_pids = fleet.descendants(ENGINE_MATCH)
    engines = {}
    for pid in engine_pids:
        with contextlib.suppress(psutil.Error):
            engines[pid] = cpu.process_seconds(psutil.Process(pid))
    fds = 0
    with contextlib.suppress(psutil.Error):
        fds = ctl_ps.num_fds()
    ours = {ctl.proc.pid, os.getpid(), *engine_pids}
    others = {}
    for p in psutil.process_iter(["pid", "cmdline", "name"]):
        if p.pid in ours:
            continue
        with contextlib.suppress(psutil.Error):
            cmd = " ".join(p.info["cmdline"] or [p.info["name"] or "?"])
            others[p.pid] = (cmd[:90], cpu.process_seconds(p))
    return CpuSnap(time.monotonic(), cpu.process_seconds(ctl_ps), engines, cpu.self_seconds(),
                   cpu.machine().busy, fds, others)


def top_others(a: CpuSnap, b: CpuSnap, wall: float, n: int = 4) -> list[str]:
    """The busiest processes that are not this benchmark's, over the window."""
    used = [(c - a.others.get(pid, ("", 0.0))[1], cmd) for pid, (cmd, c) in b.others.items()]
    used.sort(reverse=True)
    return [f"{u / wall:.2f} cores: {cmd}" for u, cmd in used[:n] if u / wall >= 0.01]


def idle_cpu(ctl: ControllerProc, fleet: Fleet, seconds: float) -> IdleCpu:
    """Controller and engine CPU with the whole fleet ready and no requests: the cost of
    health checks and engine /metrics polling."""
    a = cpu_snap(ctl, fleet)
    time.sleep(seconds)
    b = cpu_snap(ctl, fleet)
    wall = b.t - a.t
    return IdleCpu(round(wall, 1), round((b.ctl - a.ctl) / wall, 3),
                   round(sum(b.engines[p] - a.engines.get(p, 0.0) for p in b.engines) / wall, 3))


# ---- fleet start ------------------------------------------------------------------------

def wait_fleet(o: Options, ctl: ControllerProc, fleet: Fleet, t_spawn: float) -> FleetStart:
    want = {"prefill": o.prefill, "decode": o.decode}
    deadline = t_spawn + o.start_timeout + 30
    up_at: float | None = None
    last_print = 0.0
    while True:
        fleet.check_alive()
        ready: dict[str, int] = {}
        with contextlib.suppress(httpx.HTTPError, ValueError):
            ready = ctl.ready()
            up_at = up_at or time.monotonic()
        fleet.note_descendants()
        now = time.monotonic()
        if all(ready.get(k, 0) >= v for k, v in want.items()):
            break
        if now > deadline:
            raise FleetError(f"fleet not ready after {now - t_spawn:.0f} s: {ready}; "
                             f"log: {ctl.log_path}")
        if now - last_print > 10:
            print(f"  ... {now - t_spawn:5.1f} s: ready {ready or '-'}, engine processes "
                  f"{len(fleet.descendants(ENGINE_MATCH))}", flush=True)
            last_print = now
        time.sleep(0.25)
    t_ready = time.monotonic()
    starts: list[float] = []
    with contextlib.suppress(httpx.HTTPError, ValueError, KeyError, TypeError):
        starts = [i["ready_at"] - i["created_at"] for i in ctl.get("/instances")
                  if i.get("ready_at")]
    return FleetStart(round(t_ready - t_spawn, 1), round((up_at or t_ready) - t_spawn, 1),
                      stats.median(starts), max(starts or [math.nan]),
                      len(fleet.descendants(ENGINE_MATCH)))


def instance_failures(ctl: ControllerProc) -> list[str]:
    """Instances the controller failed during this session (audit log), with the reason."""
    try:
        out = []
        for e in ctl.get("/events", kind="instance.failed", limit=1000):
            line = f"{e['target']}: {e['detail']}"
            if "exited" in str(e["detail"]):
                log = ctl.state_dir / "logs" / f"{e['target']}.log"
                with contextlib.suppress(OSError):
                    tail = [ln for ln in log.read_text(errors="replace").splitlines() if ln]
                    line += f" [log: {tail[-1][:160] if tail else ''}]"
            out.append(line)
        return out
    except (OSError, httpx.HTTPError, ValueError, KeyError, TypeError):
        return ["(events unavailable)"]


# ---- load --------------------------------------------------------------------------------

@dataclass
class Observed:
    """What the monitor saw while the load ran."""

    snaps: list[CpuSnap] = field(default_factory=list)  # at the window's start and end
    scrapes: list[prom.Page | None] = field(default_factory=list)
    peak_inflight: int = 0
    peak_fds: int = 0
    ready_min: dict[str, int] = field(default_factory=dict)


def corpus(rng: random.Random, nbytes: int) -> str:
    out: list[str] = []
    n = 0
    while n < nbytes:
        w = rng.choice(WORDS)
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


async def drive(o: Options, ctl: ControllerProc, fleet: Fleet) -> tuple[OpenLoop, Observed]:
    rng = random.Random(o.seed)
    text = corpus(rng, 64 * 1024)
    url = f"{ctl.url}/v1/completions"

    def make(i: int, stream: bool) -> tuple[str, bytes, int]:
        nbytes = 4 * rng.randint(*o.prompt_tokens)
        off = rng.randrange(0, len(text) - nbytes)
        return url, body({"model": MODEL, "prompt": f"request {i}: " + text[off:off + nbytes],
                          "max_tokens": o.max_tokens, "stream": stream,
                          "temperature": 0}), o.max_tokens

    load = OpenLoop(make, o.rate, o.duration, o.warmup, o.poisson, o.stream_share,
                    o.max_inflight, o.timeout, o.seed)
    seen = Observed()
    async with httpx.AsyncClient(timeout=10) as http:
        async def at(edge: int) -> None:
            await asyncio.sleep(0)  # load.run has set its window by now
            await asyncio.sleep(max(0.0, load.window[edge] - time.monotonic()))
            seen.snaps.append(cpu_snap(ctl, fleet))
            seen.scrapes.append(await scrape(http, ctl.url))

        async def monitor() -> None:
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

        marks = [asyncio.create_task(at(0)), asyncio.create_task(at(1))]
        mon = asyncio.create_task(monitor())
        try:
            await load.run()
            await asyncio.gather(*marks)
        finally:
            mon.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await mon
    return load, seen


# ---- summary -----------------------------------------------------------------------------

def _ms(v: float) -> float:
    return round(v * 1e3, 2) if not math.isnan(v) else math.nan


def controller_view(before: prom.Page | None, after: prom.Page, w0: float) -> ControllerView:
    ttft = after.buckets("pdctl_ttft_seconds", before)
    parts: dict[str, float] = {}
    counts = after.by_label("pdctl_ttft_component_seconds_count", "component")
    for k, n in counts.items():
        n -= before.sum("pdctl_ttft_component_seconds_count", component=k) if before else 0.0
        if n > 0:
            parts[k] = round(after.delta(before, "pdctl_ttft_component_seconds_sum",
                                         component=k) / n * 1e3, 2)
    b_req = before.by_label("pdctl_requests_total", "path", "status") if before else {}
    by_path = {k: int(v - b_req.get(k, 0.0)) for k, v in
               after.by_label("pdctl_requests_total", "path", "status").items()
               if v - b_req.get(k, 0.0) > 0}
    view = ControllerView(
        round(before.answered_at - w0, 2) if before else math.nan,
        round(after.answered_at - w0, 2),
        [round(x.answered_at - x.sent_at, 2) for x in (before, after) if x is not None],
        _ms(prom.histogram_quantile(ttft, 0.5)), _ms(prom.histogram_quantile(ttft, 0.99)),
        parts, by_path, "")
    if not after.has(ROUTING_HIST + "_bucket"):
        view.routing_decision = f"unavailable (controller does not export {ROUTING_HIST})"
    else:
        d = after.buckets(ROUTING_HIST, before)
        view.routing_ms_p50 = _ms(prom.histogram_quantile(d, 0.5))
        view.routing_ms_p99 = _ms(prom.histogram_quantile(d, 0.99))
        view.routing_count = prom.histogram_count(d)
        view.routing_decision = (f"{fmt(view.routing_ms_p50, '')} / "
                                 f"{fmt(view.routing_ms_p99, '')} ms "
                                 f"(n={int(view.routing_count)})")
    return view


def summarize(o: Options, load: OpenLoop, seen: Observed, idle: IdleCpu) -> Summary:
    w0, w1 = load.window
    dur = w1 - w0
    win = [a for a in load.arrivals if w0 <= a.due < w1]
    ok_done_in_window = sum(1 for a in load.arrivals if a.error is None and w0 <= a.done < w1)
    errors: dict[str, int] = {}
    for a in win:
        if a.error:
            errors[a.error] = errors.get(a.error, 0) + 1
    ok = [a for a in win if a.error is None and a.done]
    ttft = [a.ttft for a in ok if a.stream and a.ttft is not None]
    e2e = [a.done - a.sent for a in ok if not a.stream]
    lag = [a.sent - a.due for a in win if a.sent]
    ttft_q, e2e_q, lag_q = (stats.quantiles(v, (0.5, 0.99)) for v in (ttft, e2e, lag))
    summary = Summary(
        window_s=round(dur, 2), offered_rps=o.rate, arrivals_in_window=len(win),
        sent_rps=round(sum(1 for a in win if a.error != DROPPED) / dur, 1),
        achieved_rps=round(ok_done_in_window / dur, 1), ok_of_window_arrivals=len(ok),
        errors=errors, error_samples=load.error_samples, error_total=sum(errors.values()),
        error_share=round(sum(errors.values()) / len(win), 4) if win else math.nan,
        client_ttft_ms_p50=_ms(ttft_q[0]), client_ttft_ms_p99=_ms(ttft_q[1]),
        streamed_ok=len(ttft), client_e2e_ms_p50=_ms(e2e_q[0]),
        client_e2e_ms_p99=_ms(e2e_q[1]), send_lag_ms_p50=_ms(lag_q[0]),
        send_lag_ms_p99=_ms(lag_q[1]), peak_inflight=seen.peak_inflight,
        unfinished_at_end=load.unfinished, controller_peak_fds=seen.peak_fds,
        ready_min_during_run=seen.ready_min, cpu=None, controller=None)
    before, after = (seen.scrapes + [None, None])[:2]
    if len(seen.snaps) == 2:
        s0, s1 = seen.snaps
        wall = s1.t - s0.t
        ctl = s1.ctl - s0.ctl
        eng = sum(s1.engines[p] - s0.engines.get(p, 0.0) for p in s1.engines)
        cli = s1.client - s0.client
        busy = s1.machine_busy - s0.machine_busy
        done = max(1, ok_done_in_window)
        handled_rate = 0.0  # requests the controller recorded per second between scrapes
        if before is not None and after is not None and after.answered_at > before.answered_at:
            handled = (after.sum("pdctl_requests_total") - before.sum("pdctl_requests_total"))
            handled_rate = handled / (after.answered_at - before.answered_at)
        summary.cpu = CpuUse(
            wall_s=round(wall, 2), controller_cores=round(ctl / wall, 2),
            controller_cpu_ms_per_req=round(ctl * 1e3 / done, 2),
            controller_cpu_ms_per_handled=(round(ctl / wall * 1e3 / handled_rate, 2)
                                           if handled_rate else math.nan),
            controller_cpu_ms_per_req_above_idle=round(
                (ctl / wall - idle.controller_cores) * wall * 1e3 / done, 2),
            engines_cores=round(eng / wall, 2),
            engines_cpu_ms_per_req=round(eng * 1e3 / done, 2),
            engines_cpu_ms_per_req_above_idle=round(
                (eng / wall - idle.engines_cores) * wall * 1e3 / done, 2),
            engines_exited_in_window=len(set(s0.engines) - set(s1.engines)),
            client_cores=round(cli / wall, 2), client_cpu_ms_per_req=round(cli * 1e3 / done, 2),
            machine_busy_cores=round(busy / wall, 2),
            other_cores=round(max(0.0, busy - ctl - eng - cli) / wall, 2),
            machine_cores=psutil.cpu_count(), top_other_processes=top_others(s0, s1, wall))
    if after is not None:
        summary.controller = controller_view(before, after, w0)
    return summary


# ---- report ------------------------------------------------------------------------------

def _failures(lines: list[str]) -> str:
    if not lines:
        return "none"
    kinds: dict[str, int] = {}
    for ln in lines:
        why = ln.split(": ", 1)[-1].split(" [log")[0]
        kinds[why] = kinds.get(why, 0) + 1
    logs = [ln.split(" [log: ", 1)[1].rstrip("]") for ln in lines if " [log: " in ln]
    return (f"{len(lines)}: " + "; ".join(f"{n} x {k!r}" for k, n in kinds.items())
            + (f"; last log line of an exited engine: {logs[0]!r}" if logs else ""))


def report(res: ScaleResult) -> str:
    o, f, s, i = res.options, res.fleet, res.summary, res.idle
    rows: list[tuple[str, str]] = [
        ("fleet", f"{o.prefill} prefill x TP{PREFILL_TP} + {o.decode} decode x TP{DECODE_TP}"
                  f" on {res.nodes} nodes x {PER_NODE} ({MODEL}, {HARDWARE}, time_scale "
                  f"{o.time_scale}, engine nice {o.engine_nice}, "
                  f"{_processes(o.sim_processes)}; modelled prefill capacity "
                  f"~{res.modelled_prefill_capacity_rps:.0f} req/s)")]
    if f is not None:
        rows.append(("fleet start (all ready)",
                     f"{f.fleet_start_s} s (controller up {f.controller_up_s} s; instance "
                     f"start p50 {fmt(f.instance_start_s_p50, '.1f')} s, max "
                     f"{fmt(f.instance_start_s_max, '.1f')} s)"))
    rows.append(("workload", f"{'poisson' if o.poisson else 'constant'} arrivals, prompts "
                             f"{o.prompt_tokens[0]}-{o.prompt_tokens[1]} tok, max_tokens "
                             f"{o.max_tokens}, {int(o.stream_share * 100)}% streamed, timeout "
                             f"{o.timeout} s"))
    if s is not None and i is not None:
        c, cv = s.cpu, s.controller
        rows += [
            ("offered / sent / achieved", f"{s.offered_rps} / {s.sent_rps} / "
                                          f"{s.achieved_rps} req/s over {s.window_s} s"),
            ("errors", f"{s.error_total} of {s.arrivals_in_window} "
                       f"({fmt(s.error_share * 100, '.2f')}%) {s.errors or ''}"),
            *(("  sample", f"{k}: {v[0][:150]}") for k, v in s.error_samples.items()),
            ("client TTFT p50 / p99", f"{fmt(s.client_ttft_ms_p50, '')} / "
                                      f"{fmt(s.client_ttft_ms_p99, '')} ms  "
                                      f"(streamed, n={s.streamed_ok})"),
            ("client e2e p50 / p99", f"{fmt(s.client_e2e_ms_p50, '')} / "
                                     f"{fmt(s.client_e2e_ms_p99, '')} ms  (non-streamed)")]
        if cv is not None:
            rows += [
                ("controller TTFT p50 / p99", f"{fmt(cv.ttft_ms_p50, '')} / "
                                              f"{fmt(cv.ttft_ms_p99, '')} ms "
                                              "(pdctl_ttft_seconds, buckets)"),
                ("controller TTFT parts (mean)", " ".join(
                    f"{k} {v}" for k, v in cv.ttft_parts_mean_ms.items()) + " ms"),
                ("metrics delta interval",
                 f"window +{fmt(cv.start_s, '')} s .. +{cv.end_s} s of a {s.window_s} s "
                 f"window (controller /metrics answered in {cv.scrape_latency_s} s)"),
                ("routing decision p50 / p99", cv.routing_decision)]
        else:
            rows.append(("controller metrics", "n/a (scrape failed)"))
        if c is not None:
            rows += [
                ("controller CPU", f"{c.controller_cores} cores, "
                                   f"{c.controller_cpu_ms_per_req} ms per completed req "
                                   f"({fmt(c.controller_cpu_ms_per_handled, '')} ms per "
                                   f"request it recorded); idle with the fleet: "
                                   f"{i.controller_cores} cores, so "
                                   f"{c.controller_cpu_ms_per_req_above_idle} ms/req above "
                                   "idle"),
                ("engines CPU (all)", f"{c.engines_cores} cores, {c.engines_cpu_ms_per_req} "
                                      f"ms per completed req; idle: {i.engines_cores} cores, "
                                      f"so {c.engines_cpu_ms_per_req_above_idle} ms/req above "
                                      "idle"),
                ("client CPU", f"{c.client_cores} cores, {c.client_cpu_ms_per_req} ms/req; "
                               f"send lag p50/p99 {fmt(s.send_lag_ms_p50, '')} / "
                               f"{fmt(s.send_lag_ms_p99, '')} ms"),
                ("machine CPU", f"{c.machine_busy_cores} of {c.machine_cores} cores busy; "
                                f"other processes {c.other_cores} cores"),
                *(("  other", line) for line in c.top_other_processes)]
        rows += [
            ("paths (controller)", f"{cv.requests_by_path if cv else 'n/a'}"),
            ("peaks", f"in-flight {s.peak_inflight}, controller fds {s.controller_peak_fds}, "
                      f"min ready during run {s.ready_min_during_run}, engine processes "
                      f"exited in window {c.engines_exited_in_window if c else 'n/a'}")]
    rows.append(("instance failures", _failures(res.instance_failures)))
    if res.cleanup is not None:
        k = res.cleanup
        rows.append(("cleanup", f"stop_s {k.stop_s}, controller_exit {k.controller_exit}, "
                                f"engines_left_after_sigterm {k.engines_left_after_sigterm}, "
                                f"processes_tracked {k.processes_tracked}, "
                                f"engine_processes_left {k.engine_processes_left}"))
    width = max(len(k) for k, _ in rows)
    out = [f"{k:<{width}}  {v}" for k, v in rows]
    out.append(f"total run time {res.total_s} s")
    return "\n".join(out)


# ---- entry points ----------------------------------------------------------------------

def run_scale(o: Options) -> ScaleResult:
    """Start the fleet, measure, stop everything (also on error and Ctrl-C)."""
    import uvloop

    tmp = Path(tempfile.mkdtemp(prefix="pdctl-bench-scale-"))
    nodes = nodes_for(o.prefill, o.decode)
    res = ScaleResult(o, nodes, modelled_capacity(o), psutil.cpu_count(), os.getloadavg(),
                      logs=str(tmp))
    print(f"bench.scale: {o.prefill}P x TP{PREFILL_TP} + {o.decode}D x TP{DECODE_TP} on "
          f"{nodes} x {PER_NODE} {HARDWARE}, time_scale {o.time_scale}; modelled prefill "
          f"capacity ~{res.modelled_prefill_capacity_rps:.0f} req/s for the mean prompt; "
          f"offered {o.rate:g} req/s; logs in {tmp}", flush=True)
    t_all = time.monotonic()
    fleet = Fleet(tmp)
    ok = False
    try:
        t_spawn = time.monotonic()
        ctl = start_controller(tmp, controller_config(o), fleet=fleet, log_level="warning",
                               wait="none")
        res.fleet = wait_fleet(o, ctl, fleet, t_spawn)
        print(f"fleet ready: {res.fleet.fleet_start_s} s for {o.prefill + o.decode} "
              f"instances; load: {o.warmup:g} s warm-up + {o.duration:g} s measured",
              flush=True)
        if o.engine_nice:
            for pid in fleet.descendants(ENGINE_MATCH):
                with contextlib.suppress(psutil.Error):
                    psutil.Process(pid).nice(o.engine_nice)
        res.idle = idle_cpu(ctl, fleet, o.idle)
        load, seen = uvloop.run(drive(o, ctl, fleet))
        res.summary = summarize(o, load, seen, res.idle)
        res.loadavg_after = os.getloadavg()
        res.instance_failures = instance_failures(ctl)
        ok = True
    finally:
        engines = len(fleet.descendants(ENGINE_MATCH))
        stopped: StopReport = fleet.stop(grace_s=45)
        res.cleanup = Cleanup(stopped.seconds, stopped.exit_codes.get("controller"),
                              stopped.left_after_sigterm, engines + 1, len(stopped.left))
        print(f"fleet stopped in {stopped.seconds} s; processes left: {len(stopped.left)}",
              flush=True)
        res.total_s = round(time.monotonic() - t_all, 1)
        if ok and not o.keep and not res.instance_failures and not stopped.left:
            shutil.rmtree(tmp, ignore_errors=True)
            res.logs = ""
    return res


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--rate", type=float, help="offered requests/s (default 1000; quick 200)")
    ap.add_argument("--duration", type=float, help="measured seconds (default 25; quick 10)")
    ap.add_argument("--warmup", type=float, help="seconds of load before measuring (default 8;"
                    " quick 4)")
    ap.add_argument("--prefill", type=int, help="prefill instances (default 16; quick 4)")
    ap.add_argument("--decode", type=int, help="decode instances (default 48; quick 12)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 4P+12D at 200 req/s")
    ap.add_argument("--time-scale", type=float, default=0.1,
                    help="sim.time_scale: wall s per modelled s (default 0.1, see above)")
    ap.add_argument("--arrivals", choices=["poisson", "constant"], default="poisson")
    ap.add_argument("--prompt-tokens", type=int, nargs=2, default=[1024, 1536],
                    metavar=("MIN", "MAX"), help="estimated prompt tokens (bytes / 4)")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--stream-share", type=float, default=0.25, help="share streamed")
    ap.add_argument("--timeout", type=float, default=15.0,
                    help="client gives up on a request after this many seconds")
    ap.add_argument("--max-inflight", type=int, default=1000,
                    help="arrivals beyond this many open requests are dropped (counted)")
    ap.add_argument("--start-timeout", type=float, default=180.0,
                    help="controller start_timeout_s per instance")
    ap.add_argument("--idle", type=float, default=5.0,
                    help="seconds of idle CPU measurement with the fleet ready, before load")
    ap.add_argument("--engine-nice", type=int, default=0,
                    help="renice the engine processes (e.g. 10) so that the controller and the "
                         "client win the CPU, as if the engines ran on other hosts")
    ap.add_argument("--sim-processes", type=int, default=2,
                    help="sim.processes: processes hosting all the engines (default "
                         "%(default)s); 0: a process per engine")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs)")


def options_from(args: argparse.Namespace) -> Options:
    o = Options.defaults(args.quick)
    for name in ("rate", "duration", "warmup", "prefill", "decode"):
        if getattr(args, name) is not None:
            setattr(o, name, getattr(args, name))
    o.time_scale, o.poisson = args.time_scale, args.arrivals == "poisson"
    o.prompt_tokens = (args.prompt_tokens[0], args.prompt_tokens[1])
    o.max_tokens, o.stream_share, o.timeout = args.max_tokens, args.stream_share, args.timeout
    o.max_inflight, o.start_timeout, o.idle = args.max_inflight, args.start_timeout, args.idle
    o.engine_nice, o.seed, o.keep = args.engine_nice, args.seed, args.keep
    o.sim_processes = args.sim_processes
    return o


def check(res: ScaleResult) -> str | None:
    """Why the run is a failure (processes left behind), or None."""
    if res.cleanup is not None and res.cleanup.engine_processes_left:
        return "engine processes left behind"
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.scale",
                                 description=__doc__.split("\n\n")[0])
    add_arguments(ap)
    ap.add_argument("--json", type=Path, default=ROOT / "bench-results" / "scale.json")
    args = ap.parse_args(argv)
    try:
        with interrupt_on_signals():
            res = run_scale(options_from(args))
    except FleetError as exc:
        print(f"bench.scale: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted; every process started here has been stopped", file=sys.stderr)
        return 130
    return finish(report(res), res, args.json, check(res))


if __name__ == "__main__":
    sys.exit(main())
