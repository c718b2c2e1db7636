#!/usr/bin/env python3
"""Scale on simulated engines: one ``pdctl controller`` with 16 prefill + 48 decode instances
at 1,000 requests/s open-loop.

The controller is a real process started with a YAML config (backend ``sim``: Llama-3-70B on
H100 SXM, prefill TP4, decode TP2, 8 accelerators per node and just enough nodes for the
fleet), and it starts every engine itself as a real ``controller.engines.sim`` process. A lean
aiohttp + uvloop client in this process sends open-loop arrivals (Poisson by default) at the
offered rate, warms up, then measures a window:

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
  end); reported as unavailable while the controller does not export it;
- fleet start time: controller spawned until all instances are ready.

Workload: prompts of 1,024-1,536 estimated tokens (text, unique per request, so every request
takes the disaggregated path at the default threshold of 512), ``max_tokens`` 16, a quarter of
the requests streamed. At ``time_scale`` 1.0 the 16 modelled prefill instances can prefill
only ~170 such prompts per second (compute-bound roofline), so the fleet runs at
``sim.time_scale`` 0.1 (modelled hardware 10x faster) to have room for 1,000 req/s; the
script prints the modelled capacity.

    .venv/bin/python scripts/bench_scale.py                 # 16P+48D, 1000 req/s, 25 s window
    .venv/bin/python scripts/bench_scale.py --quick         # 4P+12D, 200 req/s, 10 s window
    .venv/bin/python scripts/bench_scale.py --rate 300 --duration 20 --json /tmp/s.json

Everything started here is stopped on exit, also on Ctrl-C: the controller gets SIGTERM (it
stops its engines), then any engine process left is killed by process group and reported.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import psutil
import yaml
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controller import profiles  # noqa: E402
from controller.launchers.process import free_port  # noqa: E402

MODEL = "llama-3-70b"
HARDWARE = "h100-sxm"
PREFILL_TP, DECODE_TP, PER_NODE = 4, 2, 8
ROUTING_HIST = "pdctl_routing_decision_seconds"
ERROR_SAMPLES: dict[str, list[str]] = {}  # first bodies of each non-200 status
WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike "
         "november oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee "
         "zulu model token cache prefill decode router engine").split()


# ---- processes -------------------------------------------------------------------------------

@dataclass
class Fleet:
    ctl: subprocess.Popen[bytes]
    url: str
    tmp: Path
    engines: dict[int, float] = field(default_factory=dict)  # pid -> create_time

    def note_engines(self) -> None:
        """Remember every engine process the controller has started (for cleanup)."""
        with contextlib.suppress(psutil.Error):
            for ch in psutil.Process(self.ctl.pid).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    if "controller.engines.sim" in " ".join(ch.cmdline()):
                        self.engines.setdefault(ch.pid, ch.create_time())

    def alive_engines(self) -> list[int]:
        alive = []
        for pid, created in self.engines.items():
            with contextlib.suppress(psutil.Error):
                p = psutil.Process(pid)
                if abs(p.create_time() - created) < 0.01 and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
        return alive


def nodes_for(prefill: int, decode: int) -> int:
    # Both TPs divide the node size, so any packing is exact.
    return max(1, math.ceil((prefill * PREFILL_TP + decode * DECODE_TP) / PER_NODE))


def controller_config(args: argparse.Namespace, port: int, state_dir: Path) -> dict[str, Any]:
    return {
        "backend": "sim",
        "model": {"name": MODEL},
        "hardware": {"accelerator": HARDWARE, "accelerators_per_node": PER_NODE,
                     "nodes": nodes_for(args.prefill, args.decode), "kv_link": "ib-ndr"},
        "pools": {"prefill": {"size": args.prefill, "tp": PREFILL_TP},
                  "decode": {"size": args.decode, "tp": DECODE_TP}},
        "routing": {"disagg_min_prompt_tokens": 512},
        "sim": {"time_scale": args.time_scale},
        # Everything else at its default (health every 2 s, engine /metrics every 1 s), except
        # a start limit that 64 engines starting at once on 2 shared cores can meet.
        "controller": {"port": port, "state_dir": str(state_dir),
                       "start_timeout_s": float(args.start_timeout)},
    }


def start_controller(args: argparse.Namespace, tmp: Path) -> Fleet:
    port = free_port()
    cfg_path = tmp / "pdctl.yaml"
    cfg_path.write_text(yaml.safe_dump(controller_config(args, port, tmp / "state")))
    with open(tmp / "controller.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "controller.cli", "controller", "--config", str(cfg_path),
             "--log-level", "warning"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    return Fleet(proc, f"http://127.0.0.1:{port}", tmp)


def instance_failures(fleet: Fleet) -> list[str]:
    """Instances the controller failed during this session (audit log), with the reason."""
    try:
        token = (fleet.tmp / "state" / "token").read_text().strip()
        r = httpx.get(f"{fleet.url}/api/v1/events", params={"kind": "instance.failed",
                                                           "limit": 1000},
                      headers={"Authorization": f"Bearer {token}"}, timeout=10)
        out = []
        for e in r.json():
            line = f"{e['target']}: {e['detail']}"
            if "exited" in str(e["detail"]):
                log = fleet.tmp / "state" / "logs" / f"{e['target']}.log"
                with contextlib.suppress(OSError):
                    tail = [ln for ln in log.read_text(errors="replace").splitlines() if ln]
                    line += f" [log: {tail[-1][:160] if tail else ''}]"
            out.append(line)
        return out
    except (OSError, httpx.HTTPError, ValueError, KeyError, TypeError):
        return ["(events unavailable)"]


def stop_fleet(fleet: Fleet) -> dict[str, Any]:
    """SIGTERM the controller (it stops its engines); kill whatever is left by process group;
    then check with ``ps`` that none of our engine processes remains."""
    out: dict[str, Any] = {}
    fleet.note_engines()
    if fleet.ctl.poll() is None:
        out["instance_failures"] = instance_failures(fleet)
    t0 = time.monotonic()
    if fleet.ctl.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            fleet.ctl.send_signal(signal.SIGTERM)
        try:
            fleet.ctl.wait(timeout=45)
        except subprocess.TimeoutExpired:
            out["controller_killed"] = True
    deadline = time.monotonic() + 10
    while fleet.alive_engines() and time.monotonic() < deadline:
        time.sleep(0.2)
    out["stop_s"] = round(time.monotonic() - t0, 1)
    out["controller_exit"] = fleet.ctl.poll()
    left = fleet.alive_engines()
    out["engines_left_after_sigterm"] = len(left)
    for pid in left:  # engines are session leaders: pgid == pid
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(fleet.ctl.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        fleet.ctl.wait(timeout=5)
    time.sleep(0.3)
    ps = subprocess.run(["ps", "-eo", "pid=,stat=,args="], capture_output=True, text=True).stdout
    ours = set(fleet.alive_engines())
    remaining = [ln.strip() for ln in ps.splitlines()
                 if "controller.engines.sim" in ln and int(ln.split()[0]) in ours]
    out["engines_tracked"] = len(fleet.engines)
    out["engine_processes_left"] = len(remaining)
    return out


# ---- metrics ---------------------------------------------------------------------------------

def parse_metrics(text: str) -> dict[str, Any]:
    """Histogram buckets (summed over labels other than ``le``) and request counters."""
    hists: dict[str, dict[float, float]] = {}
    counts: dict[str, float] = {}
    parts: dict[str, float] = {}  # TTFT component -> seconds summed, and "<name>#n" -> count
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.endswith("_bucket") and "le" in s.labels:
                le = float(s.labels["le"])
                h = hists.setdefault(s.name[: -len("_bucket")], {})
                h[le] = h.get(le, 0.0) + s.value
            elif s.name.startswith("pdctl_ttft_component_seconds_") and "component" in s.labels:
                key = s.labels["component"] + ("#n" if s.name.endswith("_count") else "")
                if s.name.endswith(("_sum", "_count")):
                    parts[key] = parts.get(key, 0.0) + s.value
            elif s.name == "pdctl_requests_total":
                key = f"{s.labels.get('path', '?')}/{s.labels.get('status', '?')}"
                counts[key] = counts.get(key, 0.0) + s.value
    return {"hists": hists, "requests": counts, "parts": parts}


def hist_quantile(buckets: dict[float, float], q: float) -> float | None:
    """Prometheus ``histogram_quantile`` over cumulative buckets ``{le: count}``; None when
    empty. A quantile in the +Inf bucket returns the largest finite bound."""
    les = sorted(buckets)
    if not les or buckets[les[-1]] <= 0:
        return None
    total = buckets[les[-1]]
    rank = q * total
    prev_le, prev_c = 0.0, 0.0
    for le in les:
        c = buckets[le]
        if c >= rank:
            if math.isinf(le):
                return prev_le
            if c == prev_c:
                return le
            return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
        prev_le, prev_c = le, c
    return prev_le


def hist_delta(before: dict[float, float] | None, after: dict[float, float]) -> dict[float, float]:
    before = before or {}
    return {le: after[le] - before.get(le, 0.0) for le in after}


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


@dataclass
class CpuSnap:
    t: float
    ctl: float
    engines: dict[int, float]
    client: float
    system_busy: float
    ctl_fds: int
    others: dict[int, tuple[str, float]] = field(default_factory=dict)


def cpu_of(p: psutil.Process) -> float:
    t = p.cpu_times()
    return float(t.user + t.system)


def system_busy() -> float:
    t = psutil.cpu_times()
    idle = t.idle + getattr(t, "iowait", 0.0) + getattr(t, "steal", 0.0)
    return float(sum(t) - idle - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0))


def cpu_snap(fleet: Fleet) -> CpuSnap:
    ctl = psutil.Process(fleet.ctl.pid)
    engines = {}
    for pid in fleet.engines:
        with contextlib.suppress(psutil.Error):
            engines[pid] = cpu_of(psutil.Process(pid))
    fds = 0
    with contextlib.suppress(psutil.Error):
        fds = ctl.num_fds()
    ours = {fleet.ctl.pid, os.getpid(), *fleet.engines}
    others = {}
    for p in psutil.process_iter(["pid", "cmdline", "name"]):
        if p.pid in ours:
            continue
        with contextlib.suppress(psutil.Error):
            cmd = " ".join(p.info["cmdline"] or [p.info["name"] or "?"])
            others[p.pid] = (cmd[:90], cpu_of(p))
    return CpuSnap(time.monotonic(), cpu_of(ctl), engines, cpu_of(psutil.Process()),
                   system_busy(), fds, others)


def top_others(a: CpuSnap, b: CpuSnap, wall: float, n: int = 4) -> list[str]:
    """The busiest processes that are not this benchmark's, over the window."""
    used = [(cpu - a.others.get(pid, ("", 0.0))[1], cmd) for pid, (cmd, cpu) in b.others.items()]
    used.sort(reverse=True)
    return [f"{u / wall:.2f} cores: {cmd}" for u, cmd in used[:n] if u / wall >= 0.01]


