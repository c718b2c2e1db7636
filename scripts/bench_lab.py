#!/usr/bin/env python3
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
percentiles come from guidellm's JSON output; throughput is successful requests and output
tokens over the benchmark's duration. Every process this script starts is in its own process
group and is stopped (SIGTERM, then SIGKILL of the group and any leftover descendant) when a
setup ends, on error and on Ctrl-C.

    .venv/bin/python scripts/bench_lab.py            # 10-18 min on 2 cores (each run is
                                                     # capped at 120 s; engines start in 1-2 min)
    .venv/bin/python scripts/bench_lab.py --quick    # 5-8 min
    .venv/bin/python scripts/bench_lab.py --only sim --real-from bench-results/lab.json \
        --json bench-results/lab-sim.json            # the sim again, against earlier real runs

Create the guidellm venv (CPU torch from the local wheel, not a CUDA one) with
    python3.11 -m venv .bench/venv-guidellm
    .bench/venv-guidellm/bin/pip install torch==2.13.0 guidellm==0.8.1
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from controller.config import deep_merge, load_settings  # noqa: E402
from controller.launchers.base import LaunchSpec  # noqa: E402
from controller.launchers.process import free_port, spawn, tail  # noqa: E402
from controller.launchers.vllm import VllmLauncher  # noqa: E402
from controller.models import Role  # noqa: E402
from controller.serve import cpu_lab_defaults  # noqa: E402

GUIDELLM = ROOT / ".bench" / "venv-guidellm" / "bin" / "guidellm"
SETUPS = ("disagg", "colocated", "sim")
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
WORDS = ("the model layer decode cache token batch prefill router engine memory core "
         "transfer stream block queue latency request kernel tensor value page attention "
         "weight shard link host agent thread").split()


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---- processes ---------------------------------------------------------------------------

