"""One hand-off policy replaying one workload on a cold simulated fleet: a fresh ``pdctl
controller`` (backend sim, its eight engines in ``sim.processes`` host processes, cache_aware
on both pools, the policy's ``disagg_policy`` / ``disagg_min_prompt_tokens``), ``pdctl
replay`` through it (token-id prompts), the controller's request records read back (each
one's decision, its reason and its TTFT parts), and everything stopped."""

from __future__ import annotations

import json
import math
import re
import statistics
import sys
from pathlib import Path
from typing import Any

import httpx

from bench.fleet import ControllerProc, start_controller
from bench.processes import FleetError, ProcessFleet, wait_until
from bench.scenarios.cache.model import CACHE_HARDWARE as HARDWARE
from bench.scenarios.cache.model import DECODE, MODEL, NODES, PREFILL, TP
from bench.scenarios.cache.trace_run import (
    engine_urls,
    fill_replay_common,
    grown,
    replay_to_end,
    scrape_engines,
)
from bench.scenarios.handoff.model import (
    LOCAL,
    SLO,
    HandoffOptions,
    HandoffRun,
    Workload,
    policy_threshold,
)
from controller.replay.summary import CLASSES

ESTIMATES = re.compile(r"local ~([\d,]+) ms, disaggregated ~([\d,]+) ms")
HANDOFF_RECORD_FIELDS = ("prompt_tokens", "cached_tokens", "decode_cached_tokens_predicted", "path",
                 "decision", "decision_reason", "prefill_instance", "decode_instance",
                 "status")
MS_FIELDS = ("ttft_ms", "queue_ms", "prefill_ms", "transfer_ms", "decode_sched_ms",
             "overhead_ms", "gap_p99_ms")


def handoff_fleet_config(o: HandoffOptions, policy: str) -> dict[str, Any]:
    """The controller's config: the sim fleet, cache_aware on both pools, ``policy``'s
    hand-off; the routing targets the ``slo`` decision reads in wall ms (the time scale's)."""
    threshold = policy_threshold(policy)
    routing: dict[str, Any] = {"prefill_policy": "cache_aware", "decode_policy": "cache_aware",
                               "disagg_policy": "threshold" if threshold is not None else SLO}
    if threshold is not None:
        routing["disagg_min_prompt_tokens"] = min(threshold, LOCAL)
    return {"backend": "sim", "model": {"name": MODEL},
            "hardware": {"accelerator": HARDWARE, "nodes": NODES},
            "pools": {"prefill": {"size": PREFILL, "tp": TP},
                      "decode": {"size": DECODE, "tp": TP}},
            "routing": routing,
            "targets": {"ttft_p95_ms": o.ttft_ms * o.time_scale,
                        "gap_p99_ms": o.gap_ms * o.time_scale},
            "sim": {"time_scale": o.time_scale, "processes": o.sim_processes}}


def handoff_replay_argv(o: HandoffOptions, w: Workload, url: str, out: Path) -> list[str]:
    """``pdctl replay`` of the workload, token-id prompts, targets in wall ms."""
    return [sys.executable, "-m", "controller.cli", "replay", str(w.trace), "--controller",
            url, "--start-s", f"{w.start_s:g}", "--limit", str(w.limit), "--time-scale",
            f"{o.time_scale:g}", "--rate-scale", f"{w.rate_scale:g}",
            "--ttft-ms", f"{o.ttft_ms * o.time_scale:g}",
            "--gap-ms", f"{o.gap_ms * o.time_scale:g}", "--json", str(out)]


def fill_handoff_run(run: HandoffRun, data: dict[str, Any], scale: float) -> None:
    """The replay's summary and its rows' mean TTFT, made modelled (divided by ``scale``)."""
    fill_replay_common(run, data, scale)
    rows = [r for r in data["requests"] if r["ok"] and r["ttft_ms"] is not None]
    if rows:
        run.ttft_mean_ms = statistics.fmean(r["ttft_ms"] for r in rows) / scale
    for name, lo, hi in ((c, lo, hi) for c, lo, hi in CLASSES):
        ttfts = [r["ttft_ms"] for r in rows
                 if r["input_length"] >= lo and (hi is None or r["input_length"] < hi)]
        if ttfts:
            run.ttft_mean_by_class[name] = statistics.fmean(ttfts) / scale


def reason_kind(decision: str | None, reason: str | None) -> str:
    """A decision's reason, as a kind (what the report counts)."""
    r = reason or ""
    if decision is None:
        return "no decision"
    if "no ready prefill" in r:
        return "local: no prefill instance"
    if r.startswith("threshold:"):
        return f"{decision}: threshold"
    if "holds the prompt" in r:
        return "local: prompt cached on decode"
    if decision == "disaggregated":
        return "disagg: gap guard" if "stall" in r else "disagg: faster"
    if "is over its" in r:
        return "local: TTFT over target, guard off"
    if "would miss" in r:
        return "local: disagg would miss TTFT target"
    if "would cost over" in r:
        return "local: guard would cost too much TTFT"
    return "local: faster (or no clear gain)"