def idle_cpu(fleet: Fleet, seconds: float) -> dict[str, Any]:
    """Controller and engine CPU with the whole fleet ready and no requests: the cost of health
    checks and engine /metrics polling."""
    a = cpu_snap(fleet)
    time.sleep(seconds)
    b = cpu_snap(fleet)
    wall = b.t - a.t
    return {"seconds": round(wall, 1), "controller_cores": round((b.ctl - a.ctl) / wall, 3),
            "engines_cores": round(sum(b.engines[p] - a.engines.get(p, 0.0)
                                       for p in b.engines) / wall, 3)}


# ---- load ------------------------------------------------------------------------------------

@dataclass
class Req:
    sched: float  # loop time the arrival was due
    stream: bool
    sent: float = 0.0
    done: float = 0.0
    ttft: float | None = None
    error: str | None = None


@dataclass
class LoadRun:
    reqs: list[Req] = field(default_factory=list)
    window: tuple[float, float] = (0.0, 0.0)
    snaps: list[CpuSnap] = field(default_factory=list)
    scrapes: list[dict[str, Any] | None] = field(default_factory=list)
    peak_inflight: int = 0
    peak_fds: int = 0
    ready_min: dict[str, int] = field(default_factory=dict)
    unfinished: int = 0


def make_corpus(rng: random.Random, nbytes: int) -> str:
    out: list[str] = []
    n = 0
    while n < nbytes:
        w = rng.choice(WORDS)
        out.append(w)
        n += len(w) + 1
    return " ".join(out)