class Procs:
    """Every process group this script starts; ``stop_all`` leaves none of them alive."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, argv: list[str], log_path: Path, env: dict[str, str] | None = None,
              cwd: Path | None = None) -> subprocess.Popen[bytes]:
        old = Path.cwd()
        if cwd is not None:
            os.chdir(cwd)
        try:  # start_new_session=True and PR_SET_PDEATHSIG
            proc = spawn(argv, log_path.resolve(), env)
        finally:
            os.chdir(old)
        self.procs.append(proc)
        return proc

    def stop_all(self, grace_s: float = 30.0) -> None:
        if not self.procs:
            return
        descendants: list[psutil.Process] = []
        for proc in self.procs:
            with contextlib.suppress(psutil.Error):
                descendants += psutil.Process(proc.pid).children(recursive=True)
        groups = {proc.pid for proc in self.procs}
        for d in descendants:  # the controller's engines run in process groups of their own
            with contextlib.suppress(psutil.Error, OSError):
                groups.add(os.getpgid(d.pid))
        # The controllers first: SIGTERM makes them stop their engines in order.
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and (
                any(p.poll() is None for p in self.procs)
                or any(_alive(d) for d in descendants)):
            time.sleep(0.2)
        for g in groups:
            if g != os.getpgid(0):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(g, signal.SIGKILL)
        for d in descendants:
            with contextlib.suppress(psutil.Error):
                d.kill()
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        self.procs.clear()


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def leftover_engines(ours: set[int]) -> list[str]:
    """Lines of ``ps`` for vLLM / EngineCore processes this script started (by pid)."""
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    rows = []
    for line in out.splitlines()[1:]:
        pid, _, cmd = line.strip().partition(" ")
        if pid.isdigit() and int(pid) in ours and ("vllm" in cmd or "EngineCore" in cmd):
            rows.append(line.strip()[:160])
    return rows


def all_descendants(procs: Procs) -> set[int]:
    pids: set[int] = set()
    for proc in procs.procs:
        pids.add(proc.pid)
        with contextlib.suppress(psutil.Error):
            pids |= {c.pid for c in psutil.Process(proc.pid).children(recursive=True)}
    return pids


# ---- CPU accounting (for the explanation: NIXL's progress threads) -----------------------

def cpu_times() -> tuple[float, float, float]:
    """(user+nice, system, idle+iowait) seconds of the whole machine."""
    f = [float(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    return (f[0] + f[1]) / hz, (f[2] + f[5] + f[6]) / hz, (f[3] + f[4]) / hz


def cpu_share(before: tuple[float, float, float], after: tuple[float, float, float]
              ) -> dict[str, float]:
    d = [a - b for a, b in zip(after, before, strict=True)]
    total = sum(d) or 1.0
    return {"user_pct": 100 * d[0] / total, "system_pct": 100 * d[1] / total,
            "idle_pct": 100 * d[2] / total}


def proc_cpu_seconds(pids: set[int]) -> float:
    s = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            t = psutil.Process(pid).cpu_times()
            s += t.user + t.system
    return s


# ---- workload ----------------------------------------------------------------------------

def write_data(path: Path, model_dir: Path, rows: int, short: tuple[int, int],
               long: tuple[int, int], output_tokens: int, seed: int, tag: str
               ) -> dict[str, Any]:
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
    counts = {"short": [], "long": []}
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
    return {k: {"n": len(v), "min": min(v), "median": statistics.median(v), "max": max(v)}
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


def run_guidellm(argv: list[str], log_path: Path, procs: Procs, timeout_s: float) -> None:
    env = {**os.environ, **OFFLINE}
    env.pop("VIRTUAL_ENV", None)
    log(f"  $ {shlex.join(argv)}")
    with open(log_path, "ab") as f:
        p = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=env,
                             stdin=subprocess.DEVNULL, start_new_session=True)
        procs.procs.append(p)
        try:
            p.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"guidellm ran past {timeout_s:.0f} s; see {log_path}") from None
        finally:  # also on Ctrl-C / SIGTERM: guidellm and its worker processes go too
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            procs.procs.remove(p)
    if p.returncode != 0:
        raise RuntimeError(f"guidellm exited {p.returncode}; tail of {log_path}:\n"
                           f"{tail(log_path, 20)}")


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    k = (len(s) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summarize(out: Path, data: Path, threshold: int) -> dict[str, Any]:
    """TTFT / ITL percentiles from guidellm's own metrics; throughput over its duration;
    TTFT medians of the long and short prompts from its per-request records."""
    bench = json.loads(out.read_text())["benchmarks"][0]
    m = bench["metrics"]

    def p(name: str, q: str) -> float:
        return float(m[name]["successful"]["percentiles"][q])

    reqs = bench["requests"]["successful"]
    dur = float(bench["duration"]) or 1.0
    out_tokens = sum(r.get("output_metrics", {}).get("text_tokens") or 0 for r in reqs)
    by_len: dict[str, list[float]] = {"long": [], "short": []}
    lengths = {}
    with open(data) as f:
        for line in f:
            row = json.loads(line)
            lengths[row["prompt"]] = row["prompt_tokens_count"]
    for r in reqs:
        n = None
        t = r["info"]["timings"]
        first = t.get("first_token_iteration")
        if first is None or t.get("request_start") is None:
            continue
        # The prompt's length in lab-tokenizer tokens, from the data file (the sim's usage
        # counts UTF-8 bytes / 4, not tokens).
        with contextlib.suppress(ValueError, KeyError, TypeError):
            n = lengths[json.loads(r["request_args"])["body"]["prompt"]]
        if n is None:
            n = r.get("input_metrics", {}).get("text_tokens") or 0
        by_len["long" if n >= threshold else "short"].append(
            1e3 * (first - t["request_start"]))
    return {
        "requests_ok": len(reqs),
        "requests_errored": int(m["request_totals"]["errored"]),
        "duration_s": dur,
        "ttft_p50_ms": p("time_to_first_token_ms", "p50"),
        "ttft_p99_ms": p("time_to_first_token_ms", "p99"),
        "itl_p50_ms": p("inter_token_latency_ms", "p50"),
        "itl_p99_ms": p("inter_token_latency_ms", "p99"),
        "req_per_s": len(reqs) / dur,
        "output_tok_per_s": out_tokens / dur,
        "ttft_p50_long_ms": pct(by_len["long"], 0.5),
        "ttft_p50_short_ms": pct(by_len["short"], 0.5),
        "n_long": len(by_len["long"]),
        "n_short": len(by_len["short"]),
    }


# ---- setups ------------------------------------------------------------------------------

def wait_ready(url: str, procs: Procs, timeout_s: float, what: str,
               path: str = "/v1/models") -> float:
    t0 = time.monotonic()
    last = 0.0
    while time.monotonic() - t0 < timeout_s:
        for proc in procs.procs:
            if proc.poll() is not None:
                raise RuntimeError(f"{what}: process {proc.pid} exited {proc.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + path, timeout=5).status_code == 200:
                return time.monotonic() - t0
        if time.monotonic() - last > 20:
            log(f"  waiting for {what} ({time.monotonic() - t0:.0f} s)")
            last = time.monotonic()
        time.sleep(1.0)
    raise RuntimeError(f"{what} not ready after {timeout_s:.0f} s")


def wait_pools(base: str, token: str, want: dict[str, int], procs: Procs, timeout_s: float
               ) -> float:
    """Until the controller reports ``want`` ready instances per role."""
    t0 = time.monotonic()
    last = 0.0
    api = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=10)
    while time.monotonic() - t0 < timeout_s:
        for proc in procs.procs:
            if proc.poll() is not None:
                raise RuntimeError(f"controller exited {proc.returncode}")
        with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
            inst = api.get("/api/v1/instances").json()
            ready = {r: sum(1 for i in inst if i["role"] == r and i["state"] == "ready")
                     for r in want}
            if all(ready[r] >= n for r, n in want.items()):
                return time.monotonic() - t0
            if time.monotonic() - last > 20:
                states = ", ".join(f"{i['id']} {i['state']}" for i in inst)
                log(f"  engines starting ({time.monotonic() - t0:.0f} s): {states}")
                last = time.monotonic()
        time.sleep(1.0)
    raise RuntimeError(f"engines not ready after {timeout_s:.0f} s")


def start_controller(procs: Procs, cfg: dict[str, Any], work: Path, name: str, src: Path
                     ) -> tuple[str, str]:
    port = free_port()
    state = work / f"state-{name}"
    shutil.rmtree(state, ignore_errors=True)  # no desired state left from an earlier run
    cfg = deep_merge(cfg, {"controller": {"port": port, "state_dir": str(state)},
                           "prometheus": {"enabled": False}})
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    load_settings(path)  # refuse a bad config here, before anything starts
    # The controller (and the sim engines it starts) run from ``src``: a pinned copy of the
    # code keeps a benchmark apart from edits in progress in a shared working tree.
    env = {**OFFLINE, "PYTHONPATH": str(src)}
    procs.start([sys.executable, "-m", "controller.cli", "controller", "--config", str(path)],
                work / f"{name}-controller.log", env, cwd=src)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while not (state / "token").is_file():
        if time.monotonic() > deadline or procs.procs[-1].poll() is not None:
            raise RuntimeError(f"{name} controller did not start; see {work}/{name}-controller.log")
        time.sleep(0.3)
    wait_ready(base, procs, 60, f"{name} controller", path="/metrics")
    return base, (state / "token").read_text().strip()


def lab_config(model_dir: Path) -> dict[str, Any]:
    cfg = cpu_lab_defaults(model_dir.resolve())
    cfg["backend"] = "vllm"
    return cfg


def start_colocated_engines(procs: Procs, model_dir: Path, work: Path) -> list[str]:
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
        procs.start(argv, spec.log_path, env)
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


def router_parts(base: str, token: str, limit: int) -> dict[str, Any]:
    """Medians of the controller's TTFT accounting per path, over the last ``limit`` requests."""
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"},
                      timeout=30) as c:
        rows = c.get("/api/v1/requests", params={"limit": limit}).json()
    out: dict[str, Any] = {}
    for path in ("disaggregated", "colocated"):
        sel = [r for r in rows if r.get("path") == path and r.get("status") == "ok"]
        if not sel:
            continue
        out[path] = {"n": len(sel)}
        for k in ("queue_ms", "prefill_ms", "transfer_ms", "decode_sched_ms", "ttft_ms"):
            vals = [r[k] for r in sel if isinstance(r.get(k), (int, float))]
            if vals:
                out[path][k] = statistics.median(vals)
    return out


