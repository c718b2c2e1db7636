"""One observation per planner interval, in modelled time: what the request log, the router's
gap histogram and the engines' load say about the interval that just ended.

A simulated fleet run at ``sim.time_scale`` s answers s times faster in wall time than the
hardware it models: its wall latencies are divided by s and its wall rates multiplied by s,
so that targets and profiles are read in the modelled hardware's time."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from controller.models import Instance, Role
from controller.planner.decide import Observed
from controller.planner.predict import Traffic
from controller.requests_log import Columns
from pdctl_api.stats import quantile


@dataclass(frozen=True)
class Window:
    """What the planner read for one interval (wall units, as recorded)."""

    seconds: float
    columns: Columns  # the requests that finished in the interval
    gap_p95_s: float | None  # from the router's gap histogram, over the interval
    decode: list[Instance]  # ready decode instances
    prefill: list[Instance]
    arrived: int | None = None  # requests that arrived in the interval (the router's count)
    arrived_prompt_tokens: int = 0


def _p95(values: np.ndarray) -> float:
    return quantile(values, 0.95) or 0.0


def observe(w: Window, time_scale: float = 1.0) -> Observed:
    c = w.columns
    ok = c.select(c.ok)
    n = len(ok)
    s = time_scale
    span = w.seconds / s  # modelled seconds
    isl = ok.col("prompt_tokens")
    osl = ok.col("output_tokens")
    disagg = ok.select(ok.disagg)
    coloc = ok.select(~ok.disagg)
    itl = ok.col("itl_ms")
    itl = itl[itl > 0]
    prompt_total = float(isl.sum())
    running = [i.running for i in w.decode]
    # The rate and prompt length of what arrived (what finished lags it while queues grow);
    # output lengths are known only of what finished.
    # While a backlog drains more finish than arrive: the larger count keeps its capacity.
    arrived = max(w.arrived or 0, n)
    rate = arrived / span if span > 0 else 0.0
    isl_mean = (w.arrived_prompt_tokens / w.arrived
                if w.arrived and w.arrived >= n and w.arrived_prompt_tokens
                else float(isl.mean()) if n else 0.0)
    return Observed(
        requests=n,
        load=Traffic(request_rate=rate, prompt_tokens=isl_mean,
                  output_tokens=float(osl.mean()) if n else 0.0),
        ttft_p95_ms=_p95(ok.col("ttft_ms")) / s,
        itl_p95_ms=None if w.gap_p95_s is None else w.gap_p95_s * 1e3 / s,
        itl_mean_ms=float(itl.mean()) / s if itl.size else None,
        prefill_ms_mean=(float(disagg.col("prefill_ms").mean()) / s if len(disagg) else None),
        prefill_queue_p95_ms=_p95(disagg.col("queue_ms")) / s,
        decode_queue_p95_ms=max(_p95(disagg.col("decode_sched_ms")),
                                _p95(coloc.col("queue_ms"))) / s,
        decode_concurrency=sum(running) / len(running) if running else 0.0,
        disagg_token_share=(float(disagg.col("prompt_tokens").sum()) / prompt_total
                            if prompt_total > 0 else 1.0),
    )


def observed_json(o: Observed) -> dict[str, Any]:
    out = asdict(o)
    out["load"] = asdict(o.load)
    return out


def ready(instances: list[Instance], role: Role) -> list[Instance]:
    return [i for i in instances if i.role is role and i.state.routable]