async def one(session: aiohttp.ClientSession, url: str, body: bytes, r: Req,
              max_tokens: int) -> None:
    r.sent = time.monotonic()
    try:
        async with session.post(url, data=body,
                                headers={"content-type": "application/json"}) as resp:
            if resp.status != 200:
                text = (await resp.read())[:300].decode(errors="replace")
                r.error = f"http {resp.status}"
                if len(ERROR_SAMPLES.setdefault(r.error, [])) < 3:
                    ERROR_SAMPLES[r.error].append(text)
                return
            if not r.stream:
                data = json.loads(await resp.read())
                if "error" in data:
                    r.error = "error body"
                elif data.get("usage", {}).get("completion_tokens") != max_tokens:
                    r.error = "wrong token count"
                return
            last = b""
            async for line in resp.content:
                line = line.strip()
                if not line:
                    continue
                if b'"error"' in line:
                    r.error = "stream error event"
                    return
                if r.ttft is None and line.startswith(b"data: {") and b'"text":""' not in line:
                    r.ttft = time.monotonic() - r.sent
                last = line
            if last != b"data: [DONE]":
                r.error = "stream without [DONE]"
    except TimeoutError:
        r.error = "client timeout (gave up)"
    except aiohttp.ClientError as exc:
        r.error = f"connection: {type(exc).__name__}"
    finally:
        r.done = time.monotonic()