def lease_counters(base: str, token: str) -> dict[str, float]:
    """The prefill engines' KV lease counters (cumulative since they started)."""
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"},
                      timeout=30) as c:
        urls = [i["url"] for i in c.get("/api/v1/instances").json()
                if i["role"] == "prefill" and i["state"] == "ready"]
    out = {"expired": 0.0, "after_expiry": 0.0}
    for url in urls:
        for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
            for key, name in (("expired", "vllm:nixl_num_kv_expired_reqs_total"),
                              ("after_expiry", "vllm:nixl_num_notifications_after_expiry_total")):
                if line.startswith(name):
                    out[key] += float(line.rsplit(" ", 1)[1])
    return out


TAIL_KEYS = ("id", "path", "status", "prompt_tokens", "ttft_ms", "queue_ms", "prefill_ms",
             "transfer_ms", "decode_sched_ms", "overhead_ms", "e2e_ms", "retries")


def request_rows(base: str, token: str, limit: int, dump: Path) -> list[dict[str, Any]]:
    """The controller's last ``limit`` request records, also written to ``dump``; the three
    slowest to first token, with their TTFT parts (the tail's evidence)."""
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"},
                      timeout=30) as c:
        rows = c.get("/api/v1/requests", params={"limit": limit}).json()
    dump.write_text(json.dumps(rows, indent=1))
    slow = sorted((r for r in rows if r.get("status") == "ok"), key=lambda r: -r["ttft_ms"])
    return [{k: r.get(k) for k in TAIL_KEYS} for r in slow[:3]]


