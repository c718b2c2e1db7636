"""One policy replaying the trace slice on a cold simulated fleet: a fresh ``pdctl controller``
(backend sim, its eight engines in ``sim.processes`` host processes) with the policy on both
pools -- or, for vllm-router, the same kind of fleet with vllm-router 0.1.17 in front of its
engines -- then ``pdctl replay --text-prompts`` through the router, the engines' counters and
the router's CPU read around it, and everything stopped."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from bench import cpu, prom
from bench.fleet import ControllerProc, free_port, healthy, start_controller
from bench.processes import FleetError, ProcessFleet, wait_until
from bench.scenarios.cache.model import (
    CACHE_HARDWARE,
    DECODE,
    MODEL,
    NODES,
    PREFILL,
    TP,
    CacheOptions,
    PolicyRun,
)


def fleet_config(o: CacheOptions, policy: str) -> dict[str, Any]:
    """The controller's config: the sim fleet, ``policy`` on both pools (or
    ``PREFILL/DECODE``, one per pool)."""
    prefill, _, decode = policy.partition("/")
    return {"backend": "sim", "model": {"name": MODEL},
            "hardware": {"accelerator": CACHE_HARDWARE, "nodes": NODES},
            "pools": {"prefill": {"size": PREFILL, "tp": TP},
                      "decode": {"size": DECODE, "tp": TP}},
            "routing": {"prefill_policy": prefill, "decode_policy": decode or prefill},
            "sim": {"time_scale": o.time_scale, "processes": o.sim_processes}}


def engine_urls(ctl: ControllerProc) -> dict[str, list[str]]:
    """The ready engines' URLs per role."""
    out: dict[str, list[str]] = {"prefill": [], "decode": []}
    for inst in ctl.get("/cluster")["instances"]:
        if inst["state"] == "ready" and inst["role"] in out:
            out[inst["role"]].append(inst["url"])
    return out


def scrape_engines(urls: list[str]) -> list[prom.Page]:
    return [prom.parse(httpx.get(f"{u}/metrics", timeout=30).text) for u in urls]


def grown(after: list[prom.Page], before: list[prom.Page], name: str) -> float:
    return sum(a.delta(b, name) for a, b in zip(after, before, strict=True))


def vllm_router_argv(binary: str, urls: dict[str, list[str]], port: int) -> list[str]:
    """vllm-router 0.1.17, P/D, its own cache_aware policy on both pools."""
    argv = [binary, "--vllm-pd-disaggregation"]
    for u in urls["prefill"]:
        argv += ["--prefill", u]
    for u in urls["decode"]:
        argv += ["--decode", u]
    return argv + ["--host", "127.0.0.1", "--port", str(port), "--kv-connector", "nixl",
                   "--policy", "cache_aware", "--prometheus-host", "127.0.0.1",
                   "--prometheus-port", str(free_port()), "--log-level", "warning",
                   "--request-timeout-secs", "1800"]


def replay_argv(o: CacheOptions, url: str, out: Path) -> list[str]:
    """``pdctl replay`` of the slice, text prompts, targets in wall ms."""
    return [sys.executable, "-m", "controller.cli", "replay", str(o.trace), "--controller",
            url, "--start-s", f"{o.start_s:g}", "--limit", str(o.limit), "--time-scale",
            f"{o.time_scale:g}", "--rate-scale", f"{o.rate_scale:g}", "--text-prompts",
            "--ttft-ms", f"{o.ttft_ms * o.time_scale:g}",
            "--gap-ms", f"{o.gap_ms * o.time_scale:g}", "--json", str(out)]