async def scrape(session: aiohttp.ClientSession, url: str) -> dict[str, Any] | None:
    """The controller's /metrics, parsed, with when it was asked for and answered (under
    overload the answer can take seconds: the deltas then cover a shifted interval)."""
    t_sent = time.monotonic()
    try:
        async with session.get(f"{url}/metrics", timeout=aiohttp.ClientTimeout(total=30)) as r:
            text = await r.text()
        t_done = time.monotonic()
        return {**parse_metrics(text), "t_sent": t_sent, "t_done": t_done}
    except (TimeoutError, aiohttp.ClientError):
        return None


async def run_load(args: argparse.Namespace, fleet: Fleet) -> LoadRun:
    rng = random.Random(args.seed)
    corpus = make_corpus(rng, 64 * 1024)
    url = f"{fleet.url}/v1/completions"
    run = LoadRun()
    inflight: set[asyncio.Task[None]] = set()
    conn = aiohttp.TCPConnector(limit=args.max_inflight + 16, keepalive_timeout=30)
    timeout = aiohttp.ClientTimeout(total=args.timeout)
    mon_session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
    loop = asyncio.get_running_loop()
    t_start = time.monotonic()
    w0, w1 = t_start + args.warmup, t_start + args.warmup + args.duration
    run.window = (w0, w1)

    async def at(t: float) -> None:
        await asyncio.sleep(max(0.0, t - time.monotonic()))
        run.snaps.append(cpu_snap(fleet))
        run.scrapes.append(await scrape(mon_session, fleet.url))

    async def monitor() -> None:
        while True:
            fleet.note_engines()
            run.peak_inflight = max(run.peak_inflight, len(inflight))
            with contextlib.suppress(psutil.Error):
                run.peak_fds = max(run.peak_fds, psutil.Process(fleet.ctl.pid).num_fds())
            with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError, ValueError):
                async with mon_session.get(f"{fleet.url}/healthz") as r:
                    ready = (await r.json()).get("ready", {})
                for role, n in ready.items():
                    run.ready_min[role] = min(run.ready_min.get(role, n), n)
            await asyncio.sleep(1.0)

    try:
        async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
            marks = [asyncio.create_task(at(w0)), asyncio.create_task(at(w1))]
            mon = asyncio.create_task(monitor())
            gap = 1.0 / args.rate
            nxt, i = t_start, 0
            while nxt < w1:
                now = time.monotonic()
                while nxt <= now and nxt < w1:
                    stream = rng.random() < args.stream_share
                    r = Req(sched=nxt, stream=stream)
                    run.reqs.append(r)
                    if len(inflight) >= args.max_inflight:
                        r.sent = r.done = now
                        r.error = "dropped by client (in-flight cap)"
                    else:
                        nbytes = 4 * rng.randint(args.prompt_tokens[0], args.prompt_tokens[1])
                        off = rng.randrange(0, len(corpus) - nbytes)
                        body = json.dumps({"model": MODEL, "prompt": f"request {i}: "
                                           + corpus[off:off + nbytes],
                                           "max_tokens": args.max_tokens, "stream": stream,
                                           "temperature": 0}).encode()
                        t = loop.create_task(one(session, url, body, r, args.max_tokens))
                        inflight.add(t)
                        t.add_done_callback(inflight.discard)
                    i += 1
                    nxt += rng.expovariate(args.rate) if args.arrivals == "poisson" else gap
                await asyncio.sleep(max(0.0, min(nxt, w1) - time.monotonic()))
            await asyncio.gather(*marks)
            if inflight:
                _, pending = await asyncio.wait(set(inflight), timeout=args.timeout + 5)
                run.unfinished = len(pending)
                for t in pending:
                    t.cancel()
            mon.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await mon
    finally:
        await mon_session.close()
    return run


