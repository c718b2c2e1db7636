"""The planner scenario's P/D against colocated at equal accelerators: each setup under a
mix of long and short prompts at each rate (every answer streamed), TTFT per prompt class,
inter-token gaps as the client read them, goodput under two SLOs, and the advisor's verdict."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

from bench import stats
from bench.fleet import ControllerProc, start_controller
from bench.loadgen import Arrival, OpenLoop
from bench.loadgen import run as run_loop
from bench.processes import ProcessFleet
from bench.scenarios.planner.model import PdResult, PlannerOptions, Side, base_config, payload

PD_SETUPS = {
    "P/D 1xTP4 + 1xTP4": {"prefill": {"size": 1, "tp": 4}, "decode": {"size": 1, "tp": 4}},
    "colocated 2xTP4": {"prefill": {"size": 0, "tp": 4}, "decode": {"size": 2, "tp": 4}},
}


def run_pd(o: PlannerOptions, work: Path) -> PdResult:
    out = PdResult()
    for name, pools in PD_SETUPS.items():
        cfg = base_config(1, o.pd_scale)
        cfg["pools"] = pools
        where = work / name.split()[0].replace("/", "")
        shutil.rmtree(where, ignore_errors=True)
        with ProcessFleet(where) as fleet:
            ctl = start_controller(fleet.workdir, cfg, fleet=fleet, wait="converged",
                                   timeout_s=120)
            for rate in o.pd_rates:
                out.sides.append(pd_side(o, ctl, name, rate))
            if name.startswith("P/D"):
                out.advisor = ctl.get("/advisor")["verdict"]
            ctl.stop()
    return out


def pd_side(o: PlannerOptions, ctl: ControllerProc, name: str, rate: float) -> Side:
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
    side = Side(name, rate, requests=len(load.arrivals),
                failed=sum(1 for a in load.arrivals if a.error))
    ok = [(classes[i], a) for i, a in enumerate(load.arrivals) if a.error is None and a.ttft]
    latencies(side, ok, o.pd_scale)
    goodput(side, ok, o)
    return side


def latencies(side: Side, ok: list[tuple[str, Arrival]], s: float) -> None:
    """TTFT per prompt class, gap quantiles, each answer's worst and mean gap, in modelled
    milliseconds (wall divided by the time scale ``s``)."""
    for cls in ("short", "long"):
        ttft = [a.ttft * 1e3 / s for c, a in ok if c == cls and a.ttft is not None]
        p50, p99 = stats.quantiles_or_nan(ttft, (0.5, 0.99))
        setattr(side, f"ttft_{cls}_p50", p50)
        setattr(side, f"ttft_{cls}_p99", p99)
    gaps = [g * 1e3 / s for _, a in ok for g in (a.gaps or [])]
    side.gap_p99, side.gap_p999 = stats.quantiles_or_nan(gaps, (0.99, 0.999))
    worst = [max(a.gaps) * 1e3 / s for _, a in ok if a.gaps]
    side.worst_gap_p50, side.worst_gap_p99 = stats.quantiles_or_nan(worst, (0.5, 0.99))
    means = [sum(a.gaps) / len(a.gaps) * 1e3 / s for _, a in ok if a.gaps]
    side.mean_itl_p50 = stats.quantile_or_nan(means, 0.5)


def goodput(side: Side, ok: list[tuple[str, Arrival]], o: PlannerOptions) -> None:
    """Requests per modelled second meeting TTFT + worst gap, and TTFT + mean ITL."""
    s = o.pd_scale
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
