"""guidellm against the real CPU lab: disaggregated vs colocated, and the simulator's error.

Three setups, one after the other, on this machine's cores, each measured with the same
guidellm 0.8.1 workload (a mixed JSONL data file: half short prompts below the lab's
disaggregation threshold, half long ones above it; fixed output length; a synchronous and a
concurrent profile):

  disagg     ``pdctl controller`` with backend vllm and ``cpu_lab_defaults`` (what ``pdctl lab``
             runs): 1 prefill + 1 decode, each pinned to its own core, KV over NIXL.
  colocated  two plain vLLM OpenAI servers started here (the launcher's flags minus
             ``--kv-transfer-config``: no NixlConnector, so no busy-polling UCX progress
             thread), one pinned to each core, same KV space, behind ``pdctl controller``
             with backend external (empty prefill pool: every request is served colocated).
  sim        ``pdctl controller`` with backend sim, the lab's pools, TP, threshold and link,
             hardware ``cpu-lab``, model ``lab-tiny``, time scale 1.

guidellm runs offline (HF_HUB_OFFLINE, TRANSFORMERS_OFFLINE) from its own venv
(``.bench/venv-guidellm``), with the lab model directory as its tokenizer. TTFT and ITL
percentiles are computed here from guidellm's per-request records with ``bench.stats`` (the
controller's percentile definition): TTFT = first token - request start; ITL = a request's
(last token - first token) / (tokens - 1), counted once per gap, which is how guidellm
weighs its own ITL distribution. Throughput is successful requests and output tokens over
the benchmark's duration. Every process is stopped (``bench.fleet``) when a setup ends, on
error and on Ctrl-C.

    .venv/bin/python -m bench.lab            # 10-18 min on 2 cores (each run is capped at
                                             # 120 s; engines start in 1-2 min)
    .venv/bin/python -m bench.lab --quick    # 5-8 min
    .venv/bin/python -m bench.lab --only sim --real-from bench-results/lab.json \\
        --json bench-results/lab-sim.json    # the sim again, against earlier real runs

Create the guidellm venv (CPU torch from the local wheel, not a CUDA one) with
    python3.11 -m venv .bench/venv-guidellm
    .bench/venv-guidellm/bin/pip install torch==2.13.0 guidellm==0.8.1
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import random
import shlex
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench import cpu, prom, stats
from bench.fleet import (
    ControllerProc,
    Fleet,
    FleetError,
    free_port,
    healthy,
    interrupt_on_signals,
    start_controller,
    tail,
    wait_until,
)
from bench.report import ROOT, ratio, write_json
from controller.cli.serve import cpu_lab_defaults
from controller.config import deep_merge, load_settings
from controller.launchers.base import LaunchSpec
from controller.launchers.vllm import VllmLauncher
from controller.models import Role

TITLE = "The real CPU lab under guidellm; simulator validity"
ABOUT = ("Real vLLM (CPU build) engines on this machine's two cores, the lab model, guidellm "
         "0.8.1 offline (local tokenizer, a generated mix of long and short prompts), "
         "synchronous and concurrent profiles. 1 prefill + 1 decode (KV over NIXL) started "
         "by pdctl, against 2 colocated engines without a KV connector behind the same "
         "router. Then the same workload on the simulated lab (`cpu-lab` profile) and the "
         "error of its predictions.")

GUIDELLM = ROOT / ".bench" / "venv-guidellm" / "bin" / "guidellm"
SETUPS = ("disagg", "colocated", "sim")
PROFILES = ("synchronous", "concurrent")
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
WORDS = ("the model layer decode cache token batch prefill router engine memory core "
         "transfer stream block queue latency request kernel tensor value page attention "
         "weight shard link host agent thread").split()


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


@dataclass
class Options:
    quick: bool = False
    setups: tuple[str, ...] = SETUPS
    work: Path = ROOT / "bench-results" / "lab-work"  # data files, guidellm outputs, logs
    model_dir: Path = ROOT / "lab-model"
    streams: int = 4  # the concurrent profile's
    sync_requests: int = 40
    sync_seconds: float = 120.0  # cap of the synchronous run
    conc_requests: int = 80
    conc_seconds: float = 120.0
    output_tokens: int = 64
    pdctl_root: Path | None = None  # the controllers' source tree (default: this checkout)
    real_from: Path | None = None  # take the setups not run now from this earlier result
    start_timeout: float = 420.0  # seconds allowed for vLLM engines to become ready
    idle_probe: float = 5.0  # seconds of idle CPU sampling with the engines up

    @staticmethod
    def defaults(quick: bool) -> Options:
        if quick:
            return Options(quick=True, sync_requests=12, sync_seconds=45, conc_requests=24,
                           conc_seconds=45)
        return Options()


# ---- results ----------------------------------------------------------------------------

@dataclass
class ProfileResult:
    """One guidellm run against one setup."""

    requests_ok: int
    requests_errored: int
    duration_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    itl_p50_ms: float
    itl_p99_ms: float
    req_per_s: float
    output_tok_per_s: float
    ttft_p50_long_ms: float
    ttft_p50_short_ms: float
    n_long: int
    n_short: int
    cpu: dict[str, float] = field(default_factory=dict)
    guidellm_cmd: str = ""
    router: dict[str, dict[str, float]] = field(default_factory=dict)  # medians per path
    tail: list[dict[str, Any]] = field(default_factory=list)  # the slowest requests
    lease: dict[str, float] | None = None  # prefill KV lease counters after the run


@dataclass
class SetupResult:
    engines_ready_s: float | None = None
    idle_cpu: dict[str, float] = field(default_factory=dict)
    profiles: dict[str, ProfileResult] = field(default_factory=dict)
    error: str | None = None
    leftover_processes: list[str] = field(default_factory=list)
    setup_s: float = 0.0
    taken_from: str | None = None  # an earlier result file (--real-from)

    @staticmethod
    def from_json(d: dict[str, Any], source: str) -> SetupResult:
        profiles = {k: ProfileResult(**v) for k, v in (d.get("profiles") or {}).items()}
        known = {f.name for f in dataclasses.fields(SetupResult)} - {"profiles", "taken_from"}
        return SetupResult(**{k: v for k, v in d.items() if k in known}, profiles=profiles,
                           taken_from=source)


@dataclass
class LabResult:
    options: Options
    started: str
    threshold: int
    max_model_len: int
    prompt_lengths: dict[str, dict[str, dict[str, float]]]
    data: dict[str, str]
    machine_cpus: int | None
    load_avg_1m_at_start: float
    setups: dict[str, SetupResult] = field(default_factory=dict)
    calibration: dict[str, float] | None = None
    total_s: float = 0.0


# ---- workload ----------------------------------------------------------------------------

def write_data(path: Path, model_dir: Path, rows: int, short: tuple[int, int],
               long: tuple[int, int], output_tokens: int, seed: int, tag: str
               ) -> dict[str, dict[str, float]]:
    """A JSONL file of prompts with exact token counts (the lab tokenizer), short and long in
    a seeded random order. Each prompt starts with a unique ``tag``+index, so that vLLM's
    prefix cache never hits (the simulator has none) when a setup runs both profiles."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    rng = random.Random(seed)
    text_ids = tok.encode(" ".join(rng.choice(WORDS) for _ in range(6000)),
                          add_special_tokens=False).ids
    kinds = ["short", "long"] * (rows // 2)
    rng.shuffle(kinds)
    counts: dict[str, list[int]] = {"short": [], "long": []}
    with open(path, "w") as f:
        for i, kind in enumerate(kinds):
            lo, hi = short if kind == "short" else long
            n = rng.randint(lo, hi)
            start = rng.randint(0, len(text_ids) - n - 1)
            prompt = f"{tag}{i} " + tok.decode(text_ids[start:start + n])
            n_real = len(tok.encode(prompt, add_special_tokens=False).ids)
            counts[kind].append(n_real)
            f.write(json.dumps({"prompt": prompt, "prompt_tokens_count": n_real,
                                "output_tokens_count": output_tokens}) + "\n")
    return {k: {"n": len(v), "min": min(v), "median": stats.median(v), "max": max(v)}
            for k, v in counts.items()}


def guidellm_argv(target: str, model_dir: Path, data: Path, profile: str, streams: int,
                  requests: int, seconds: float, out: Path) -> list[str]:
    # The controller has no /health: guidellm validates against /v1/models instead.
    backend = json.dumps({"kind": "openai_http", "target": target, "model": "lab-tiny",
                          "request_format": "/v1/completions", "timeout": 600,
                          "api_routes": {"/health": "v1/models"}})
    prof = "kind=synchronous" if profile == "synchronous" else f"kind=concurrent,streams={streams}"
    return [
        str(GUIDELLM), "run",
        "--backend", backend,
        "--tokenizer", f"kind=huggingface_auto,model={model_dir}",
        "--data", f"kind=json_file,path={data}",
        "--profile", prof,
        "--constraint", f"kind=max_requests,count={requests}",
        "--constraint", f"kind=max_duration,seconds={seconds:g}",
        "--output", f"kind=json,path={out}",
        "--disable-console-interactive",
    ]


def run_guidellm(fleet: Fleet, name: str, argv: list[str], log_path: Path,
                 timeout_s: float) -> None:
    log(f"  $ {shlex.join(argv)}")
    env = {**OFFLINE, "VIRTUAL_ENV": str(GUIDELLM.parents[1])}
    fleet.start(name, argv, env, log=log_path)
    code = fleet.finish(name, timeout_s)
    if code != 0:
        raise FleetError(f"guidellm exited {code}; tail of {log_path}:\n{tail(log_path, 20)}")


def summarize(out: Path, data: Path, threshold: int) -> ProfileResult:
    """TTFT and ITL percentiles (``bench.stats``) from guidellm's per-request records;
    throughput over its duration; TTFT medians of the long and short prompts."""
    bench = json.loads(out.read_text())["benchmarks"][0]
    reqs = bench["requests"]["successful"]
    dur = float(bench["duration"]) or 1.0
    lengths = {}
    with open(data) as f:
        for line in f:
            row = json.loads(line)
            lengths[row["prompt"]] = row["prompt_tokens_count"]
    ttft: list[float] = []
    itl: list[float] = []
    gaps: list[int] = []
    by_len: dict[str, list[float]] = {"long": [], "short": []}
    out_tokens = 0
    for r in reqs:
        t = r["info"]["timings"]
        n_out = (r.get("output_metrics") or {}).get("text_tokens") or 0
        out_tokens += n_out
        first, start, last = (t.get("first_token_iteration"), t.get("request_start"),
                              t.get("last_token_iteration"))
        if first is None or start is None:
            continue
        ttft.append(1e3 * (first - start))
        if n_out > 1 and last is not None:
            itl.append(1e3 * (last - first) / (n_out - 1))
            gaps.append(n_out - 1)
        # The prompt's length in lab-tokenizer tokens, from the data file (the sim's usage
        # counts UTF-8 bytes / 4, not tokens).
        n = None
        try:
            n = lengths[json.loads(r["request_args"])["body"]["prompt"]]
        except (ValueError, KeyError, TypeError):
            n = (r.get("input_metrics") or {}).get("text_tokens") or 0
        by_len["long" if n >= threshold else "short"].append(1e3 * (first - start))
    ttft_q = stats.quantiles(ttft, (0.5, 0.99))
    itl_q = stats.quantiles(stats.weighted_expand(itl, gaps), (0.5, 0.99))
    return ProfileResult(
        requests_ok=len(reqs),
        requests_errored=int(bench["metrics"]["request_totals"]["errored"]),
        duration_s=dur, ttft_p50_ms=ttft_q[0], ttft_p99_ms=ttft_q[1], itl_p50_ms=itl_q[0],
        itl_p99_ms=itl_q[1], req_per_s=len(reqs) / dur, output_tok_per_s=out_tokens / dur,
        ttft_p50_long_ms=stats.median(by_len["long"]),
        ttft_p50_short_ms=stats.median(by_len["short"]),
        n_long=len(by_len["long"]), n_short=len(by_len["short"]))


# ---- setups ------------------------------------------------------------------------------

def lab_config(model_dir: Path) -> dict[str, Any]:
    cfg = cpu_lab_defaults(model_dir.resolve())
    cfg["backend"] = "vllm"
    return cfg


def controller(fleet: Fleet, o: Options, cfg: dict[str, Any], name: str) -> ControllerProc:
    """A controller for setup ``name``: a fresh state directory (no desired state left from
    an earlier run), no Prometheus, the config checked before anything starts."""
    state = o.work / f"state-{name}"
    shutil.rmtree(state, ignore_errors=True)
    cfg = deep_merge(cfg, {"controller": {"port": free_port(), "state_dir": str(state)},
                           "prometheus": {"enabled": False}})
    load_settings(None, **cfg)  # refuse a bad config here
    # The controller (and the sim engines it starts) may run from ``pdctl_root``: a pinned
    # copy of the code keeps a benchmark apart from edits in progress in a shared tree.
    return start_controller(o.work, cfg, name=f"{name}-controller", fleet=fleet,
                            pdctl_root=o.pdctl_root, env=OFFLINE, wait="up", timeout_s=60)


def wait_pools(ctl: ControllerProc, want: dict[str, int], fleet: Fleet,
               timeout_s: float) -> float:
    """Until the controller reports ``want`` ready instances per role; seconds it took."""
    seen: list[Any] = []

    def ready() -> bool:
        inst = ctl.get("/instances")
        seen[:] = [inst]
        return all(sum(1 for i in inst if i["role"] == r and i["state"] == "ready") >= n
                   for r, n in want.items())

    def progress(elapsed: float) -> str:
        states = ", ".join(f"{i['id']} {i['state']}" for i in (seen[0] if seen else []))
        return f"engines starting ({elapsed:.0f} s): {states}"

    return wait_until("engines", ready, timeout_s, fleet, interval_s=1.0, progress=progress)


def start_colocated_engines(fleet: Fleet, model_dir: Path, work: Path) -> list[str]:
    """Two plain vLLM servers, one per core, exactly the launcher's flags and environment
    except the NixlConnector (``--kv-transfer-config``) and its side-channel variables."""
    settings = load_settings(None, **lab_config(model_dir))
    launcher = VllmLauncher(settings)
    urls = []
    for core in range(2):
        spec = LaunchSpec(f"colo-{core}", Role.DECODE, 1, (core,), work / f"colo-{core}.log")
        port = free_port()
        argv = launcher.argv(spec, port)
        i = argv.index("--kv-transfer-config")
        del argv[i:i + 2]
        env = {k: v for k, v in launcher.env(spec, 0).items()
               if not k.startswith("VLLM_NIXL_")}
        log(f"  core {core}: {' '.join(f'{k}={v}' for k, v in env.items() if 'CPU' in k)} "
            f"{shlex.join(argv[1:])}")
        fleet.start(f"colo-{core}", argv, env, log=spec.log_path)
        urls.append(f"http://127.0.0.1:{port}")
    return urls


def warm_up(base: str, n: int = 2) -> None:
    """First requests of a fresh engine (and a first NIXL transfer) are slow; keep them out."""
    with httpx.Client(base_url=base, timeout=600) as c:
        for i in range(n):
            for prompt in ("warm up " * 4, "warm up the prefill and decode path " * 70):
                r = c.post("/v1/completions", json={"model": "lab-tiny", "prompt": f"{i} {prompt}",
                                                    "max_tokens": 8, "ignore_eos": True})
                r.raise_for_status()


def router_parts(ctl: ControllerProc, limit: int) -> dict[str, dict[str, float]]:
    """Medians of the controller's TTFT accounting per path, over the last ``limit`` requests."""
    rows = ctl.get("/requests", limit=limit)
    out: dict[str, dict[str, float]] = {}
    for path in ("disaggregated", "colocated"):
        sel = [r for r in rows if r.get("path") == path and r.get("status") == "ok"]
        if not sel:
            continue
        out[path] = {"n": len(sel)}
        for k in ("queue_ms", "prefill_ms", "transfer_ms", "decode_sched_ms", "ttft_ms"):
            vals = [r[k] for r in sel if isinstance(r.get(k), int | float)]
            if vals:
                out[path][k] = stats.median(vals)
    return out


def lease_counters(ctl: ControllerProc) -> dict[str, float]:
    """The prefill engines' KV lease counters (cumulative since they started)."""
    urls = [i["url"] for i in ctl.get("/instances")
            if i["role"] == "prefill" and i["state"] == "ready"]
    out = {"expired": 0.0, "after_expiry": 0.0}
    for url in urls:
        page = prom.parse(httpx.get(f"{url}/metrics", timeout=30).text)
        out["expired"] += page.sum("vllm:nixl_num_kv_expired_reqs_total")
        out["after_expiry"] += page.sum("vllm:nixl_num_notifications_after_expiry_total")
    return out


TAIL_KEYS = ("id", "path", "status", "prompt_tokens", "ttft_ms", "queue_ms", "prefill_ms",
             "transfer_ms", "decode_sched_ms", "overhead_ms", "e2e_ms", "retries")


def request_rows(ctl: ControllerProc, limit: int, dump: Path) -> list[dict[str, Any]]:
    """The controller's last ``limit`` request records, also written to ``dump``; the three
    slowest to first token, with their TTFT parts (the tail's evidence)."""
    rows = ctl.get("/requests", limit=limit)
    dump.write_text(json.dumps(rows, indent=1))
    slow = sorted((r for r in rows if r.get("status") == "ok"), key=lambda r: -r["ttft_ms"])
    return [{k: r.get(k) for k in TAIL_KEYS} for r in slow[:3]]


def run_setup(name: str, o: Options, data: dict[str, Path], threshold: int,
              result: SetupResult) -> None:
    """One setup, measured into ``result`` (what was measured stays there when a later step
    fails)."""
    t_setup = time.monotonic()
    fleet = Fleet(o.work)
    try:
        if name == "disagg":
            ctl = controller(fleet, o, lab_config(o.model_dir), name)
            result.engines_ready_s = wait_pools(ctl, {"prefill": 1, "decode": 1}, fleet,
                                                o.start_timeout)
        elif name == "colocated":
            urls = start_colocated_engines(fleet, o.model_dir, o.work)
            t0 = time.monotonic()
            for u in urls:
                wait_until(f"colocated vLLM {u}", functools.partial(healthy, u), o.start_timeout,
                           fleet, interval_s=1.0,
                           progress=lambda s: f"waiting for the colocated engines ({s:.0f} s)")
            result.engines_ready_s = time.monotonic() - t0
            cfg = deep_merge(lab_config(o.model_dir), {
                "backend": "external",
                "pools": {"prefill": {"size": 0, "urls": []},
                          "decode": {"size": 2, "urls": urls}}})
            cfg.pop("vllm")
            ctl = controller(fleet, o, cfg, name)
            wait_pools(ctl, {"decode": 2}, fleet, 120)
        else:
            cfg = deep_merge(lab_config(o.model_dir), {
                "backend": "sim", "sim": {"time_scale": 1.0, "startup_delay_s": 0.5}})
            cfg.pop("vllm")
            ctl = controller(fleet, o, cfg, name)
            result.engines_ready_s = wait_pools(ctl, {"prefill": 1, "decode": 1}, fleet, 120)
        ours = fleet.pids()
        log(f"{name}: ready after {time.monotonic() - t_setup:.0f} s; warming up")
        try:
            warm_up(ctl.url)
        except httpx.HTTPError as exc:
            raise FleetError(f"warm-up request failed: {exc}; see {o.work}/{name}-*.log"
                             ) from None
        # Idle CPU with the engines up: NIXL's UCX progress threads busy-poll (system time).
        m0, p0 = cpu.machine(), cpu.pids_seconds(ours)
        time.sleep(o.idle_probe)
        result.idle_cpu = cpu.machine().since(m0).shares()
        result.idle_cpu["our_cores_busy"] = (cpu.pids_seconds(ours) - p0) / o.idle_probe
        result.idle_cpu["load_avg_1m"] = os.getloadavg()[0]
        for profile, streams, n, secs in (
                ("synchronous", 1, o.sync_requests, o.sync_seconds),
                ("concurrent", o.streams, o.conc_requests, o.conc_seconds)):
            out = o.work / f"guidellm-{name}-{profile}.json"
            out.unlink(missing_ok=True)
            argv = guidellm_argv(ctl.url, o.model_dir.resolve(), data[profile], profile,
                                 streams, n, secs, out)
            m0, p0 = cpu.machine(), cpu.pids_seconds(ours)
            run_guidellm(fleet, f"guidellm-{name}-{profile}", argv,
                         o.work / f"guidellm-{name}.log", secs + 240)
            s = summarize(out, data[profile], threshold)
            s.cpu = cpu.machine().since(m0).shares()
            s.cpu["our_cores_busy"] = (cpu.pids_seconds(ours) - p0) / s.duration_s
            s.cpu["load_avg_1m"] = os.getloadavg()[0]
            s.guidellm_cmd = shlex.join(argv)
            s.router = router_parts(ctl, n)
            if name != "colocated":
                s.tail = request_rows(ctl, n, o.work / f"requests-{name}-{profile}.json")
                s.lease = lease_counters(ctl)
            result.profiles[profile] = s
            log(f"{name} {profile}: {s.requests_ok} ok in {s.duration_s:.0f} s, "
                f"TTFT p50 {s.ttft_p50_ms:.0f} ms p99 {s.ttft_p99_ms:.0f} ms, "
                f"ITL p50 {s.itl_p50_ms:.1f} ms p99 {s.itl_p99_ms:.1f} ms")
    finally:
        stopped = fleet.stop(first=tuple(n for n in fleet.procs if n.endswith("controller")))
        if stopped.left:
            log(f"{name}: WARNING, still running after stop: {stopped.left}")
        result.leftover_processes = stopped.left
        result.setup_s = time.monotonic() - t_setup


# ---- report ------------------------------------------------------------------------------

METRICS = (("ttft_p50_ms", "TTFT p50 ms"), ("ttft_p99_ms", "TTFT p99 ms"),
           ("itl_p50_ms", "ITL p50 ms"), ("itl_p99_ms", "ITL p99 ms"),
           ("req_per_s", "req/s"), ("output_tok_per_s", "out tok/s"),
           ("ttft_p50_long_ms", "TTFT p50 long"), ("ttft_p50_short_ms", "TTFT p50 short"))


def fmt(x: float | None) -> str:
    if x is None or x != x:
        return "-"
    return f"{x:.2f}" if abs(x) < 10 else f"{x:.1f}" if abs(x) < 1000 else f"{x:.0f}"


def fmt_ratio(a: float | None, b: float | None) -> str:
    r = ratio(a, b)
    return "-" if r != r else f"{r:.2f}"


def table(res: LabResult) -> str:
    lines = []
    for profile in PROFILES:
        got = {s: (res.setups[s].profiles.get(profile) if s in res.setups else None)
               for s in SETUPS}
        lines.append(f"\n{profile}" + (f" ({res.options.streams} streams)"
                                        if profile == "concurrent" else ""))
        lines.append(f"  {'metric':<16}{'disagg':>10}{'colocated':>11}{'sim':>10}"
                     f"{'disagg/colo':>13}{'sim/real':>10}{'sim err %':>11}")
        for key, label in METRICS:
            v: dict[str, float | None] = {
                s: (getattr(g, key) if g is not None else None) for s, g in got.items()}
            e = ratio(v["sim"], v["disagg"])
            err = "-" if e != e else f"{100 * (e - 1):+.0f}"
            lines.append(f"  {label:<16}{fmt(v['disagg']):>10}{fmt(v['colocated']):>11}"
                         f"{fmt(v['sim']):>10}{fmt_ratio(v['disagg'], v['colocated']):>13}"
                         f"{fmt_ratio(v['sim'], v['disagg']):>10}{err:>11}")
        for s in SETUPS:
            g = got[s]
            if g is None:
                continue
            parts = "; ".join(f"{path}: " + " ".join(
                f"{k.removesuffix('_ms')} {v:.0f}" for k, v in d.items() if k != "n")
                + f" (n={d['n']:.0f})" for path, d in g.router.items())
            lines.append(f"  {s:<10} {g.requests_ok} ok, {g.requests_errored} errors, "
                         f"{g.n_long} long / {g.n_short} short; CPU "
                         f"{g.cpu.get('user_pct', 0):.0f}% user "
                         f"{g.cpu.get('system_pct', 0):.0f}% sys "
                         f"{g.cpu.get('idle_pct', 0):.0f}% idle, "
                         f"load {g.cpu.get('load_avg_1m', 0):.1f}, "
                         f"our processes {g.cpu.get('our_cores_busy', 0):.2f} cores; "
                         f"router medians ms: {parts}")
            if g.lease is not None:
                lines.append(f"  {'':<10} prefill KV lease counters after this profile "
                             f"(cumulative): expired {g.lease['expired']:g}, read after "
                             f"expiry {g.lease['after_expiry']:g}")
            for r in g.tail:
                lines.append(f"  {'':<10} slow: {r['path']} {r['prompt_tokens']} tok, TTFT "
                             f"{r['ttft_ms']:.0f} = queue {r['queue_ms']:.0f} + prefill "
                             f"{r['prefill_ms']:.0f} + transfer {r['transfer_ms']:.0f} + "
                             f"decode_sched {r['decode_sched_ms']:.0f} + overhead "
                             f"{r['overhead_ms']:.0f} ms, retries {r['retries']} ({r['id']})")
    idle = [f"{s}: {res.setups[s].idle_cpu['system_pct']:.0f}% sys, "
            f"{res.setups[s].idle_cpu['idle_pct']:.0f}% idle, our processes "
            f"{res.setups[s].idle_cpu['our_cores_busy']:.2f} cores busy"
            for s in SETUPS if s in res.setups and "system_pct" in res.setups[s].idle_cpu]
    if idle:
        lines.append("\nidle, engines up, no traffic: " + "; ".join(idle))
    failed = [f"{s}: {r.error}" for s, r in res.setups.items() if r.error]
    if failed:
        lines.append("\nFAILED setups: " + "; ".join(failed))
    taken = [f"{s} from {r.taken_from}" for s, r in res.setups.items() if r.taken_from]
    if taken:
        lines.append("\nnot run now: " + ", ".join(taken))
    return "\n".join(lines)


def report(res: LabResult) -> str:
    out = [table(res).lstrip("\n")]
    if res.calibration:
        out.append("\ncpu-lab constants that reproduce the real P/D synchronous ITL p50 and "
                   "prefill median (pdctl_api/profiles.py): " + ", ".join(
                       f"{k} {v:.3g}" for k, v in res.calibration.items()))
    out.append(f"\ntotal {res.total_s / 60:.1f} min; guidellm outputs and logs in "
               f"{res.options.work}")
    return "\n".join(out)


def suggest_calibration(res: LabResult, data: Path) -> dict[str, float] | None:
    """cpu-lab constants that make the simulator reproduce the real P/D lab's synchronous
    medians: ``mem_bandwidth`` from the decode ITL (a one-sequence decode step is memory-bound
    in the model), ``peak_flops`` from the prefill engine's time on the long prompts (compute-
    bound). Effective figures: they absorb vLLM's per-step CPU overhead, which the roofline's
    fixed 0.5 ms does not cover, and the sim's token estimate (UTF-8 bytes / 4)."""
    from controller.tokens import estimate_tokens
    from pdctl_api import profiles

    real = res.setups["disagg"].profiles.get("synchronous") if "disagg" in res.setups else None
    if real is None:
        return None
    itl_s = real.itl_p50_ms / 1e3
    prefill_ms = real.router.get("disaggregated", {}).get("prefill_ms")
    m, hw = profiles.model("lab-tiny"), profiles.hardware("cpu-lab")
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    long_rows = [r for r in rows if r["prompt_tokens_count"] >= res.threshold]
    n_est = int(stats.median(estimate_tokens(r["prompt"]) for r in long_rows))
    ctx = n_est + res.options.output_tokens // 2

    def solve(f: Callable[[float], float], target: float, lo: float, hi: float) -> float:
        for _ in range(100):  # bisection on a log scale; f decreases with its argument
            mid = (lo * hi) ** 0.5
            lo, hi = (mid, hi) if f(mid) > target else (lo, mid)
        return (lo * hi) ** 0.5

    out: dict[str, float] = {
        "sim_tokens_of_median_long_prompt": n_est,
        "lab_tokens_of_median_long_prompt": stats.median(
            r["prompt_tokens_count"] for r in long_rows)}
    out["mem_bandwidth"] = solve(
        lambda bw: profiles.decode_step_seconds(
            m, dataclasses.replace(hw, mem_bandwidth=bw), 1, [ctx]), itl_s, 1e6, 1e13)
    if prefill_ms:
        hw2 = dataclasses.replace(hw, mem_bandwidth=out["mem_bandwidth"])
        out["peak_flops"] = solve(
            lambda pf: profiles.step_seconds(
                m, dataclasses.replace(hw2, peak_flops=pf), 1, n_est, 0, []),
            prefill_ms / 1e3, 1e6, 1e15)
    return out


# ---- entry points ----------------------------------------------------------------------

def run_lab(o: Options) -> LabResult:
    """Every setup of ``o``, one after the other; a failed setup is recorded, not raised."""
    if not GUIDELLM.exists():
        raise FleetError(f"{GUIDELLM} is missing. Create guidellm's venv with the CPU torch:\n"
                         "  python3.11 -m venv .bench/venv-guidellm\n"
                         "  .bench/venv-guidellm/bin/pip install torch==2.13.0 guidellm==0.8.1\n"
                         "(plain `pip install guidellm` pulls a multi-GB CUDA torch)")
    if not (o.model_dir / "tokenizer.json").is_file():
        log(f"no lab model in {o.model_dir}; writing it (pdctl make-model)")
        from controller.cli.make_model import make_model
        make_model(o.model_dir)
    settings = load_settings(None, **lab_config(o.model_dir))
    threshold = settings.routing.disagg_min_prompt_tokens
    max_len = settings.model_profile.max_model_len
    short = (max(8, threshold // 8), threshold // 2)
    long = (2 * threshold, min(8 * threshold, max_len - o.output_tokens - 64))
    o.work.mkdir(parents=True, exist_ok=True)
    data: dict[str, Path] = {}
    lengths: dict[str, dict[str, dict[str, float]]] = {}
    for i, (profile, n) in enumerate((("synchronous", o.sync_requests),
                                      ("concurrent", o.conc_requests))):
        data[profile] = o.work / f"mixed-{profile}.jsonl"
        rows = 2 * (n // 2) + 2 * o.streams + 8
        lengths[profile] = write_data(data[profile], o.model_dir, rows, short, long,
                                      o.output_tokens, seed=7 + i, tag=profile[0])
        log(f"workload {profile}: {data[profile]} ({rows} rows; threshold {threshold}, "
            f"max_model_len {max_len}): {lengths[profile]}, {o.output_tokens} output "
            "tokens each")
    res = LabResult(o, time.strftime("%Y-%m-%d %H:%M:%S"), threshold, max_len, lengths,
                    {k: str(v) for k, v in data.items()}, os.cpu_count(), os.getloadavg()[0])
    if o.real_from is not None:
        earlier = json.loads(o.real_from.read_text()).get("setups", {})
        for name in SETUPS:
            if name not in o.setups and name in earlier:
                res.setups[name] = SetupResult.from_json(earlier[name], str(o.real_from))
    t0 = time.monotonic()
    try:
        for name in o.setups:
            log(f"== {name} ==")
            res.setups[name] = SetupResult()
            try:
                run_setup(name, o, data, threshold, res.setups[name])
            except (FleetError, httpx.HTTPError) as exc:
                log(f"{name} FAILED: {exc}")
                res.setups[name].error = str(exc)
    finally:
        res.total_s = time.monotonic() - t0
    res.calibration = suggest_calibration(res, data["synchronous"])
    return res


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--quick", action="store_true",
                    help="fewer requests and shorter caps (about half the time)")
    ap.add_argument("--only", choices=SETUPS, action="append",
                    help="run only this setup (repeatable); default: all three")
    ap.add_argument("--model-dir", type=Path, default=ROOT / "lab-model")
    ap.add_argument("--streams", type=int, default=4, help="concurrent profile's streams")
    ap.add_argument("--sync-requests", type=int, default=None, help="default 40 (quick 12)")
    ap.add_argument("--sync-seconds", type=float, default=None,
                    help="cap of the synchronous run, default 120 (quick 45)")
    ap.add_argument("--conc-requests", type=int, default=None, help="default 80 (quick 24)")
    ap.add_argument("--conc-seconds", type=float, default=None,
                    help="cap of the concurrent run, default 120 (quick 45)")
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--pdctl-root", "--src", dest="pdctl_root", type=Path, default=None,
                    help="source tree the controllers run from (default: this checkout); e.g. "
                         "a `git worktree` or `git archive HEAD | tar -x -C DIR` to pin the "
                         "code")
    ap.add_argument("--real-from", type=Path, default=None,
                    help="take the setups not run now from this earlier --json result (e.g. "
                         "`--only sim --real-from bench-results/lab.json` after a calibration)")
    ap.add_argument("--start-timeout", type=float, default=420,
                    help="seconds allowed for vLLM engines to become ready")
    ap.add_argument("--idle-probe", type=float, default=5.0,
                    help="seconds of idle CPU sampling with the engines up")


def options_from(args: argparse.Namespace, json_path: Path) -> Options:
    o = Options.defaults(args.quick)
    o.setups = tuple(args.only or SETUPS)
    o.work = json_path.resolve().parent / "lab-work"
    o.model_dir = args.model_dir.resolve()
    o.streams, o.output_tokens = args.streams, args.output_tokens
    for name in ("sync_requests", "sync_seconds", "conc_requests", "conc_seconds"):
        if getattr(args, name) is not None:
            setattr(o, name, getattr(args, name))
    o.pdctl_root = args.pdctl_root.resolve() if args.pdctl_root else None
    o.real_from = args.real_from
    o.start_timeout, o.idle_probe = args.start_timeout, args.idle_probe
    return o


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.lab",
                                 description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    add_arguments(ap)
    ap.add_argument("--json", type=Path, default=ROOT / "bench-results" / "lab.json")
    args = ap.parse_args(argv)
    try:
        with interrupt_on_signals():
            res = run_lab(options_from(args, args.json))
    except FleetError as exc:
        print(f"bench.lab: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        log("interrupted; every process started here has been stopped")
        return 130
    print(report(res))
    write_json(args.json, res)
    print(f"results: {args.json}")
    return 1 if any(s.error for s in res.setups.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