# ---- fleet start -----------------------------------------------------------------------------

async def wait_fleet(args: argparse.Namespace, fleet: Fleet, t_spawn: float) -> dict[str, Any]:
    want = {"prefill": args.prefill, "decode": args.decode}
    deadline = t_spawn + args.start_timeout + 30
    up_at = None
    last_print = 0.0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as s:
        while True:
            if fleet.ctl.poll() is not None:
                raise SystemExit(f"controller exited {fleet.ctl.returncode}; "
                                 f"log: {fleet.tmp / 'controller.log'}")
            ready: dict[str, int] = {}
            with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError, ValueError):
                async with s.get(f"{fleet.url}/healthz") as r:
                    if r.status == 200:
                        up_at = up_at or time.monotonic()
                        ready = (await r.json()).get("ready", {})
            fleet.note_engines()
            now = time.monotonic()
            if all(ready.get(k, 0) >= v for k, v in want.items()):
                break
            if now > deadline:
                raise SystemExit(f"fleet not ready after {now - t_spawn:.0f} s: {ready}; "
                                 f"log: {fleet.tmp / 'controller.log'}")
            if now - last_print > 10:
                print(f"  ... {now - t_spawn:5.1f} s: ready {ready or '-'}, "
                      f"engine processes {len(fleet.engines)}", flush=True)
                last_print = now
            await asyncio.sleep(0.25)
        t_ready = time.monotonic()
        token = (fleet.tmp / "state" / "token").read_text().strip()
        starts: list[float] = []
        with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            async with s.get(f"{fleet.url}/api/v1/instances",
                             headers={"Authorization": f"Bearer {token}"}) as r:
                data = await r.json()
            items = data if isinstance(data, list) else data.get("instances", [])
            starts = [i["ready_at"] - i["created_at"] for i in items if i.get("ready_at")]
    return {"fleet_start_s": round(t_ready - t_spawn, 1),
            "controller_up_s": round((up_at or t_ready) - t_spawn, 1),
            "instance_start_s_p50": pct(starts, 0.5), "instance_start_s_max": max(starts or [0]),
            "engine_processes": len(fleet.engines)}


# ---- report ----------------------------------------------------------------------------------

