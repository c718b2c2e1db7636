"""The cache scenario's options, constants and results: the trace slice and its scales, the
simulated fleet, the policies compared, one record per policy run, the router CPU sweep."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from bench.report import traces_dir
from bench.scenarios.router.model import DEFAULT_ROUTER, Goal

TRACE = traces_dir() / "mooncake_conversation.jsonl"
MODEL = "llama-3.1-70b"  # 131,072 tokens of context: the trace's prompts reach ~125k
CACHE_HARDWARE = "h100-sxm"
TP = 4
PREFILL = DECODE = 4
NODES = 4  # x 8 accelerators: the 32 the eight TP4 instances take
DISAGG_MIN_PROMPT = 512  # the controller's default routing.disagg_min_prompt_tokens
# pdctl's policies (both pools), then vllm-router 0.1.17's cache_aware (both pools)
CACHE_POLICIES = ("round_robin", "least_loaded", "cache_aware", "vllm-router")
# more pdctl policies --policies may name: PREFILL/DECODE, a policy per pool
MIXED_POLICIES = ("cache_aware/least_loaded",)
CPU_SWEEP_TOKENS = (1024, 4096, 12288, 32768)
SWEEP_POLICIES = ("round_robin", "cache_aware")
RATE_TOKENS = 12288  # the prompt length of the max-rate measurement


@dataclass
class CacheOptions:
    trace: Path = TRACE
    start_s: float = 600.0  # the slice: from 600 s into the trace ...
    limit: int = 600  # ... its next 600 requests (~183 s of trace, 3.3 req/s)
    rate_scale: float = 1.0  # the trace's own rate: ~97% of the prefill pool's compute
    time_scale: float = 0.5  # the sim engines' and the replay's: modelled time runs 2x wall
    ttft_ms: float = 3000.0  # goodput's TTFT target, modelled ms
    gap_ms: float = 150.0  # goodput's target for each request's own inter-token gap p99
    rounds: int = 1  # interleaved repetitions of every policy
    policies: tuple[str, ...] = CACHE_POLICIES
    sim_processes: int = 2  # sim host processes the eight engines share
    vllm_router: Path | None = DEFAULT_ROUTER  # None: pdctl's policies only
    sweep: bool = True  # the router CPU sweep (instant engines)
    sweep_requests: int = 1000  # per length and policy (CPU time ticks are 10 ms)
    sweep_concurrency: int = 4
    rate_seconds: float = 5.0  # the max-rate measurement, per policy
    rate_concurrency: int = 32
    quick: bool = False

    @staticmethod
    def defaults(quick: bool) -> CacheOptions:
        if not quick:
            return CacheOptions()
        return CacheOptions(limit=120, sweep_requests=200, rate_seconds=2.0, quick=True)


@dataclass
class PolicyRun:
    """One policy replaying the slice on a fresh (cold) fleet. Times are modelled: the
    client's wall milliseconds divided by the time scale."""

    round: int
    policy: str
    router: str  # "pdctl" or "vllm-router"
    error: str | None = None  # why the run did not finish (then the figures are missing)
    requests: int = 0
    ok: int = 0
    refused: int = 0  # answered 429
    failed: int = 0  # every other failure
    failed_by_reason: dict[str, int] = field(default_factory=dict)
    ttft_p50_ms: float = math.nan
    ttft_p90_ms: float = math.nan
    ttft_p99_ms: float = math.nan
    gap_p99_ms: float = math.nan
    goodput: int = 0  # requests within both targets
    goodput_per_s: float = math.nan  # per modelled second of the run
    wall_s: float = math.nan
    prefill_hits: float = 0.0  # prefill engines' vllm:prefix_cache_hits_total growth
    prefill_queries: float = 0.0  # ... vllm:prefix_cache_queries_total growth
    decode_hits: float = 0.0  # decode engines' (their own lookups before pulling)
    decode_queries: float = 0.0
    client_cached_share: float = math.nan  # usage.prompt_tokens_details as the client saw it
    kv_bytes: float = 0.0  # decode engines' vllm:nixl_bytes_transferred_sum growth
    kv_pulls: float = 0.0
    sim_lag_s: float = 0.0  # engines' pdctl_sim_lag_seconds_total: modelled time run late
    router_cpu_s: float = math.nan  # the router process's CPU over the replay
    router_idle_cpu_pct: float = math.nan  # its CPU share of a core before the replay
    predicted_share: float = math.nan  # pdctl: cached_tokens_predicted / prompt tokens
    log: str = ""

    @property
    def hit_rate(self) -> float:
        return self.prefill_hits / self.prefill_queries if self.prefill_queries else math.nan

    @property
    def kv_bytes_per_request(self) -> float:
        return self.kv_bytes / self.ok if self.ok else math.nan

    @property
    def router_cpu_us_per_request(self) -> float:
        return self.router_cpu_s / self.requests * 1e6 if self.requests else math.nan


@dataclass
class SweepCell:
    tokens: int
    policy: str
    requests: int
    errors: int
    controller_cpu_s: float

    @property
    def cpu_us_per_request(self) -> float:
        return self.controller_cpu_s / self.requests * 1e6 if self.requests else math.nan


@dataclass
class RateCell:
    policy: str
    tokens: int
    concurrency: int
    rps: float
    errors: int
    controller_cpu_us_per_request: float  # over the measurement

    @property
    def cpu_bound_rps(self) -> float:
        """What one core of the controller's alone could serve at this CPU per request."""
        us = self.controller_cpu_us_per_request
        return 1e6 / us if us and not math.isnan(us) else math.nan


@dataclass
class Sweep:
    cells: list[SweepCell] = field(default_factory=list)
    rate: list[RateCell] = field(default_factory=list)
    error: str | None = None


@dataclass
class CacheResult:
    options: CacheOptions
    slice_requests: int
    slice_span_s: float  # trace seconds
    slice_rate: float  # requests per trace second
    slice_prompt_mean: float
    slice_prompt_max: int
    prefill_utilization: float  # modelled prefill work without hits / the pool's time
    bound_prefill: float  # the LRU bound with the prefill pool's capacity
    bound_fleet: float  # ... with every engine's (prefill and decode pools)
    bound_infinite: float  # ... with no eviction
    capacity_blocks_prefill: int
    capacity_blocks_fleet: int
    runs: list[PolicyRun]
    sweep: Sweep
    goals: list[Goal]
    argv: dict[str, list[str]] = field(default_factory=dict)
    workdir: str = ""
