"""The scale scenario's window summarized: achieved against offered rate, errors, client
latencies, where the CPU went, and the controller's own view (deltas between the /metrics
scraped at the window's edges, quantiles of its histograms as Prometheus estimates them)."""

from __future__ import annotations

import math

import psutil

from bench import prom, stats
from bench.loadgen import DROPPED, Arrival, OpenLoop
from bench.report import fmt
from bench.scenarios.scale.load import LoadObserved
from bench.scenarios.scale.model import (
    ROUTING_HIST,
    ControllerView,
    CpuUse,
    IdleCpu,
    ScaleOptions,
    Summary,
)
from bench.scenarios.scale.observe import CpuSnap, top_others


def ms_of(v: float) -> float:
    """Seconds as milliseconds to 2 decimals; NaN stays NaN."""
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
        ms_of(prom.histogram_quantile(ttft, 0.5)), ms_of(prom.histogram_quantile(ttft, 0.99)),
        parts, by_path, "")
    if not after.has(ROUTING_HIST + "_bucket"):
        view.routing_decision = f"unavailable (controller does not export {ROUTING_HIST})"
    else:
        d = after.buckets(ROUTING_HIST, before)
        view.routing_ms_p50 = ms_of(prom.histogram_quantile(d, 0.5))
        view.routing_ms_p99 = ms_of(prom.histogram_quantile(d, 0.99))
        view.routing_count = prom.histogram_count(d)
        view.routing_decision = (f"{fmt(view.routing_ms_p50, '')} / "
                                 f"{fmt(view.routing_ms_p99, '')} ms "
                                 f"(n={int(view.routing_count)})")
    return view


def handled_rate(before: prom.Page | None, after: prom.Page | None) -> float:
    """Requests the controller recorded per second between two scrapes (0.0 unknown)."""
    if before is not None and after is not None and after.answered_at > before.answered_at:
        handled = (after.sum("pdctl_requests_total") - before.sum("pdctl_requests_total"))
        return handled / (after.answered_at - before.answered_at)
    return 0.0


def cpu_use(s0: CpuSnap, s1: CpuSnap, done: int, handled: float, idle: IdleCpu) -> CpuUse:
    """Where the CPU went between two snapshots: cores and milliseconds per completed
    request (``done``) of the controller, the engines, this client and the rest."""
    wall = s1.t - s0.t
    ctl = s1.ctl - s0.ctl
    eng = sum(s1.engines[p] - s0.engines.get(p, 0.0) for p in s1.engines)
    cli = s1.client - s0.client
    busy = s1.machine_busy - s0.machine_busy
    return CpuUse(
        wall_s=round(wall, 2), controller_cores=round(ctl / wall, 2),
        controller_cpu_ms_per_req=round(ctl * 1e3 / done, 2),
        controller_cpu_ms_per_handled=(round(ctl / wall * 1e3 / handled, 2)
                                       if handled else math.nan),
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


def error_counts(win: list[Arrival]) -> dict[str, int]:
    errors: dict[str, int] = {}
    for a in win:
        if a.error:
            errors[a.error] = errors.get(a.error, 0) + 1
    return errors


def summarize_window(o: ScaleOptions, load: OpenLoop, seen: LoadObserved,
                     idle: IdleCpu) -> Summary:
    w0, w1 = load.window
    dur = w1 - w0
    win = [a for a in load.arrivals if w0 <= a.due < w1]
    ok_done_in_window = sum(1 for a in load.arrivals if a.error is None and w0 <= a.done < w1)
    errors = error_counts(win)
    ok = [a for a in win if a.error is None and a.done]
    ttft = [a.ttft for a in ok if a.stream and a.ttft is not None]
    e2e = [a.done - a.sent for a in ok if not a.stream]
    lag = [a.sent - a.due for a in win if a.sent]
    ttft_q, e2e_q, lag_q = (stats.quantiles_or_nan(v, (0.5, 0.99)) for v in (ttft, e2e, lag))
    summary = Summary(
        window_s=round(dur, 2), offered_rps=o.rate, arrivals_in_window=len(win),
        sent_rps=round(sum(1 for a in win if a.error != DROPPED) / dur, 1),
        achieved_rps=round(ok_done_in_window / dur, 1), ok_of_window_arrivals=len(ok),
        errors=errors, error_samples=load.error_samples, error_total=sum(errors.values()),
        error_share=round(sum(errors.values()) / len(win), 4) if win else math.nan,
        client_ttft_ms_p50=ms_of(ttft_q[0]), client_ttft_ms_p99=ms_of(ttft_q[1]),
        streamed_ok=len(ttft), client_e2e_ms_p50=ms_of(e2e_q[0]),
        client_e2e_ms_p99=ms_of(e2e_q[1]), send_lag_ms_p50=ms_of(lag_q[0]),
        send_lag_ms_p99=ms_of(lag_q[1]), peak_inflight=seen.peak_inflight,
        unfinished_at_end=load.unfinished, controller_peak_fds=seen.peak_fds,
        ready_min_during_run=seen.ready_min, cpu=None, controller=None)
    before, after = (seen.scrapes + [None, None])[:2]
    if len(seen.snaps) == 2:
        summary.cpu = cpu_use(seen.snaps[0], seen.snaps[1], max(1, ok_done_in_window),
                              handled_rate(before, after), idle)
    if after is not None:
        summary.controller = controller_view(before, after, w0)
    return summary