def summarize(args: argparse.Namespace, run: LoadRun, idle: dict[str, Any]) -> dict[str, Any]:
    w0, w1 = run.window
    dur = w1 - w0
    win = [r for r in run.reqs if w0 <= r.sched < w1]
    ok_done_in_window = sum(1 for r in run.reqs if r.error is None and w0 <= r.done < w1)
    errors: dict[str, int] = {}
    for r in win:
        if r.error:
            errors[r.error] = errors.get(r.error, 0) + 1
    ok = [r for r in win if r.error is None and r.done]
    ttft = [r.ttft for r in ok if r.stream and r.ttft is not None]
    e2e = [r.done - r.sent for r in ok if not r.stream]
    lag = [r.sent - r.sched for r in win if r.sent]
    out: dict[str, Any] = {
        "window_s": round(dur, 2),
        "offered_rps": args.rate,
        "arrivals_in_window": len(win),
        "sent_rps": round(sum(1 for r in win if r.error != "dropped by client (in-flight cap)")
                          / dur, 1),
        "achieved_rps": round(ok_done_in_window / dur, 1),
        "ok_of_window_arrivals": len(ok),
        "errors": errors,
        "error_samples": ERROR_SAMPLES,
        "error_total": sum(errors.values()),
        "error_share": round(sum(errors.values()) / len(win), 4) if win else None,
        "client_ttft_ms_p50": _ms(pct(ttft, 0.5)), "client_ttft_ms_p99": _ms(pct(ttft, 0.99)),
        "streamed_ok": len(ttft),
        "client_e2e_ms_p50": _ms(pct(e2e, 0.5)), "client_e2e_ms_p99": _ms(pct(e2e, 0.99)),
        "client_send_lag_ms_p50": _ms(pct(lag, 0.5)),
        "client_send_lag_ms_p99": _ms(pct(lag, 0.99)),
        "peak_inflight": run.peak_inflight,
        "unfinished_at_end": run.unfinished,
        "controller_peak_fds": run.peak_fds,
        "ready_min_during_run": run.ready_min,
    }
    if len(run.snaps) == 2:
        a, b = run.snaps
        wall = b.t - a.t
        ctl = b.ctl - a.ctl
        eng = sum(b.engines[p] - a.engines.get(p, 0.0) for p in b.engines)
        cli = b.client - a.client
        busy = b.system_busy - a.system_busy
        done = max(1, ok_done_in_window)
        handled_rate = 0.0  # requests the controller recorded per second between scrapes
        sa, sb = (run.scrapes + [None, None])[:2]
        if sa is not None and sb is not None and sb["t_done"] > sa["t_done"]:
            handled = sum(v - sa["requests"].get(k, 0.0) for k, v in sb["requests"].items())
            handled_rate = handled / (sb["t_done"] - sa["t_done"])
        out["cpu"] = {
            "wall_s": round(wall, 2),
            "controller_cpu_ms_per_req_above_idle": round(
                (ctl / wall - idle.get("controller_cores", 0.0)) * wall * 1e3 / done, 2),
            "engines_cpu_ms_per_req_above_idle": round(
                (eng / wall - idle.get("engines_cores", 0.0)) * wall * 1e3 / done, 2),
            "controller_cores": round(ctl / wall, 2),
            "controller_cpu_ms_per_req": round(ctl * 1e3 / done, 2),
            "controller_cpu_ms_per_handled": (round(ctl / wall * 1e3 / handled_rate, 2)
                                              if handled_rate else None),
            "engines_cores": round(eng / wall, 2),
            # CPU of an engine that exited inside the window is lost (counted in "other")
            "engines_exited_in_window": len(set(a.engines) - set(b.engines)),
            "engines_cpu_ms_per_req": round(eng * 1e3 / done, 2),
            "client_cores": round(cli / wall, 2),
            "client_cpu_ms_per_req": round(cli * 1e3 / done, 2),
            "machine_busy_cores": round(busy / wall, 2),
            "other_cores": round(max(0.0, busy - ctl - eng - cli) / wall, 2),
            "machine_cores": psutil.cpu_count(),
            "top_other_processes": top_others(a, b, wall),
        }
    before, after = (run.scrapes + [None, None])[:2]
    if after is None:
        out["routing_decision"] = "unavailable (metrics scrape failed)"
    elif ROUTING_HIST not in after["hists"]:
        out["routing_decision"] = f"unavailable (controller does not export {ROUTING_HIST})"
    else:
        d = hist_delta(before["hists"].get(ROUTING_HIST) if before else None,
                       after["hists"][ROUTING_HIST])
        out["routing_decision"] = {"ms_p50": _ms(hist_quantile(d, 0.5)),
                                   "ms_p99": _ms(hist_quantile(d, 0.99)),
                                   "count": d.get(math.inf, 0.0)}
    if after is not None:
        out["metrics_interval"] = {
            "start_s": round(before["t_done"] - w0, 2) if before else None,
            "end_s": round(after["t_done"] - w0, 2),
            "scrape_latency_s": [round(x["t_done"] - x["t_sent"], 2) for x in (before, after)
                                 if x is not None]}
        d = hist_delta(before["hists"].get("pdctl_ttft_seconds") if before else None,
                       after["hists"].get("pdctl_ttft_seconds", {}))
        out["controller_ttft_ms_p50"] = _ms(hist_quantile(d, 0.5))
        out["controller_ttft_ms_p99"] = _ms(hist_quantile(d, 0.99))
        b_parts = before["parts"] if before else {}
        means = {}
        for k, v in after["parts"].items():
            n = after["parts"].get(k + "#n", 0.0) - b_parts.get(k + "#n", 0.0)
            if not k.endswith("#n") and n > 0:
                means[k] = round((v - b_parts.get(k, 0.0)) / n * 1e3, 2)
        out["controller_ttft_parts_mean_ms"] = means
        b_req = before["requests"] if before else {}
        out["controller_requests_by_path"] = {
            k: int(v - b_req.get(k, 0.0)) for k, v in after["requests"].items()
            if v - b_req.get(k, 0.0) > 0}
    return out


def _ms(v: float | None) -> float | None:
    return None if v is None else round(v * 1e3, 2)


def fmt(v: Any, unit: str = "") -> str:
    if v is None:
        return "n/a"
    return f"{v}{unit}"