def run_setup(name: str, args: argparse.Namespace, work: Path, data: dict[str, Path],
              result: dict[str, Any]) -> None:
    procs = Procs()
    ours: set[int] = set()
    t_setup = time.monotonic()
    try:
        if name == "disagg":
            base, token = start_controller(procs, lab_config(args.model_dir), work, name,
                                           args.src)
            result["engines_ready_s"] = wait_pools(base, token, {"prefill": 1, "decode": 1},
                                                   procs, args.start_timeout)
        elif name == "colocated":
            urls = start_colocated_engines(procs, args.model_dir, work)
            t0 = time.monotonic()
            for u in urls:
                wait_ready(u, procs, args.start_timeout, f"colocated vLLM {u}", path="/health")
            result["engines_ready_s"] = time.monotonic() - t0
            cfg = deep_merge(lab_config(args.model_dir), {
                "backend": "external",
                "pools": {"prefill": {"size": 0, "urls": []},
                          "decode": {"size": 2, "urls": urls}}})
            cfg.pop("vllm")
            base, token = start_controller(procs, cfg, work, name, args.src)
            wait_pools(base, token, {"decode": 2}, procs, 120)
        else:
            cfg = deep_merge(lab_config(args.model_dir), {
                "backend": "sim", "sim": {"time_scale": 1.0, "startup_delay_s": 0.5}})
            cfg.pop("vllm")
            base, token = start_controller(procs, cfg, work, name, args.src)
            result["engines_ready_s"] = wait_pools(base, token, {"prefill": 1, "decode": 1},
                                                   procs, 120)
        ours = all_descendants(procs)
        log(f"{name}: ready after {time.monotonic() - t_setup:.0f} s; warming up")
        try:
            warm_up(base)
        except httpx.HTTPError as exc:
            raise RuntimeError(f"warm-up request failed: {exc}; see {work}/{name}-*.log") from None
        # Idle CPU with the engines up: NIXL's UCX progress threads busy-poll (system time).
        c0, p0 = cpu_times(), proc_cpu_seconds(ours)
        time.sleep(args.idle_probe)
        result["idle_cpu"] = cpu_share(c0, cpu_times())
        result["idle_cpu"]["our_cores_busy"] = (proc_cpu_seconds(ours) - p0) / args.idle_probe
        result["idle_cpu"]["load_avg_1m"] = os.getloadavg()[0]
        for profile, streams, n, secs in (
                ("synchronous", 1, args.sync_requests, args.sync_seconds),
                ("concurrent", args.streams, args.conc_requests, args.conc_seconds)):
            out = work / f"guidellm-{name}-{profile}.json"
            out.unlink(missing_ok=True)
            argv = guidellm_argv(base, args.model_dir.resolve(), data[profile], profile,
                                 streams, n, secs, out)
            c0, p0 = cpu_times(), proc_cpu_seconds(ours)
            run_guidellm(argv, work / f"guidellm-{name}.log", procs, secs + 240)
            s = summarize(out, data[profile], args.threshold)
            s["cpu"] = cpu_share(c0, cpu_times())
            s["cpu"]["our_cores_busy"] = (proc_cpu_seconds(ours) - p0) / s["duration_s"]
            s["cpu"]["load_avg_1m"] = os.getloadavg()[0]
            s["guidellm_cmd"] = shlex.join(argv)
            s["router"] = router_parts(base, token, n)
            if name != "colocated":
                s["tail"] = request_rows(base, token, n,
                                         work / f"requests-{name}-{profile}.json")
                s["lease"] = lease_counters(base, token)
            result[profile] = s
            log(f"{name} {profile}: {s['requests_ok']} ok in {s['duration_s']:.0f} s, "
                f"TTFT p50 {s['ttft_p50_ms']:.0f} ms p99 {s['ttft_p99_ms']:.0f} ms, "
                f"ITL p50 {s['itl_p50_ms']:.1f} ms p99 {s['itl_p99_ms']:.1f} ms")
    finally:
        ours |= all_descendants(procs)
        procs.stop_all()
        left = leftover_engines(ours)
        if left:
            log(f"{name}: WARNING, still running after stop: {left}")
        result["leftover_processes"] = left
        result["setup_s"] = time.monotonic() - t_setup


