"""The soak's driver: the fleet, the open-loop load in a thread of its own, a fault every
``fault_every`` seconds, the controller's memory and descriptors sampled, what the engines
hold at the end."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import psutil

from bench.fleet import ControllerProc, start_controller
from bench.loadgen import OpenLoop
from bench.processes import ProcessFleet
from bench.scenarios.soak.model import (
    LEASE_S,
    SOAK_MODEL,
    FaultDone,
    SoakOptions,
    SoakResult,
    SoakSample,
    fault_at,
    judge,
    soak_config,
)
from controller.faults import inject

SOAK_WORDS = "the prefill engine computes the prompt and the decode engine streams tokens".split()


def request_maker(url: str) -> Any:
    """``OpenLoop``'s ``make``: every third prompt short (served colocated), the others long
    enough to go disaggregated; each unique, so no prefix cache hides the work."""
    def make(i: int, stream: bool) -> tuple[str, bytes, int]:
        n = 12 if i % 3 == 0 else 600 + 37 * (i % 20)
        words = (SOAK_WORDS[(i + k) % len(SOAK_WORDS)] for k in range(n))
        prompt = f"request {i}: " + " ".join(words)
        body = {"model": SOAK_MODEL, "prompt": prompt, "max_tokens": 16, "stream": stream}
        return f"{url}/v1/completions", orjson.dumps(body), 16
    return make


def inject_fault(ctl: ControllerProc, kind: str, t: float) -> FaultDone:
    """One fault, from the operator's side of the machine (``controller.faults.inject``, as
    ``pdctl fault`` injects it)."""
    role = inject.ROLE[kind]
    if kind == "tp-change":
        tp = ctl.get(f"/pools/{role}")["desired"]["tp"]
        r = ctl.api("PATCH", f"/pools/{role}", {"tp": inject.other_tp(tp)})
        return FaultDone(t, kind, role, f"TP {tp} -> {inject.other_tp(tp)}: "
                         f"{r.status_code} {r.text[:120] if r.status_code != 200 else ''}")
    try:
        v = inject.victim(ctl.get("/instances"), role)
    except inject.FaultRefused as exc:
        return FaultDone(t, kind, role, f"skipped: {exc}")
    detail = inject.kill(v) if kind.startswith("kill") else inject.stall(v, LEASE_S + 2)
    return FaultDone(t, kind, str(v["id"]), detail)


def held(ctl: ControllerProc) -> dict[str, int]:
    """KV handles the ready engines still hold (their ``/sim/info``) or the router still
    counts as out, per instance."""
    out = {}
    for inst in ctl.get("/instances"):
        if inst["state"] != "ready":
            continue
        n = int(inst["load"].get("kv_handles_out", 0))
        with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
            n += int(httpx.get(f"{inst['url']}/sim/info", timeout=5).json()["kv_handles"])
        if n:
            out[inst["id"]] = n
    return out


def drive_soak(o: SoakOptions, ctl: ControllerProc, res: SoakResult) -> OpenLoop:
    """The load in a thread; faults and samples here until it ends."""
    import uvloop

    load = OpenLoop(make=request_maker(ctl.url), rate=o.rate, duration=o.duration,
                    stream_share=0.5, timeout_s=o.timeout, seed=o.seed, max_inflight=512)
    thread = threading.Thread(target=lambda: uvloop.run(load.run()), daemon=True)
    proc = psutil.Process(ctl.proc.pid)
    t0 = time.monotonic()
    thread.start()
    next_fault, next_sample, k = t0 + o.fault_every, t0, 0
    while thread.is_alive():
        now = time.monotonic()
        if now >= next_sample:
            with contextlib.suppress(psutil.Error):
                res.samples.append(SoakSample(round(now - t0, 1),
                                          proc.memory_info().rss / 2**20, proc.num_fds()))
            next_sample += o.sample_every
        if now >= next_fault and now < t0 + o.duration - o.fault_every / 2:
            done = inject_fault(ctl, fault_at(k), round(now - t0, 1))
            print(f"  {done.t:7.1f} s  {done.kind:13s} {done.target}: {done.detail}",
                  flush=True)
            res.faults.append(done)
            k += 1
            next_fault += o.fault_every
        time.sleep(0.25)
    thread.join()
    return load


def run_soak(o: SoakOptions) -> SoakResult:
    tmp = Path(tempfile.mkdtemp(prefix="pdctl-bench-soak-"))
    res = SoakResult(o, logs=str(tmp))
    t_all = time.monotonic()
    print(f"bench.soak: {o.prefill}P + {o.decode}D simulated {SOAK_MODEL}, {o.rate:g} req/s for "
          f"{o.duration:g} s, a fault every {o.fault_every:g} s, planner applying every "
          f"{o.planner_interval:g} s; logs in {tmp}", flush=True)
    fleet = ProcessFleet(tmp)
    ok = False
    try:
        ctl = start_controller(tmp, soak_config(o), fleet=fleet, log_level="warning",
                               wait="converged", timeout_s=60)
        load = drive_soak(o, ctl, res)
        judge(load.arrivals, load.unfinished, res, load.error_samples)
        time.sleep(LEASE_S + 4)  # every handle read, released or expired by now
        res.kv_handles_left = held(ctl)
        res.planner_changes = sum(1 for e in ctl.get("/events", kind="pool.update", limit=1000)
                                  if e["actor"] == "planner")
        res.instance_failures = ctl.instance_failures()
        ok = True
    finally:
        stopped = fleet.stop(grace_s=45, first=("controller",))
        res.processes_left = len(stopped.left)
        res.wall_s = round(time.monotonic() - t_all, 1)
        if ok and not o.keep and not res.lost_total and not stopped.left:
            shutil.rmtree(tmp, ignore_errors=True)
            res.logs = ""
    return res
