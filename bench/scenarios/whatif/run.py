"""The what-if benchmark's runs: the discrete-event run on a trace hour (speed), then one trace
slice replayed through a live simulated fleet behind a real ``pdctl controller`` and the same
slice run discrete-event on the same layout (fidelity, per TTFT part)."""

from __future__ import annotations

import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.fleet import start_controller
from bench.processes import FleetError, ProcessFleet, wait_until
from bench.scenarios.cache.trace_run import replay_to_end
from bench.scenarios.lab.model import OFFLINE
from bench.scenarios.whatif.model import (
    WHATIF_CONTEXT,
    WHATIF_HARDWARE,
    WHATIF_LINK,
    WHATIF_MODEL,
    Fidelity,
    SpeedRun,
    WhatIfOptions,
    WhatIfResult,
)
from controller.cli.serve import cpu_lab_defaults
from controller.config import RoutingSettings
from controller.replay.schedule import Slice, select
from controller.replay.trace import TraceRequest, load_trace
from controller.whatif.engine import EngineShape
from controller.whatif.fleet import Goals
from controller.whatif.layout import Layout
from controller.whatif.run import RunSpec, simulate
from pdctl_api import profiles
from pdctl_api.stats import quantiles

TTFT_MS, GAP_MS = 2000.0, 60.0


def whatif_spec(rate_scale: float = 1.0) -> RunSpec:
    m = profiles.with_context(profiles.model(WHATIF_MODEL), WHATIF_CONTEXT)
    shape = EngineShape(m, profiles.hardware(WHATIF_HARDWARE), profiles.link(WHATIF_LINK))
    return RunSpec(shape, RoutingSettings(), Goals(TTFT_MS, GAP_MS), rate_scale=rate_scale)


def speed_run(o: WhatIfOptions, requests: list[TraceRequest]) -> SpeedRun:
    end = requests[0].time_s + o.speed_minutes * 60
    chosen = [r for r in requests if r.time_s < end]
    res = simulate(chosen, Layout(o.speed_decode, 1, o.speed_prefill, 1), whatif_spec())
    s = res.summary()
    return SpeedRun(len(chosen), chosen[-1].time_s - chosen[0].time_s, res.wall_s,
                    res.events, s["ttft_ms"]["p50"] or math.nan, res.attained)


def lab_spec(rate_scale: float = 1.0) -> RunSpec:
    """The real CPU lab as ``pdctl lab`` runs it (``cpu_lab_defaults``), discrete-event."""
    lab = cpu_lab_defaults(Path("."))
    shape = EngineShape(profiles.model(lab["model"]["name"]),
                        profiles.hardware(lab["hardware"]["accelerator"]),
                        profiles.link(lab["hardware"]["kv_link"]))
    return RunSpec(shape, RoutingSettings(**lab["routing"]), Goals(TTFT_MS, GAP_MS),
                   rate_scale=rate_scale)


def lab_fleet_config(model_dir: Path) -> dict[str, Any]:
    cfg = cpu_lab_defaults(model_dir.resolve())
    cfg["backend"] = "vllm"
    cfg["prometheus"] = {"enabled": False}
    return cfg


def whatif_fleet_config(o: WhatIfOptions) -> dict[str, Any]:
    return {"backend": "sim",
            "model": {"name": WHATIF_MODEL, "max_model_len": WHATIF_CONTEXT},
            "hardware": {"accelerator": WHATIF_HARDWARE, "kv_link": WHATIF_LINK},
            "pools": {"prefill": {"size": o.fidelity_prefill, "tp": 1, "kv_mode": o.kv_mode},
                      "decode": {"size": o.fidelity_decode, "tp": 1, "kv_mode": o.kv_mode}},
            "sim": {"time_scale": o.time_scale}}