def compact(rec: dict[str, Any], scale: float) -> dict[str, Any]:
    """One request record's hand-off and TTFT parts, times modelled, the decision's
    estimates (slo) parsed from its reason."""
    out = {k: rec.get(k) for k in HANDOFF_RECORD_FIELDS}
    out.update({k: round((rec.get(k) or 0.0) / scale, 1) for k in MS_FIELDS})
    m = ESTIMATES.search(rec.get("decision_reason") or "")
    if m:
        out["est_local_ms"] = int(m.group(1).replace(",", "")) / scale
        out["est_disagg_ms"] = int(m.group(2).replace(",", "")) / scale
    return out


def summarize_records(run: HandoffRun, recs: list[dict[str, Any]]) -> None:
    """Decisions by kind, and per decision the means of the prompt, its uncached part, the
    TTFT and its parts, and the estimates (modelled ms)."""
    ok = [r for r in recs if r["status"] == "ok"]
    run.disaggregated = sum(r["decision"] == "disaggregated" for r in ok)
    run.local = sum(r["decision"] == "local" for r in ok)
    for r in ok:
        k = reason_kind(r["decision"], r["decision_reason"])
        run.reasons[k] = run.reasons.get(k, 0) + 1
    for d in ("disaggregated", "local"):
        rows = [r for r in ok if r["decision"] == d]
        if not rows:
            continue

        def mean(key: str, rows: list[dict[str, Any]] = rows) -> float:
            vals = [float(r[key]) for r in rows if r.get(key) is not None]
            return statistics.fmean(vals) if vals else math.nan

        for r in rows:
            r["uncached"] = r["prompt_tokens"] - (r["cached_tokens"] or 0)
        run.by_decision[d] = {"n": len(rows), **{k: mean(k) for k in (
            "prompt_tokens", "uncached", "ttft_ms", "queue_ms", "prefill_ms", "transfer_ms",
            "est_local_ms", "est_disagg_ms")}}


def run_handoff_policy(o: HandoffOptions, w: Workload, rnd: int, policy: str, workdir: Path
               ) -> tuple[HandoffRun, list[dict[str, Any]]]:
    """``policy`` replaying ``w`` on a cold fleet; the run and its compact records."""
    run = HandoffRun(w.name, rnd, policy)
    wd = workdir / f"r{rnd}-{w.name.replace(' ', '-')}-{policy.replace(':', '-')}"
    run.log = str(wd)
    recs: list[dict[str, Any]] = []
    with ProcessFleet(wd) as fleet:
        try:
            recs = measure_handoff(o, w, run, fleet, wd)
        except (FleetError, httpx.HTTPError, OSError, ValueError, KeyError) as exc:
            run.error = f"{type(exc).__name__}: {exc}"[:600]
            print(f"  {w.name} {run.label}: FAILED: {run.error}", flush=True)
        finally:
            fleet.stop(first=("pdctl",))
    return run, recs


def records(ctl: ControllerProc, n: int, scale: float) -> list[dict[str, Any]]:
    rows = ctl.get("/requests", limit=max(1, min(n, 10_000)))
    rows = rows if isinstance(rows, list) else rows.get("requests", [])
    return [compact(r, scale) for r in reversed(rows)]


def measure_handoff(o: HandoffOptions, w: Workload, run: HandoffRun, fleet: ProcessFleet, wd: Path
            ) -> list[dict[str, Any]]:
    ctl = start_controller(wd, handoff_fleet_config(o, run.policy), name="pdctl", fleet=fleet,
                           log_level="warning", wait="up", timeout_s=60)
    wait_until("pdctl's fleet", lambda: ctl.ready() == {"prefill": PREFILL, "decode": DECODE},
               180, fleet)
    urls = engine_urls(ctl)
    before = scrape_engines(urls["prefill"] + urls["decode"])
    out = wd / "replay.json"
    print(f"  round {run.round} {w.name:15} {run.label:15} replaying", flush=True)
    replay_to_end(handoff_replay_argv(o, w, ctl.url, out), wd / "replay.log", fleet,
                  timeout_s=max(600.0, 20 * w.limit * o.time_scale))
    if not out.exists():
        raise FleetError(f"the replay wrote no result; see {wd / 'replay.log'}")
    fill_handoff_run(run, json.loads(out.read_text()), o.time_scale)
    now = engine_urls(ctl)
    if sorted(now["prefill"] + now["decode"]) == sorted(urls["prefill"] + urls["decode"]):
        run.sim_lag_s = grown(scrape_engines(urls["prefill"] + urls["decode"]), before,
                              "pdctl_sim_lag_seconds_total")
    recs = records(ctl, run.requests, o.time_scale)
    summarize_records(run, recs)
    print(f"  round {run.round} {w.name:15} {run.label:15} ok {run.ok}/{run.requests}; TTFT "
          f"mean {run.ttft_mean_ms:,.0f} p90 {run.ttft_p90_ms:,.0f} ms (modelled); "
          f"{run.disaggregated} disaggregated, {run.local} local; {run.wall_s:.0f} s",
          flush=True)
    return recs
