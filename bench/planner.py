"""The SLA planner's evidence, on real ``pdctl controller`` processes with simulated engines
(Llama-3-70B on H100 SXM, the shipped profiles):

1. **Stepped load in apply mode.** Prefill TP4, decode TP2 (the issue's layout), prompts of
   2,500-3,500 tokens (token ids), 150 output tokens, half the requests streamed; an
   open-loop load that steps low -> high -> low (modelled requests/s). The planner starts at
   1 + 1 instances and sizes both pools itself. Reported per planner interval: observed and
   predicted rate, pool sizes, TTFT p95 and inter-token gap p95 (the planner's own
   observation); how many intervals after each step both p95s were back under their
   targets; accelerator-seconds used (sampled every 2 s: every instance holding
   accelerators, starting and draining ones included) against a fixed fleet sized for the
   peak the planner reached, over the same time; and a timeline chart
   (``bench-results/planner-timeline.html``, Vega-Lite).

2. **Disaggregated against colocated at equal accelerators** (8 H100): 1 prefill TP4 + 1
   decode TP4 against 2 colocated TP4 engines (the prefill pool empty: every request is
   served whole by a decode engine), under the same mix: 20 % prompts of 3,000-7,600 tokens,
   80 % of 100-300, 150-300 output tokens, every answer streamed, Poisson arrivals at each
   rate. Per prompt class: TTFT p50/p99; over all answers: inter-token gap p99 and p99.9 and
   each answer's worst gap (as this client read the stream); goodput under a TTFT + worst-gap
   SLO and under a TTFT + mean-ITL SLO; and the controller's advisor verdict for the traffic.

All times are modelled: the engines run at ``time_scale`` wall seconds per modelled second
(slower than real time where this 2-core machine could not carry the wall rate), and every
measured time is divided by it, every wall rate multiplied.

    .venv/bin/python -m bench.planner            # ~25 min
    .venv/bin/python -m bench.planner --quick    # ~6 min
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench import stats
from bench.fleet import ControllerProc, Fleet, interrupt_on_signals, start_controller
from bench.loadgen import OpenLoop, body
from bench.loadgen import run as run_loop
from bench.report import ROOT, fmt, write_json

TITLE = "SLA planner: a stepped load in apply mode; P/D against colocated at equal accelerators"
ABOUT = ("`pdctl controller` with simulated Llama-3-70B/H100 engines: (1) the planner in apply "
         "mode under an open-loop load stepping low -> high -> low, from 1 + 1 instances; "
         "(2) 1 prefill TP4 + 1 decode TP4 against 2 colocated TP4 engines under a mix of "
         "long and short prompts. Modelled time throughout.")
MODEL = "llama-3-70b"
RESULTS = ROOT / "bench-results"


@dataclass
class Options:
    step_scale: float = 3.0  # wall s per modelled s in the stepped load
    interval_s: float = 30.0  # planner interval (wall): 10 modelled s
    low: float = 3.0  # modelled requests/s
    high: float = 24.0
    phases: tuple[int, int, int] = (3, 8, 8)  # intervals per phase: low, high, low
    ttft_ms: float = 2000.0
    itl_ms: float = 60.0
    nodes: int = 16
    prefill_max_inflight: int = 4  # routing.prefill_max_inflight in the stepped load (0: off)
    pd_scale: float = 1.0
    pd_rates: tuple[float, ...] = (2.0, 5.0, 9.0)
    pd_seconds: float = 90.0
    slo_ttft_ms: float = 2000.0
    slo_worst_gap_ms: float = 250.0
    slo_mean_itl_ms: float = 50.0
    seed: int = 7

    @classmethod
    def defaults(cls, quick: bool) -> Options:
        if quick:
            return cls(step_scale=2.0, interval_s=10.0, low=2.0, high=12.0, phases=(2, 6, 6),
                       nodes=8, pd_rates=(5.0,), pd_seconds=40.0)
        return cls()


# ---- results ---------------------------------------------------------------------------------

@dataclass
class Interval:
    t: float  # wall seconds since the load started, at the end of the interval
    rate: float | None  # observed modelled requests/s
    predicted: float | None  # the rate predicted for this interval one pass earlier
    prefill: int
    decode: int
    rec_prefill: int
    rec_decode: int
    ttft_p95_ms: float | None
    gap_p95_ms: float | None
    applied: bool
    hold: str | None


@dataclass
class StepResult:
    options: dict[str, Any]
    steps: list[tuple[float, float]]  # (wall s since start, modelled requests/s)
    intervals: list[Interval] = field(default_factory=list)
    recovered_after: list[float | None] = field(default_factory=list)  # intervals, per step
    accel_seconds: float = 0.0  # wall
    peak_accelerators: int = 0
    fixed_accel_seconds: float = 0.0
    duration_s: float = 0.0
    requests: int = 0
    failed: int = 0
    error_samples: dict[str, list[str]] = field(default_factory=dict)
    changes: list[dict[str, Any]] = field(default_factory=list)  # the planner's pool.update
    chart: str = ""


@dataclass
class Side:
    setup: str
    rate: float  # modelled requests/s
    requests: int = 0
    failed: int = 0
    ttft_short_p50: float = math.nan
    ttft_short_p99: float = math.nan
    ttft_long_p50: float = math.nan
    ttft_long_p99: float = math.nan
    gap_p99: float = math.nan
    gap_p999: float = math.nan
    worst_gap_p50: float = math.nan
    worst_gap_p99: float = math.nan
    mean_itl_p50: float = math.nan
    goodput_worst_gap: float = math.nan  # requests/s meeting TTFT + worst-gap SLO
    goodput_mean_itl: float = math.nan


@dataclass
class PdResult:
    sides: list[Side] = field(default_factory=list)
    advisor: dict[str, Any] = field(default_factory=dict)


@dataclass
class PlannerBench:
    step: StepResult
    pd: PdResult


# ---- helpers ---------------------------------------------------------------------------------

def base_config(nodes: int, scale: float) -> dict[str, Any]:
    return {
        "backend": "sim",
        "model": {"name": MODEL},
        "hardware": {"accelerator": "h100-sxm", "nodes": nodes, "kv_link": "ib-ndr"},
        "sim": {"time_scale": scale, "startup_delay_s": 0.5, "processes": 2},
        # least_loaded prefill: after a scale-up, round robin keeps sending a backlogged
        # instance its share, and its queue never drains (measured: TTFT p95 46 s with 22
        # prefill instances where 6 carry the load).
        "routing": {"disagg_min_prompt_tokens": 512, "max_inflight": 8192,
                    "prefill_policy": "least_loaded"},
        "controller": {"tick_s": 0.5, "metrics_poll_s": 1.0, "health_interval_s": 2.0,
                       "drain_timeout_s": 120.0, "start_timeout_s": 120.0},
    }


def payload(prompt_tokens: int, output_tokens: int, stream: bool, rng: random.Random) -> bytes:
    prompt = [rng.randrange(10, 100_000) for _ in range(prompt_tokens)]
    return body({"model": MODEL, "prompt": prompt, "max_tokens": output_tokens,
                 "stream": stream, "ignore_eos": True, "temperature": 0})


# ---- 1. stepped load ----------------------------------------------------------------------------

def run_step(o: Options, work: Path) -> StepResult:
    cfg = base_config(o.nodes, o.step_scale)
    cfg["pools"] = {"prefill": {"size": 1, "tp": 4}, "decode": {"size": 1, "tp": 2}}
    # The router's prefill queue: a backlog waits in the router, not in the one engine it was
    # sent to, so instances the planner adds take it at once (2-3 such prompts fill a step of
    # 8,192 tokens; 4 keep the engine fed).
    cfg["routing"]["prefill_max_inflight"] = o.prefill_max_inflight
    cfg["planner"] = {"mode": "apply", "interval_s": o.interval_s, "ttft_ms": o.ttft_ms,
                      "itl_ms": o.itl_ms, "min_requests": 5, "predictor": "constant"}
    rates = (o.low, o.high, o.low)
    steps, t = [], 0.0
    for rate, n in zip(rates, o.phases, strict=True):
        steps.append((t, rate))
        t += n * o.interval_s
    res = StepResult(options={k: getattr(o, k) for k in (
        "step_scale", "interval_s", "low", "high", "phases", "ttft_ms", "itl_ms", "nodes",
        "prefill_max_inflight")},
        steps=steps)
    rng = random.Random(o.seed)
    shutil.rmtree(work, ignore_errors=True)  # a fresh state: no stored pools, no old events
    with Fleet(work) as fleet:
        ctl = start_controller(work, cfg, fleet=fleet, wait="converged", timeout_s=120)
        samples: list[tuple[float, int, int]] = []  # (monotonic, used, desired accelerators)
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                with _quiet():
                    c = ctl.get("/cluster")
                    p, d = c["pools"]["prefill"]["desired"], c["pools"]["decode"]["desired"]
                    samples.append((time.monotonic(), c["hardware"]["used_accelerators"],
                                    p["size"] * p["tp"] + d["size"] * d["tp"]))
                stop.wait(2.0)

        sampler = threading.Thread(target=sample, daemon=True)
        url = f"{ctl.url}/v1/completions"
        phases = []
        for k, ((_, rate), n) in enumerate(zip(steps, o.phases, strict=True)):
            def make(i: int, stream: bool, k: int = k) -> tuple[str, bytes, int]:
                return url, payload(rng.randint(2500, 3500), 150, stream, rng), 150
            phases.append(OpenLoop(make, rate / o.step_scale, n * o.interval_s, poisson=True,
                                   stream_share=0.5, max_inflight=4000, timeout_s=600.0,
                                   seed=o.seed + k))

        async def after(delay: float, phase: OpenLoop) -> None:
            await asyncio.sleep(delay)
            await phase.run()

        async def main() -> None:
            await asyncio.gather(*(after(s[0], p) for s, p in zip(steps, phases, strict=True)))

        t0_wall, t0 = time.time(), time.monotonic()
        sampler.start()
        run_loop(main())
        # Two more intervals: the planner's last passes and the pools' drain.
        time.sleep(2 * o.interval_s)
        stop.set()
        sampler.join()
        res.duration_s = time.monotonic() - t0
        plan = ctl.get("/planner", history=720)
        events = ctl.get("/events", limit=2000, kind="pool.update")
        ctl.stop()
    arrivals = [a for p in phases for a in p.arrivals]
    res.requests = len(arrivals)
    res.failed = sum(1 for a in arrivals if a.error is not None)
    for p in phases:
        for kind, sample_list in p.error_samples.items():
            res.error_samples.setdefault(kind, []).extend(sample_list[:2])
    res.changes = [{"t": round(e["ts"] - t0_wall, 1), "pool": e["target"],
                    "from": e["before"]["size"], "to": e["after"]["size"], "actor": e["actor"]}
                   for e in sorted(events, key=lambda e: e["id"])]
    hist = [p for p in plan["history"] if p["at"] >= t0_wall]
    for k, p in enumerate(hist):
        ob = p.get("observed") or {}
        prev = hist[k - 1]["predicted"] if k else None
        res.intervals.append(Interval(
            t=round(p["at"] - t0_wall, 1),
            rate=(ob.get("load") or {}).get("request_rate") if ob.get("requests") else None,
            predicted=prev["request_rate"] if prev else None,
            prefill=p["current"]["prefill"], decode=p["current"]["decode"],
            rec_prefill=p["recommended"]["prefill"], rec_decode=p["recommended"]["decode"],
            ttft_p95_ms=ob.get("ttft_p95_ms") if ob.get("requests") else None,
            gap_p95_ms=ob.get("itl_p95_ms") if ob.get("requests") else None,
            applied=p["applied"], hold=p["hold"]))
    for step_t, _ in steps[1:]:
        res.recovered_after.append(recovery(res.intervals, step_t, o))
    if samples:
        for (ta, used, _), (tb, _, _) in zip(samples, samples[1:], strict=False):
            res.accel_seconds += used * (tb - ta)
        res.peak_accelerators = max(d for _, _, d in samples)
        res.fixed_accel_seconds = res.peak_accelerators * (samples[-1][0] - samples[0][0])
    res.chart = timeline_chart(res, o)
    return res


class _quiet:
    """Swallow one sampling failure (the controller may be busy); the next sample counts."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> bool:
        return kind is not None and issubclass(kind, (httpx.HTTPError, KeyError, ValueError))