# ---- report ------------------------------------------------------------------------------

METRICS = (("ttft_p50_ms", "TTFT p50 ms"), ("ttft_p99_ms", "TTFT p99 ms"),
           ("itl_p50_ms", "ITL p50 ms"), ("itl_p99_ms", "ITL p99 ms"),
           ("req_per_s", "req/s"), ("output_tok_per_s", "out tok/s"),
           ("ttft_p50_long_ms", "TTFT p50 long"), ("ttft_p50_short_ms", "TTFT p50 short"))


def fmt(x: Any) -> str:
    if not isinstance(x, (int, float)) or x != x:
        return "-"
    return f"{x:.2f}" if abs(x) < 10 else f"{x:.1f}" if abs(x) < 1000 else f"{x:.0f}"


def ratio(a: Any, b: Any) -> str:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b and a == a and b == b:
        return f"{a / b:.2f}"
    return "-"


def table(res: dict[str, Any]) -> str:
    lines = []
    for profile in ("synchronous", "concurrent"):
        got = {s: res.get(s, {}).get(profile) for s in SETUPS}
        lines.append(f"\n{profile}" + (f" ({res['streams']} streams)"
                                        if profile == "concurrent" else ""))
        lines.append(f"  {'metric':<16}{'disagg':>10}{'colocated':>11}{'sim':>10}"
                     f"{'disagg/colo':>13}{'sim/real':>10}{'sim err %':>11}")
        for key, label in METRICS:
            v = {s: (got[s] or {}).get(key) for s in SETUPS}
            err = "-"
            if isinstance(v["sim"], float) and isinstance(v["disagg"], float) and v["disagg"]:
                err = f"{100 * (v['sim'] - v['disagg']) / v['disagg']:+.0f}"
            lines.append(f"  {label:<16}{fmt(v['disagg']):>10}{fmt(v['colocated']):>11}"
                         f"{fmt(v['sim']):>10}{ratio(v['disagg'], v['colocated']):>13}"
                         f"{ratio(v['sim'], v['disagg']):>10}{err:>11}")
        for s in SETUPS:
            g = got[s]
            if not g:
                continue
            parts = "; ".join(f"{path}: " + " ".join(
                f"{k.removesuffix('_ms')} {v:.0f}" for k, v in d.items() if k != "n")
                + f" (n={d['n']})" for path, d in g.get("router", {}).items())
            lines.append(f"  {s:<10} {g['requests_ok']} ok, {g['requests_errored']} errors, "
                         f"{g['n_long']} long / {g['n_short']} short; CPU "
                         f"{g['cpu']['user_pct']:.0f}% user {g['cpu']['system_pct']:.0f}% sys "
                         f"{g['cpu']['idle_pct']:.0f}% idle, "
                         f"load {g['cpu'].get('load_avg_1m', 0):.1f}, "
                         f"our processes {g['cpu']['our_cores_busy']:.2f} cores; "
                         f"router medians ms: {parts}")
            if "lease" in g:
                lines.append(f"  {'':<10} prefill KV lease counters after this profile "
                             f"(cumulative): expired {g['lease']['expired']:g}, read after "
                             f"expiry {g['lease']['after_expiry']:g}")
            for r in g.get("tail", []):
                lines.append(f"  {'':<10} slow: {r['path']} {r['prompt_tokens']} tok, TTFT "
                             f"{r['ttft_ms']:.0f} = queue {r['queue_ms']:.0f} + prefill "
                             f"{r['prefill_ms']:.0f} + transfer {r['transfer_ms']:.0f} + "
                             f"decode_sched {r['decode_sched_ms']:.0f} + overhead "
                             f"{r['overhead_ms']:.0f} ms, retries {r['retries']} ({r['id']})")
    idle = [f"{s}: {res[s]['idle_cpu']['system_pct']:.0f}% sys, "
            f"{res[s]['idle_cpu']['idle_pct']:.0f}% idle, our processes "
            f"{res[s]['idle_cpu']['our_cores_busy']:.2f} cores busy"
            for s in SETUPS if "idle_cpu" in res.get(s, {})]
    if idle:
        lines.append("\nidle, engines up, no traffic: " + "; ".join(idle))
    return "\n".join(lines)