def print_table(args: argparse.Namespace, res: dict[str, Any]) -> None:
    s, f, c = res["summary"], res["fleet"], res["summary"].get("cpu", {})
    rd = s["routing_decision"]
    rows = [
        ("fleet", f"{args.prefill} prefill x TP{PREFILL_TP} + {args.decode} decode x TP{DECODE_TP}"
                  f" on {res['config']['nodes']} nodes x {PER_NODE} ({MODEL}, {HARDWARE}, "
                  f"time_scale {args.time_scale}, engine nice {args.engine_nice})"),
        ("fleet start (all ready)", f"{f['fleet_start_s']} s (controller up {f['controller_up_s']}"
                                    f" s; instance start p50 {fmt(_r(f['instance_start_s_p50']))}"
                                    f" s, max {_r(f['instance_start_s_max'])} s)"),
        ("workload", f"{args.arrivals} arrivals, prompts {args.prompt_tokens[0]}-"
                     f"{args.prompt_tokens[1]} tok, max_tokens {args.max_tokens}, "
                     f"{int(args.stream_share * 100)}% streamed, timeout {args.timeout} s"),
        ("offered / sent / achieved", f"{s['offered_rps']} / {s['sent_rps']} / "
                                      f"{s['achieved_rps']} req/s over {s['window_s']} s"),
        ("errors", f"{s['error_total']} of {s['arrivals_in_window']} "
                   f"({fmt(_pc(s['error_share']))}) {s['errors'] or ''}"),
        *(("  sample", f"{k}: {v[0][:150]}") for k, v in s["error_samples"].items()),
        ("client TTFT p50 / p99", f"{fmt(s['client_ttft_ms_p50'])} / "
                                  f"{fmt(s['client_ttft_ms_p99'])} ms  "
                                  f"(streamed, n={s['streamed_ok']})"),
        ("client e2e p50 / p99", f"{fmt(s['client_e2e_ms_p50'])} / {fmt(s['client_e2e_ms_p99'])}"
                                 " ms  (non-streamed)"),
        ("controller TTFT p50 / p99", f"{fmt(s.get('controller_ttft_ms_p50'))} / "
                                      f"{fmt(s.get('controller_ttft_ms_p99'))} ms "
                                      "(pdctl_ttft_seconds, buckets)"),
        ("controller TTFT parts (mean)", " ".join(
            f"{k.removesuffix('_ms')} {v}" for k, v in
            s.get("controller_ttft_parts_mean_ms", {}).items()) + " ms"),
        ("metrics delta interval", _interval(s.get("metrics_interval"), s["window_s"])),
        ("routing decision p50 / p99", rd if isinstance(rd, str) else
         f"{fmt(rd['ms_p50'])} / {fmt(rd['ms_p99'])} ms (n={int(rd['count'])})"),
        ("controller CPU", f"{fmt(c.get('controller_cores'))} cores, "
                           f"{fmt(c.get('controller_cpu_ms_per_req'))} ms per completed req "
                           f"({fmt(c.get('controller_cpu_ms_per_handled'))} ms per request it "
                           f"recorded); idle with the fleet: {res['idle']['controller_cores']} "
                           "cores, so "
                           f"{fmt(c.get('controller_cpu_ms_per_req_above_idle'))} ms/req above "
                           "idle"),
        ("engines CPU (all)", f"{fmt(c.get('engines_cores'))} cores, "
                              f"{fmt(c.get('engines_cpu_ms_per_req'))} ms per completed req; "
                              f"idle: {res['idle']['engines_cores']} cores, so "
                              f"{fmt(c.get('engines_cpu_ms_per_req_above_idle'))} ms/req above "
                              "idle"),
        ("client CPU", f"{fmt(c.get('client_cores'))} cores, "
                       f"{fmt(c.get('client_cpu_ms_per_req'))} ms/req; send lag p50/p99 "
                       f"{fmt(s['client_send_lag_ms_p50'])} / {fmt(s['client_send_lag_ms_p99'])}"
                       " ms"),
        ("machine CPU", f"{fmt(c.get('machine_busy_cores'))} of {c.get('machine_cores')} cores "
                        f"busy; other processes {fmt(c.get('other_cores'))} cores"),
        *(("  other", line) for line in c.get("top_other_processes", [])),
        ("paths (controller)", f"{s.get('controller_requests_by_path')}"),
        ("peaks", f"in-flight {s['peak_inflight']}, controller fds {s['controller_peak_fds']}, "
                  f"min ready during run {s['ready_min_during_run']}, engine processes exited "
                  f"in window {c.get('engines_exited_in_window')}"),
        ("instance failures", _failures(res["cleanup"].get("instance_failures", []))),
        ("cleanup", ", ".join(f"{k} {v}" for k, v in res["cleanup"].items()
                              if k != "instance_failures")),
    ]
    width = max(len(k) for k, _ in rows)
    print()
    for k, v in rows:
        print(f"{k:<{width}}  {v}")