def recovery(intervals: list[Interval], step_t: float, o: Options) -> float | None:
    """Intervals after a step until a pass whose whole interval followed it saw both p95s
    under their targets; None if none did."""
    for iv in intervals:
        if iv.t - o.interval_s < step_t - 1e-6 or iv.ttft_p95_ms is None:
            continue
        if iv.ttft_p95_ms <= o.ttft_ms and (iv.gap_p95_ms or 0.0) <= o.itl_ms:
            return math.ceil((iv.t - step_t) / o.interval_s - 1e-9)
    return None


def timeline_chart(res: StepResult, o: Options) -> str:
    """A Vega-Lite page: load, pool sizes, TTFT and gap p95 against the targets, stacked."""
    rows = []
    for iv in res.intervals:
        for series, value, panel in (
                ("observed rate", iv.rate, "requests/s"),
                ("predicted rate", iv.predicted, "requests/s"),
                ("prefill instances", iv.prefill, "instances"),
                ("decode instances", iv.decode, "instances"),
                ("TTFT p95 (ms)", iv.ttft_p95_ms, "TTFT p95 ms"),
                ("gap p95 (ms)", iv.gap_p95_ms, "gap p95 ms")):
            if value is not None:
                rows.append({"t": iv.t, "series": series, "value": value, "panel": panel})
    targets = [{"panel": "TTFT p95 ms", "target": o.ttft_ms},
               {"panel": "gap p95 ms", "target": o.itl_ms}]
    spec = {
        "$schema": "https://vega.github.io/schema/vega-lite/v5.json",
        "title": "pdctl SLA planner, apply mode: stepped load",
        "vconcat": [
            {"layer": [
                {"data": {"values": [r for r in rows if r["panel"] == panel]},
                 "mark": {"type": "line", "point": True,
                          "interpolate": "step-after" if panel == "instances" else "linear"},
                 "encoding": {"x": {"field": "t", "type": "quantitative",
                                    "title": "wall s since the load started"},
                              "y": {"field": "value", "type": "quantitative", "title": panel},
                              "color": {"field": "series", "type": "nominal"}}},
                *([{"data": {"values": [t for t in targets if t["panel"] == panel]},
                    "mark": {"type": "rule", "strokeDash": [4, 4]},
                    "encoding": {"y": {"field": "target", "type": "quantitative"}}}]
                  if panel.endswith("ms") else [])],
             "width": 720, "height": 140}
            for panel in ("requests/s", "instances", "TTFT p95 ms", "gap p95 ms")],
        "resolve": {"scale": {"color": "independent"}},
    }
    return ("<!doctype html><html><head><script src=\"https://cdn.jsdelivr.net/npm/vega@5\">"
            "</script><script src=\"https://cdn.jsdelivr.net/npm/vega-lite@5\"></script>"
            "<script src=\"https://cdn.jsdelivr.net/npm/vega-embed@6\"></script></head><body>"
            f"<div id=\"c\"></div><script>vegaEmbed('#c', {json.dumps(spec)});</script>"
            "</body></html>\n")


