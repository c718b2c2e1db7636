"""One setup of the lab scenario measured: started and warmed up, its idle CPU with the
engines up, then each guidellm profile with the machine's CPU, the controller's TTFT
accounting, the slowest requests and the prefill engines' KV lease counters."""

from __future__ import annotations

import json
import os
import shlex
import time
from pathlib import Path
from typing import Any

import httpx

from bench import cpu, prom, stats
from bench.fleet import ControllerProc
from bench.processes import FleetError, ProcessFleet
from bench.scenarios.lab.engines import start_setup, warm_up
from bench.scenarios.lab.model import LabOptions, ProfileResult, SetupResult, note
from bench.scenarios.lab.workload import guidellm_argv, profile_result, run_guidellm

TAIL_KEYS = ("id", "path", "status", "prompt_tokens", "ttft_ms", "queue_ms", "prefill_ms",
             "transfer_ms", "decode_sched_ms", "overhead_ms", "e2e_ms", "retries")


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


def request_rows(ctl: ControllerProc, limit: int, dump: Path) -> list[dict[str, Any]]:
    """The controller's last ``limit`` request records, also written to ``dump``; the three
    slowest to first token, with their TTFT parts (the tail's evidence)."""
    rows = ctl.get("/requests", limit=limit)
    dump.write_text(json.dumps(rows, indent=1))
    slow = sorted((r for r in rows if r.get("status") == "ok"), key=lambda r: -r["ttft_ms"])
    return [{k: r.get(k) for k in TAIL_KEYS} for r in slow[:3]]


def cpu_since(m0: cpu.MachineTimes, p0: float, ours: set[int], seconds: float
              ) -> dict[str, float]:
    """The machine's user, system and idle shares since ``m0``, the cores our processes kept
    busy since ``p0`` (their CPU seconds then) over ``seconds``, and the load average."""
    out = cpu.machine_times().since(m0).shares()
    out["our_cores_busy"] = (cpu.pids_seconds(ours) - p0) / seconds
    out["load_avg_1m"] = os.getloadavg()[0]
    return out


def run_guidellm_profile(name: str, profile: str, streams: int, n: int, secs: float,
                         o: LabOptions, ctl: ControllerProc, fleet: ProcessFleet, data: Path,
                         threshold: int, ours: set[int]) -> ProfileResult:
    """One guidellm profile against setup ``name``, with what the controller saw."""
    out = o.work / f"guidellm-{name}-{profile}.json"
    out.unlink(missing_ok=True)
    argv = guidellm_argv(ctl.url, o.model_dir.resolve(), data, profile, streams, n, secs, out)
    m0, p0 = cpu.machine_times(), cpu.pids_seconds(ours)
    run_guidellm(fleet, f"guidellm-{name}-{profile}", argv, o.work / f"guidellm-{name}.log",
                 secs + 240)
    s = profile_result(out, data, threshold)
    s.cpu = cpu_since(m0, p0, ours, s.duration_s)
    s.guidellm_cmd = shlex.join(argv)
    s.router = router_parts(ctl, n)
    if name != "colocated":
        s.tail = request_rows(ctl, n, o.work / f"requests-{name}-{profile}.json")
        s.lease = lease_counters(ctl)
    note(f"{name} {profile}: {s.requests_ok} ok in {s.duration_s:.0f} s, "
         f"TTFT p50 {s.ttft_p50_ms:.0f} ms p99 {s.ttft_p99_ms:.0f} ms, "
         f"ITL p50 {s.itl_p50_ms:.1f} ms p99 {s.itl_p99_ms:.1f} ms")
    return s


def run_setup(name: str, o: LabOptions, data: dict[str, Path], threshold: int,
              result: SetupResult) -> None:
    """One setup, measured into ``result`` (what was measured stays there when a later step
    fails)."""
    t_setup = time.monotonic()
    fleet = ProcessFleet(o.work)
    try:
        ctl = start_setup(name, o, fleet, result)
        ours = fleet.pids()
        note(f"{name}: ready after {time.monotonic() - t_setup:.0f} s; warming up")
        try:
            warm_up(ctl.url)
        except httpx.HTTPError as exc:
            raise FleetError(f"warm-up request failed: {exc}; see {o.work}/{name}-*.log"
                             ) from None
        # Idle CPU with the engines up: NIXL's UCX progress threads busy-poll (system time).
        m0, p0 = cpu.machine_times(), cpu.pids_seconds(ours)
        time.sleep(o.idle_probe)
        result.idle_cpu = cpu_since(m0, p0, ours, o.idle_probe)
        for profile, streams, n, secs in (
                ("synchronous", 1, o.sync_requests, o.sync_seconds),
                ("concurrent", o.streams, o.conc_requests, o.conc_seconds)):
            result.profiles[profile] = run_guidellm_profile(
                name, profile, streams, n, secs, o, ctl, fleet, data[profile], threshold, ours)
    finally:
        stopped = fleet.stop(first=tuple(n for n in fleet.procs if n.endswith("controller")))
        if stopped.left:
            note(f"{name}: WARNING, still running after stop: {stopped.left}")
        result.leftover_processes = stopped.left
        result.setup_s = time.monotonic() - t_setup