def _interval(mi: dict[str, Any] | None, window: float) -> str:
    if not mi:
        return "n/a (scrape failed)"
    return (f"window +{fmt(mi['start_s'])} s .. +{mi['end_s']} s of a {window} s window "
            f"(controller /metrics answered in {mi['scrape_latency_s']} s)")


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


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 1)


def _pc(v: float | None) -> str | None:
    return None if v is None else f"{v * 100:.2f}%"


def modelled_capacity(args: argparse.Namespace) -> float:
    """Prefills per wall second the modelled prefill pool can do for the mean prompt."""
    m, hw = profiles.model(MODEL), profiles.hardware(HARDWARE)
    mean = sum(args.prompt_tokens) // 2
    return args.prefill / (profiles.step_seconds(m, hw, PREFILL_TP, mean, 0, []) *
                           args.time_scale)


# ---- main ------------------------------------------------------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path, default=Path("bench-results/scale.json"))
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (logs)")
    args = ap.parse_args()
    quick = args.quick
    for name, full, small in (("rate", 1000.0, 200.0), ("duration", 25.0, 10.0),
                              ("warmup", 8.0, 4.0), ("prefill", 16, 4), ("decode", 48, 12)):
        if getattr(args, name) is None:
            setattr(args, name, small if quick else full)

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass

    tmp = Path(tempfile.mkdtemp(prefix="pdctl-bench-scale-"))
    nodes = nodes_for(args.prefill, args.decode)
    cap = modelled_capacity(args)
    print(f"bench_scale: {args.prefill}P x TP{PREFILL_TP} + {args.decode}D x TP{DECODE_TP} on "
          f"{nodes} x {PER_NODE} {HARDWARE}, time_scale {args.time_scale}; modelled prefill "
          f"capacity ~{cap:.0f} req/s for the mean prompt; offered {args.rate:g} req/s; "
          f"logs in {tmp}", flush=True)
    t_all = time.monotonic()
    fleet: Fleet | None = None
    res: dict[str, Any] = {"config": {**{k: (str(v) if isinstance(v, Path) else v)
                                         for k, v in vars(args).items()},
                                      "nodes": nodes, "modelled_prefill_capacity_rps": cap,
                                      "cpu_count": psutil.cpu_count(),
                                      "loadavg_before": os.getloadavg()}}
    rc = 0
    try:
        t_spawn = time.monotonic()
        fleet = start_controller(args, tmp)
        res["fleet"] = asyncio.run(wait_fleet(args, fleet, t_spawn))
        print(f"fleet ready: {res['fleet']['fleet_start_s']} s for "
              f"{args.prefill + args.decode} instances; load: {args.warmup:g} s warm-up + "
              f"{args.duration:g} s measured", flush=True)
        if args.engine_nice:
            for pid in fleet.alive_engines():
                with contextlib.suppress(psutil.Error):
                    psutil.Process(pid).nice(args.engine_nice)
        res["idle"] = idle_cpu(fleet, args.idle)
        run = asyncio.run(run_load(args, fleet))
        res["summary"] = summarize(args, run, res["idle"])
        res["config"]["loadavg_after"] = os.getloadavg()
    except KeyboardInterrupt:
        print("\ninterrupted; stopping the fleet", file=sys.stderr, flush=True)
        rc = 130
    finally:
        if fleet is not None:
            res["cleanup"] = stop_fleet(fleet)
            c = res["cleanup"]
            print(f"fleet stopped in {c['stop_s']} s; engine processes left: "
                  f"{c['engine_processes_left']}", flush=True)
    res["total_s"] = round(time.monotonic() - t_all, 1)
    if "summary" in res:
        print_table(args, res)
        print(f"total run time {res['total_s']} s")
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(res, indent=1, default=str))
        print(f"results: {args.json}")
    if res.get("cleanup", {}).get("engine_processes_left"):
        print("ERROR: engine processes left behind", file=sys.stderr)
        rc = rc or 1
    if res.get("cleanup", {}).get("instance_failures"):
        args.keep = True
        print(f"instances failed during the run: logs kept in {tmp}")
    if not args.keep and rc == 0:
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