def replay_live(workdir: Path, config: dict[str, Any], replay_args: list[str],
                timeout_s: float, records: int) -> tuple[dict[str, Any], list[dict[str, Any]],
                                                          float]:
    """``pdctl replay TRACE_AND_ARGS`` through a fresh live simulated fleet of ``config``
    behind a real controller, every process stopped after: the replay's JSON result, the
    controller's last ``records`` request records, and the replay's wall seconds."""
    pools = config["pools"]
    want = {r: pools[r]["size"] for r in ("prefill", "decode") if pools[r]["size"]}
    real = config.get("backend") == "vllm"  # engines that load for minutes, offline
    with ProcessFleet(workdir) as fleet:
        try:
            ctl = start_controller(workdir, config, name="pdctl", fleet=fleet,
                                   log_level="warning", wait="up", timeout_s=60,
                                   env=OFFLINE if real else None)
            wait_until("the fleet",
                       lambda: {r: n for r, n in ctl.ready().items() if n} == want,
                       900 if real else 240, fleet)
            out = workdir / "replay.json"
            argv = [sys.executable, "-m", "controller.cli", "replay", *replay_args,
                    "--controller", ctl.url, "--json", str(out)]
            started = time.perf_counter()
            replay_to_end(argv, workdir / "replay.log", fleet, timeout_s=timeout_s)
            wall_s = time.perf_counter() - started
            got = ctl.get("/requests", limit=records)
        finally:
            fleet.stop(first=("pdctl",))
    rows = got if isinstance(got, list) else got.get("requests", [])
    return json.loads(out.read_text()), rows, wall_s


def live_records(o: WhatIfOptions, workdir: Path, res: WhatIfResult) -> list[dict[str, Any]]:
    """The controller's request records of the slice replayed through a live sim fleet."""
    args = [str(o.trace), "--start-s", f"{o.fidelity_start_s:g}", "--limit",
            str(o.fidelity_requests), "--time-scale", f"{o.time_scale:g}", "--rate-scale",
            f"{o.fidelity_rate_scale:g}"]
    config = (whatif_fleet_config(o) if o.lab_model_dir is None
              else lab_fleet_config(o.lab_model_dir))
    _, rows, res.live_wall_s = replay_live(
        workdir, config, args, max(600.0, 30 * o.fidelity_requests * o.time_scale),
        o.fidelity_requests)
    return [r for r in rows if r.get("status") == "ok"]


def _p50_p90(values: list[float]) -> tuple[float, float]:
    got = quantiles(values, (0.5, 0.9))
    return (math.nan, math.nan) if got is None else (got[0], got[1])


def compare(live: list[dict[str, Any]], des: list[Any], scale: float) -> list[Fidelity]:
    out = []
    for part in ("ttft", "queue", "prefill", "transfer", "decode_sched", "gap_p99"):
        key = f"{part}_ms"
        lv = _p50_p90([float(r[key]) / scale for r in live if r.get(key) is not None])
        dv = _p50_p90([float(getattr(r, key)) for r in des])
        out.append(Fidelity(part, lv[0], dv[0], lv[1], dv[1]))
    return out


def run_whatif(o: WhatIfOptions) -> WhatIfResult:
    res = WhatIfResult(o)
    trace = load_trace(o.trace)
    res.speed = speed_run(o, list(trace.requests))
    print(f"  speed: {res.speed.requests} requests over {res.speed.trace_s / 60:.1f} min "
          f"of trace in {res.speed.wall_s:.1f} s ({res.speed.events:,} events)", flush=True)
    if o.skip_fidelity:
        return res
    sl = Slice(o.fidelity_start_s, o.fidelity_requests, rate_scale=o.fidelity_rate_scale)
    chosen = select(trace, sl)
    layout = Layout(o.fidelity_decode, 1, o.fidelity_prefill, 1, kv_mode=o.kv_mode)
    spec = (whatif_spec(o.fidelity_rate_scale) if o.lab_model_dir is None
            else lab_spec(o.fidelity_rate_scale))
    des = simulate(chosen, layout, spec)
    res.des_wall_s = des.wall_s
    with tempfile.TemporaryDirectory(prefix="bench-whatif-") as tmp:
        try:
            live = live_records(o, Path(tmp), res)
        except (FleetError, httpx.HTTPError, OSError, ValueError, KeyError) as exc:
            res.error = f"{type(exc).__name__}: {exc}"[:600]
            return res
    res.fidelity_requests = len(live)
    res.live_failed = o.fidelity_requests - len(live)
    res.fidelity = compare(live, des.served.records, o.time_scale)
    return res