# ---- 2. P/D against colocated ---------------------------------------------------------------

SETUPS = {
    "P/D 1xTP4 + 1xTP4": {"prefill": {"size": 1, "tp": 4}, "decode": {"size": 1, "tp": 4}},
    "colocated 2xTP4": {"prefill": {"size": 0, "tp": 4}, "decode": {"size": 2, "tp": 4}},
}


def run_pd(o: Options, work: Path) -> PdResult:
    out = PdResult()
    for name, pools in SETUPS.items():
        cfg = base_config(1, o.pd_scale)
        cfg["pools"] = pools
        where = work / name.split()[0].replace("/", "")
        shutil.rmtree(where, ignore_errors=True)
        with Fleet(where) as fleet:
            ctl = start_controller(fleet.workdir, cfg, fleet=fleet, wait="converged",
                                   timeout_s=120)
            for rate in o.pd_rates:
                out.sides.append(pd_side(o, ctl, name, rate))
            if name.startswith("P/D"):
                out.advisor = ctl.get("/advisor")["verdict"]
            ctl.stop()
    return out


def pd_side(o: Options, ctl: ControllerProc, name: str, rate: float) -> Side:
    rng = random.Random(o.seed)
    classes: dict[int, str] = {}
    url = f"{ctl.url}/v1/completions"

    def make(i: int, stream: bool) -> tuple[str, bytes, int]:
        long = rng.random() < 0.2
        classes[i] = "long" if long else "short"
        n = rng.randint(3000, 7600) if long else rng.randint(100, 300)
        out = rng.randint(150, 300)
        return url, payload(n, out, True, rng), out

    load = OpenLoop(make, rate / o.pd_scale, o.pd_seconds, poisson=True, stream_share=1.0,
                    max_inflight=4000, timeout_s=600.0, seed=o.seed, record_gaps=True)
    run_loop(load.run())
    s = o.pd_scale
    side = Side(name, rate, requests=len(load.arrivals),
                failed=sum(1 for a in load.arrivals if a.error))
    ok = [(classes[i], a) for i, a in enumerate(load.arrivals) if a.error is None and a.ttft]
    for cls in ("short", "long"):
        ttft = [a.ttft * 1e3 / s for c, a in ok if c == cls and a.ttft is not None]
        p50, p99 = stats.quantiles(ttft, (0.5, 0.99))
        setattr(side, f"ttft_{cls}_p50", p50)
        setattr(side, f"ttft_{cls}_p99", p99)
    gaps = [g * 1e3 / s for _, a in ok for g in (a.gaps or [])]
    side.gap_p99, side.gap_p999 = stats.quantiles(gaps, (0.99, 0.999))
    worst = [max(a.gaps) * 1e3 / s for _, a in ok if a.gaps]
    side.worst_gap_p50, side.worst_gap_p99 = stats.quantiles(worst, (0.5, 0.99))
    means = [sum(a.gaps) / len(a.gaps) * 1e3 / s for _, a in ok if a.gaps]
    side.mean_itl_p50 = stats.quantile(means, 0.5)
    seconds = o.pd_seconds * s  # modelled
    good_worst = good_mean = 0
    for _, a in ok:
        if not a.gaps or a.ttft is None:
            continue
        ttft_ok = a.ttft * 1e3 / s <= o.slo_ttft_ms
        good_worst += ttft_ok and max(a.gaps) * 1e3 / s <= o.slo_worst_gap_ms
        good_mean += ttft_ok and sum(a.gaps) / len(a.gaps) * 1e3 / s <= o.slo_mean_itl_ms
    side.goodput_worst_gap = good_worst / seconds
    side.goodput_mean_itl = good_mean / seconds
    return side


