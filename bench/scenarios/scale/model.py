"""The scale scenario's options, fleet and results: the simulated fleet's config and
modelled capacity, and what is recorded of its start, its idle and loaded CPU, the
controller's view of the window, and its cleanup."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from bench.fleet import SIM_HARDWARE, SIM_MODEL_70B
from pdctl_api import profiles

PREFILL_TP, DECODE_TP, PER_NODE = 4, 2, 8
ROUTING_HIST = "pdctl_routing_decision_seconds"


@dataclass
class ScaleOptions:
    rate: float = 1000.0  # offered requests/s
    duration: float = 25.0  # measured seconds
    warmup: float = 8.0  # seconds of load before measuring
    prefill: int = 16
    decode: int = 48
    time_scale: float = 0.1
    poisson: bool = True  # else evenly spaced arrivals
    prompt_tokens: tuple[int, int] = (1024, 1536)  # estimated tokens (bytes / 4)
    max_tokens: int = 16
    stream_share: float = 0.25
    timeout: float = 15.0  # the client gives up on a request after this many seconds
    max_inflight: int = 1000  # arrivals beyond this many open requests are dropped
    start_timeout: float = 180.0  # controller start_timeout_s per instance
    idle: float = 5.0  # seconds of idle CPU measurement with the fleet ready
    engine_nice: int = 0
    sim_processes: int = 2  # sim.processes: host processes for all engines; 0: one each
    seed: int = 1
    keep: bool = False  # keep the work directory (logs)

    @staticmethod
    def defaults(quick: bool) -> ScaleOptions:
        if quick:
            return ScaleOptions(rate=200.0, duration=10.0, warmup=4.0, prefill=4, decode=12)
        return ScaleOptions()


def processes_phrase(n: int) -> str:
    """How the engines are hosted, in words."""
    return f"engines on {n} sim host process(es)" if n else "a process per engine"


def nodes_for(prefill: int, decode: int) -> int:
    # Both TPs divide the node size, so any packing is exact.
    return max(1, math.ceil((prefill * PREFILL_TP + decode * DECODE_TP) / PER_NODE))


def scale_config(o: ScaleOptions) -> dict[str, Any]:
    """The controller's config: the simulated fleet of ``o``."""
    return {
        "backend": "sim",
        "model": {"name": SIM_MODEL_70B},
        "hardware": {"accelerator": SIM_HARDWARE, "accelerators_per_node": PER_NODE,
                     "nodes": nodes_for(o.prefill, o.decode), "kv_link": "ib-ndr"},
        "pools": {"prefill": {"size": o.prefill, "tp": PREFILL_TP},
                  "decode": {"size": o.decode, "tp": DECODE_TP}},
        "routing": {"disagg_min_prompt_tokens": 512},
        "sim": {"time_scale": o.time_scale, "processes": o.sim_processes},
        # Everything else at its default (health every 2 s, engine /metrics every 1 s), except
        # a start limit that 64 engines starting at once on 2 shared cores can meet.
        "controller": {"start_timeout_s": float(o.start_timeout)},
    }


def modelled_capacity(o: ScaleOptions) -> float:
    """Prefills per wall second the modelled prefill pool can do for the mean prompt."""
    m, hw = profiles.model(SIM_MODEL_70B), profiles.hardware(SIM_HARDWARE)
    mean = sum(o.prompt_tokens) // 2
    return o.prefill / (profiles.step_seconds(m, hw, PREFILL_TP, mean, 0, []) * o.time_scale)


@dataclass
class FleetStart:
    fleet_start_s: float  # controller spawned -> every instance ready
    controller_up_s: float
    instance_start_s_p50: float
    instance_start_s_max: float
    engine_processes: int


@dataclass
class IdleCpu:
    seconds: float
    controller_cores: float
    engines_cores: float


@dataclass
class CpuUse:
    wall_s: float
    controller_cores: float
    controller_cpu_ms_per_req: float
    controller_cpu_ms_per_handled: float  # per request the controller recorded
    controller_cpu_ms_per_req_above_idle: float
    engines_cores: float
    engines_cpu_ms_per_req: float
    engines_cpu_ms_per_req_above_idle: float
    engines_exited_in_window: int  # their CPU is lost (counted in "other")
    client_cores: float
    client_cpu_ms_per_req: float
    machine_busy_cores: float
    other_cores: float
    machine_cores: int | None
    top_other_processes: list[str]


@dataclass
class ControllerView:
    """What the controller's /metrics say about the window (deltas between two scrapes)."""

    start_s: float  # when the first scrape was answered, from the window's start
    end_s: float
    scrape_latency_s: list[float]
    ttft_ms_p50: float
    ttft_ms_p99: float
    ttft_parts_mean_ms: dict[str, float]
    requests_by_path: dict[str, int]
    routing_decision: str  # "p50 / p99 ms (n)" or why it is unavailable
    routing_ms_p50: float = math.nan
    routing_ms_p99: float = math.nan
    routing_count: float = 0.0


@dataclass
class Summary:
    window_s: float
    offered_rps: float
    arrivals_in_window: int
    sent_rps: float
    achieved_rps: float
    ok_of_window_arrivals: int
    errors: dict[str, int]
    error_samples: dict[str, list[str]]
    error_total: int
    error_share: float
    client_ttft_ms_p50: float
    client_ttft_ms_p99: float
    streamed_ok: int
    client_e2e_ms_p50: float
    client_e2e_ms_p99: float
    send_lag_ms_p50: float
    send_lag_ms_p99: float
    peak_inflight: int
    unfinished_at_end: int
    controller_peak_fds: int
    ready_min_during_run: dict[str, int]
    cpu: CpuUse | None
    controller: ControllerView | None


@dataclass
class Cleanup:
    stop_s: float
    controller_exit: int | None
    engines_left_after_sigterm: int
    processes_tracked: int
    engine_processes_left: int


@dataclass
class ScaleResult:
    options: ScaleOptions
    nodes: int
    modelled_prefill_capacity_rps: float
    cpu_count: int | None
    loadavg_before: tuple[float, float, float]
    loadavg_after: tuple[float, float, float] | None = None
    fleet: FleetStart | None = None
    idle: IdleCpu | None = None
    summary: Summary | None = None
    instance_failures: list[str] = field(default_factory=list)
    cleanup: Cleanup | None = None
    total_s: float = 0.0
    logs: str = ""