def replay_to_end(argv: list[str], log: Path, fleet: ProcessFleet, timeout_s: float) -> None:
    """The replay, to its end; ``FleetError`` if a process of the fleet exits meanwhile."""
    with open(log, "w") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout_s
    try:
        while proc.poll() is None:
            fleet.check_alive()
            fleet.note_descendants()
            if time.monotonic() > deadline:
                raise FleetError(f"the replay ran past {timeout_s:.0f} s")
            time.sleep(0.5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def fill_replay_common(run: Any, data: dict[str, Any], scale: float) -> None:
    """What every replay benchmark reads from ``pdctl replay``'s summary onto its run (any
    object with these fields), its times made modelled (divided by ``scale``)."""
    s = data["summary"]["all"]
    run.requests, run.ok = s["requests"], s["ok"]
    run.failed_by_reason = dict(s["failed_by_reason"])
    run.failed = s["failed"]

    def modelled(v: float | None) -> float:
        return math.nan if v is None else v / scale

    t = s["ttft_ms"]
    run.ttft_p50_ms, run.ttft_p90_ms, run.ttft_p99_ms = (modelled(t[q])
                                                         for q in ("p50", "p90", "p99"))
    run.gap_p99_ms = modelled(s["gap_p99_ms"])
    run.goodput = s["goodput"]["requests"]
    run.wall_s = float(data["wall_s"])
    run.goodput_per_s = run.goodput / (run.wall_s / scale) if run.wall_s else math.nan


def fill_from_replay(run: PolicyRun, data: dict[str, Any], scale: float) -> None:
    """The replay's own summary, its times made modelled (divided by ``scale``)."""
    fill_replay_common(run, data, scale)
    s = data["summary"]["all"]
    run.refused = sum(n for r, n in run.failed_by_reason.items() if r.startswith("http 429"))
    run.failed = s["failed"] - run.refused
    if s["cache_hit_rate"] is not None:
        run.client_cached_share = float(s["cache_hit_rate"])


def predicted_share(ctl: ControllerProc, n: int) -> float:
    """The controller's predicted cached tokens over the prompt tokens of its last ``n``
    requests (its request records), NaN when it has none."""
    try:
        recs = ctl.get("/requests", limit=n)
    except (httpx.HTTPError, ValueError):
        return math.nan
    rows = recs if isinstance(recs, list) else recs.get("requests", [])
    pred = sum(r.get("cached_tokens_predicted") or 0 for r in rows)
    prompt = sum(r.get("prompt_tokens") or 0 for r in rows)
    return pred / prompt if prompt else math.nan


def run_policy(o: CacheOptions, rnd: int, policy: str, router_bin: str | None,
               workdir: Path) -> PolicyRun:
    """``policy`` (a pdctl policy, or "vllm-router") replaying the slice on a cold fleet."""
    router = "vllm-router" if policy == "vllm-router" else "pdctl"
    run = PolicyRun(rnd, policy, router)
    wd = workdir / f"r{rnd}-{policy.replace('/', '+')}"
    run.log = str(wd)
    with ProcessFleet(wd) as fleet:
        try:
            measure_policy(o, run, fleet, router_bin, wd)
        except (FleetError, httpx.HTTPError, OSError, ValueError, KeyError) as exc:
            run.error = f"{type(exc).__name__}: {exc}"[:600]
            print(f"  {policy}: FAILED: {run.error}", flush=True)
        finally:
            fleet.stop(first=("pdctl",))
    return run


def measure_policy(o: CacheOptions, run: PolicyRun, fleet: ProcessFleet, router_bin: str | None,
            wd: Path) -> None:
    pdctl_policy = "round_robin" if run.router == "vllm-router" else run.policy
    ctl = start_controller(wd, fleet_config(o, pdctl_policy), name="pdctl", fleet=fleet,
                           log_level="warning", wait="up", timeout_s=60)
    wait_until("pdctl's fleet", lambda: ctl.ready() == {"prefill": PREFILL, "decode": DECODE},
               180, fleet)
    urls = engine_urls(ctl)
    url = ctl.url
    router_ps = fleet.procs["pdctl"].ps
    if run.router == "vllm-router":
        assert router_bin is not None
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        router_ps = fleet.start("vllm-router", vllm_router_argv(router_bin, urls, port)).ps
        wait_until("vllm-router", lambda: healthy(url), 90, fleet)
    c0 = cpu.process_seconds(router_ps)
    time.sleep(2.0)
    run.router_idle_cpu_pct = (cpu.process_seconds(router_ps) - c0) / 2.0 * 100
    p0, d0 = scrape_engines(urls["prefill"]), scrape_engines(urls["decode"])
    c0 = cpu.process_seconds(router_ps)
    out = wd / "replay.json"
    print(f"  round {run.round} {run.policy:12} replaying through {run.router} ({url})",
          flush=True)
    replay_to_end(replay_argv(o, url, out), wd / "replay.log", fleet,
               timeout_s=max(600.0, 20 * o.limit * o.time_scale))
    run.router_cpu_s = cpu.process_seconds(router_ps) - c0
    now = engine_urls(ctl)
    if any(sorted(now[r]) != sorted(urls[r]) for r in urls):  # one failed: its counters are gone
        raise FleetError("the engines changed during the run, their counters are lost: "
                         + "; ".join(ctl.instance_failures()))
    p1, d1 = scrape_engines(urls["prefill"]), scrape_engines(urls["decode"])
    if not out.exists():
        raise FleetError(f"the replay wrote no result; see {wd / 'replay.log'}")
    fill_from_replay(run, json.loads(out.read_text()), o.time_scale)
    run.prefill_hits = grown(p1, p0, "vllm:prefix_cache_hits_total")
    run.prefill_queries = grown(p1, p0, "vllm:prefix_cache_queries_total")
    run.decode_hits = grown(d1, d0, "vllm:prefix_cache_hits_total")
    run.decode_queries = grown(d1, d0, "vllm:prefix_cache_queries_total")
    run.kv_bytes = grown(d1, d0, "vllm:nixl_bytes_transferred_sum")
    run.kv_pulls = grown(d1, d0, "vllm:nixl_bytes_transferred_count")
    run.sim_lag_s = grown(p1 + d1, p0 + d0, "pdctl_sim_lag_seconds_total")
    if run.router == "pdctl":
        run.predicted_share = predicted_share(ctl, run.requests)
    print(f"  round {run.round} {run.policy:12} ok {run.ok}/{run.requests} refused "
          f"{run.refused} failed {run.failed}; TTFT p90 {run.ttft_p90_ms:,.0f} ms (modelled);"
          f" prefill hit rate {run.hit_rate:.3f}; router CPU "
          f"{run.router_cpu_us_per_request:,.0f} us/request", flush=True)
