"""The planner scenario's options, controller config, request body and results: the
stepped load's planner intervals and accelerator-seconds, and P/D against colocated."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

from bench.fleet import SIM_HARDWARE, SIM_MODEL_70B
from bench.loadgen import body


@dataclass
class PlannerOptions:
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
    only: str | None = None  # "step" or "pd": run that half only

    @classmethod
    def defaults(cls, quick: bool) -> PlannerOptions:
        if quick:
            return cls(step_scale=2.0, interval_s=10.0, low=2.0, high=12.0, phases=(2, 6, 6),
                       nodes=8, pd_rates=(5.0,), pd_seconds=40.0)
        return cls()


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
class PlannerStepResult:
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
    step: PlannerStepResult
    pd: PdResult


def base_config(nodes: int, scale: float) -> dict[str, Any]:
    """The controller's config both halves start from (pools and planner added)."""
    return {
        "backend": "sim",
        "model": {"name": SIM_MODEL_70B},
        "hardware": {"accelerator": SIM_HARDWARE, "nodes": nodes, "kv_link": "ib-ndr"},
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
    """A completion of random token ids (no prefix shared with another request)."""
    prompt = [rng.randrange(10, 100_000) for _ in range(prompt_tokens)]
    return body({"model": SIM_MODEL_70B, "prompt": prompt, "max_tokens": output_tokens,
                 "stream": stream, "ignore_eos": True, "temperature": 0})