def suggest_calibration(res: dict[str, Any], data: Path) -> dict[str, Any] | None:
    """cpu-lab constants that make the simulator reproduce the real P/D lab's synchronous
    medians: ``mem_bandwidth`` from the decode ITL (a one-sequence decode step is memory-bound
    in the model), ``peak_flops`` from the prefill engine's time on the long prompts (compute-
    bound). Effective figures: they absorb vLLM's per-step CPU overhead, which the roofline's
    fixed 0.5 ms does not cover, and the sim's token estimate (UTF-8 bytes / 4)."""
    import dataclasses

    from controller import profiles
    from controller.tokens import estimate_tokens

    real = res.get("disagg", {}).get("synchronous")
    if not real:
        return None
    itl_s = real["itl_p50_ms"] / 1e3
    prefill_ms = real.get("router", {}).get("disaggregated", {}).get("prefill_ms")
    m, hw = profiles.model("lab-tiny"), profiles.hardware("cpu-lab")
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    long_rows = [r for r in rows if r["prompt_tokens_count"] >= res["threshold"]]
    n_est = int(statistics.median(estimate_tokens(r["prompt"]) for r in long_rows))
    ctx = n_est + res["output_tokens"] // 2

    def solve(f: Any, target: float, lo: float, hi: float) -> float:
        for _ in range(100):  # bisection on a log scale; f decreases with its argument
            mid = (lo * hi) ** 0.5
            lo, hi = (mid, hi) if f(mid) > target else (lo, mid)
        return (lo * hi) ** 0.5

    out: dict[str, Any] = {"sim_tokens_of_median_long_prompt": n_est,
                           "lab_tokens_of_median_long_prompt": statistics.median(
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--quick", action="store_true",
                    help="fewer requests and shorter caps (about half the time)")
    ap.add_argument("--only", choices=SETUPS, action="append",
                    help="run only this setup (repeatable); default: all three")
    ap.add_argument("--json", type=Path, default=ROOT / "bench-results" / "lab.json")
    ap.add_argument("--model-dir", type=Path, default=ROOT / "lab-model")
    ap.add_argument("--streams", type=int, default=4, help="concurrent profile's streams")
    ap.add_argument("--sync-requests", type=int, default=None, help="default 40 (quick 12)")
    ap.add_argument("--sync-seconds", type=float, default=None,
                    help="cap of the synchronous run, default 120 (quick 45)")
    ap.add_argument("--conc-requests", type=int, default=None, help="default 80 (quick 24)")
    ap.add_argument("--conc-seconds", type=float, default=None,
                    help="cap of the concurrent run, default 120 (quick 45)")
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--src", type=Path, default=ROOT,
                    help="source tree the controllers run from (default: this checkout); e.g. "
                         "`git archive HEAD | tar -x -C DIR` to pin the code")
    ap.add_argument("--real-from", type=Path, default=None,
                    help="take the setups not run now from this earlier --json result (e.g. "
                         "`--only sim --real-from bench-results/lab.json` after a calibration)")
    ap.add_argument("--start-timeout", type=float, default=420,
                    help="seconds allowed for vLLM engines to become ready")
    ap.add_argument("--idle-probe", type=float, default=5.0,
                    help="seconds of idle CPU sampling with the engines up")
    args = ap.parse_args()
    q = args.quick
    args.json, args.model_dir, args.src = (args.json.resolve(), args.model_dir.resolve(),
                                           args.src.resolve())
    args.sync_requests = args.sync_requests or (12 if q else 40)
    args.sync_seconds = args.sync_seconds or (45 if q else 120)
    args.conc_requests = args.conc_requests or (24 if q else 80)
    args.conc_seconds = args.conc_seconds or (45 if q else 120)
    setups = args.only or list(SETUPS)

    if not GUIDELLM.exists():
        print(f"bench_lab: {GUIDELLM} is missing. Create guidellm's venv with the CPU torch:\n"
              "  python3.11 -m venv .bench/venv-guidellm\n"
              "  .bench/venv-guidellm/bin/pip install torch==2.13.0 guidellm==0.8.1\n"
              "(plain `pip install guidellm` pulls a multi-GB CUDA torch)", file=sys.stderr)
        return 2
    if not (args.model_dir / "tokenizer.json").is_file():
        log(f"no lab model in {args.model_dir}; writing it (pdctl make-model)")
        from controller.make_model import make_model
        make_model(args.model_dir)
    settings = load_settings(None, **lab_config(args.model_dir))
    args.threshold = settings.routing.disagg_min_prompt_tokens
    max_len = settings.model_profile.max_model_len
    short = (max(8, args.threshold // 8), args.threshold // 2)
    long = (2 * args.threshold, min(8 * args.threshold, max_len - args.output_tokens - 64))

    work = args.json.parent / "lab-work"
    work.mkdir(parents=True, exist_ok=True)
    data, lengths = {}, {}
    for i, (profile, n) in enumerate((("synchronous", args.sync_requests),
                                      ("concurrent", args.conc_requests))):
        data[profile] = work / f"mixed-{profile}.jsonl"
        rows = 2 * (n // 2) + 2 * args.streams + 8
        lengths[profile] = write_data(data[profile], args.model_dir, rows, short, long,
                                      args.output_tokens, seed=7 + i, tag=profile[0])
        log(f"workload {profile}: {data[profile]} ({rows} rows; threshold {args.threshold}, "
            f"max_model_len {max_len}): {lengths[profile]}, {args.output_tokens} output "
            "tokens each")
    res: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S"), "threshold": args.threshold,
        "max_model_len": max_len, "streams": args.streams, "prompt_lengths": lengths,
        "output_tokens": args.output_tokens, "quick": q,
        "data": {k: str(v) for k, v in data.items()},
        "machine": {"cpus": os.cpu_count(), "load_avg_1m_at_start": os.getloadavg()[0]},
    }

    if args.real_from is not None:
        earlier = json.loads(args.real_from.read_text())
        for name in SETUPS:
            if name not in setups and name in earlier:
                res[name] = {**earlier[name], "from": str(args.real_from)}

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    t0 = time.monotonic()
    rc = 0
    try:
        for name in setups:
            log(f"== {name} ==")
            res[name] = {}
            try:
                run_setup(name, args, work, data, res[name])
            except RuntimeError as exc:
                log(f"{name} FAILED: {exc}")
                res[name]["error"] = str(exc)
                rc = 1
    except KeyboardInterrupt:
        log("interrupted; every process started here has been stopped")
        rc = 130
    finally:
        res["total_s"] = time.monotonic() - t0
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(res, indent=2))
    print(table(res))
    cal = suggest_calibration(res, data["synchronous"])
    if cal:
        res["calibration_suggestion"] = cal
        args.json.write_text(json.dumps(res, indent=2))
        print("\ncpu-lab constants that reproduce the real P/D synchronous ITL p50 and prefill "
              "median (controller/profiles.py): " + ", ".join(
                  f"{k} {v:.3g}" for k, v in cal.items()))
    print(f"\ntotal {res['total_s'] / 60:.1f} min; results {args.json}; guidellm outputs and "
          f"logs in {work}")
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