# ---- the whole part --------------------------------------------------------------------------

def run_planner(o: Options, work: Path | None = None) -> PlannerBench:
    work = work or RESULTS / "planner-work"
    step = run_step(o, work / "step")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "planner-timeline.html").write_text(step.chart)
    pd = run_pd(o, work / "pd")
    return PlannerBench(step, pd)


def check(res: PlannerBench) -> str | None:
    bad = []
    if res.step.failed:
        bad.append(f"stepped load: {res.step.failed} failed requests")
    if any(s.failed for s in res.pd.sides):
        bad.append("P/D vs colocated: failed requests")
    return "; ".join(bad) or None


def report(res: PlannerBench) -> str:
    s, o = res.step, res.step.options
    lines = [
        f"Stepped load ({o['low']:g} -> {o['high']:g} -> {o['low']:g} modelled requests/s, "
        f"{o['phases']} intervals of {o['interval_s']:g} wall s, time scale "
        f"{o['step_scale']:g}; targets TTFT p95 {o['ttft_ms']:g} ms, gap p95 "
        f"{o['itl_ms']:g} ms; {o['nodes'] * 8} H100 in the cluster): "
        f"{s.requests} requests, {s.failed} failed.",
        "",
        "| t (wall s) | rate obs | rate pred | prefill | decode | rec. P | rec. D | TTFT p95 ms "
        "| gap p95 ms | |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for iv in s.intervals:
        lines.append(
            f"| {iv.t:.0f} | {fmt(iv.rate, '.1f')} | {fmt(iv.predicted, '.1f')} | {iv.prefill} "
            f"| {iv.decode} | {iv.rec_prefill} | {iv.rec_decode} | {fmt(iv.ttft_p95_ms, '.0f')} "
            f"| {fmt(iv.gap_p95_ms, '.1f')} | {'applied' if iv.applied else iv.hold or ''} |")
    rec = ", ".join("not within the run" if r is None else f"{r:g}"
                    for r in s.recovered_after)
    saved = 1 - s.accel_seconds / s.fixed_accel_seconds if s.fixed_accel_seconds else math.nan
    lines += [
        "",
        f"Intervals after each step (up, down) until TTFT p95 and gap p95 were both under "
        f"target: {rec}.",
        f"Accelerator-seconds: {s.accel_seconds:,.0f} used against {s.fixed_accel_seconds:,.0f}"
        f" for a fixed fleet of the peak ({s.peak_accelerators} accelerators) over the same "
        f"{s.duration_s:.0f} s: {saved:.0%} fewer.",
        "Pool changes (all by the planner): " + "; ".join(
            f"{c['t']:.0f} s {c['pool']} {c['from']}->{c['to']}" for c in s.changes),
        "Timeline chart: `bench-results/planner-timeline.html`.",
        "",
        "P/D against colocated at 8 H100 (20 % prompts 3,000-7,600 tokens, 80 % 100-300, "
        "150-300 output tokens, all streamed; modelled ms):",
        "",
        "| setup | req/s | TTFT short p50 / p99 | TTFT long p50 / p99 | gap p99 / p99.9 "
        "| worst gap p50 / p99 | mean ITL p50 | goodput TTFT+worst gap | goodput TTFT+mean ITL "
        "| failed |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for x in res.pd.sides:
        lines.append(
            f"| {x.setup} | {x.rate:g} | {fmt(x.ttft_short_p50, '.0f')} / "
            f"{fmt(x.ttft_short_p99, '.0f')} | {fmt(x.ttft_long_p50, '.0f')} / "
            f"{fmt(x.ttft_long_p99, '.0f')} | {fmt(x.gap_p99, '.1f')} / {fmt(x.gap_p999, '.1f')}"
            f" | {fmt(x.worst_gap_p50, '.0f')} / {fmt(x.worst_gap_p99, '.0f')} | "
            f"{fmt(x.mean_itl_p50, '.1f')} | {fmt(x.goodput_worst_gap, '.2f')} | "
            f"{fmt(x.goodput_mean_itl, '.2f')} | {x.failed} |")
    adv = res.pd.advisor
    lines += ["", f"SLOs: TTFT <= {Options().slo_ttft_ms:g} ms and worst gap <= "
              f"{Options().slo_worst_gap_ms:g} ms; TTFT <= {Options().slo_ttft_ms:g} ms and "
              f"mean ITL <= {Options().slo_mean_itl_ms:g} ms (goodput: such requests per "
              "modelled second).",
              f"Advisor on the P/D run's traffic: **{adv.get('decision')}** — "
              + "; ".join(adv.get("reasons", []))]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.planner", description=__doc__)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", choices=["step", "pd"])
    ap.add_argument("--prefill-max-inflight", type=int, default=None,
                    help="routing.prefill_max_inflight in the stepped load (default 4; 0: "
                         "no router prefill queue)")
    args = ap.parse_args(argv)
    o = Options.defaults(args.quick)
    if args.prefill_max_inflight is not None:
        o.prefill_max_inflight = args.prefill_max_inflight
    with interrupt_on_signals():
        if args.only == "pd":
            res = PlannerBench(StepResult({}, []), run_pd(o, RESULTS / "planner-work" / "pd"))
        elif args.only == "step":
            step = run_step(o, RESULTS / "planner-work" / "step")
            RESULTS.mkdir(exist_ok=True)
            (RESULTS / "planner-timeline.html").write_text(step.chart)
            res = PlannerBench(step, PdResult())
        else:
            res = run_planner(o)
    print(report(res))
    write_json(RESULTS / "planner.json", res)
    return 0 if check(res) is None else 1


if __name__ == "__main__":
    raise SystemExit(main())
