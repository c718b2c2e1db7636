"""The hand-off scenario's options, constants and results: the workloads (trace slices and a
synthetic short load), the hand-off policies compared, one record per policy run."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from bench.report import traces_dir
from bench.scenarios.router.model import Goal

MOONCAKE = traces_dir() / "mooncake_conversation.jsonl"
AZURE = traces_dir() / "azure_llm_2023_conv.csv"
# The fleet is the cache-aware benchmark's (bench.scenarios.cache.model): llama-3.1-70b on
# h100-sxm, 4 + 4 TP4 instances.

LOCAL = 10_000_000  # a threshold above any prompt: always local (the setting's maximum)
THRESHOLDS = (0, 2048, 8192, 16384, 32768, LOCAL)
QUICK_THRESHOLDS = (0, 8192, LOCAL)
SLO = "slo"
HIGH, LOW, SYNTH, AZURE_LOAD = "mooncake high", "mooncake low", "short synthetic", "azure conv"


def threshold_policy(tokens: int) -> str:
    return f"threshold:{tokens}"


def policy_threshold(policy: str) -> int | None:
    """The threshold of a ``threshold:N`` policy, None for ``slo``."""
    kind, _, n = policy.partition(":")
    return int(n) if kind == "threshold" else None


def policy_label(policy: str) -> str:
    """``always-disagg``, ``always-local``, ``threshold 8k`` or ``slo``."""
    t = policy_threshold(policy)
    if t is None:
        return policy
    if t == 0:
        return "always-disagg"
    if t >= LOCAL:
        return "always-local"
    return f"threshold {t // 1024}k" if t % 1024 == 0 else f"threshold {t}"


@dataclass
class Workload:
    """One load replayed: a trace slice at a rate scale (or the synthetic short trace)."""

    name: str
    trace: Path
    start_s: float
    limit: int
    rate_scale: float
    short: bool = False  # a short-prompt workload: slo is held against always-local
    prompt_mean: float = math.nan  # facts, filled when the run starts
    output_mean: float = math.nan
    rate: float = math.nan  # requests per second after the rate scale
    prefill_util: float = math.nan  # modelled prefill work (no hits) / the prefill pool's time
    fleet_util: float = math.nan  # ... / every engine's time (prefill and decode pools)


@dataclass
class HandoffOptions:
    trace: Path = MOONCAKE
    azure: Path = AZURE
    start_s: float = 600.0  # the Mooncake slice: from 600 s ...
    limit: int = 300  # ... its next 300 requests (~90 s of trace at the trace's rate)
    high: float = 1.5  # rate scales: the higher load (prefill pool ~1.6x over without hits)
    low: float = 0.6  # ... the lower one (~0.65 of the prefill pool)
    azure_start_s: float = 600.0
    azure_limit: int = 300  # ~55 s of the Azure conversation trace (~5.5 requests/s)
    azure_rate_scale: float = 1.0
    synth_requests: int = 300  # the synthetic short load: prompts 64-768, outputs 16-96
    synth_rate: float = 8.0  # its requests per (modelled) second, Poisson
    time_scale: float = 0.5  # the sim engines' and the replay's: modelled time runs 2x wall
    ttft_ms: float = 3000.0  # goodput's TTFT target (modelled ms), also routing's target
    gap_ms: float = 150.0  # goodput's per-request gap p99 target (modelled ms), also routing's
    thresholds: tuple[int, ...] = THRESHOLDS  # the fixed thresholds swept at the higher load
    rounds: int = 1  # interleaved repetitions of every policy
    sim_processes: int = 2
    quick: bool = False

    @staticmethod
    def defaults(quick: bool) -> HandoffOptions:
        if not quick:
            return HandoffOptions()
        return HandoffOptions(limit=100, azure_limit=100, synth_requests=100,
                              thresholds=QUICK_THRESHOLDS, quick=True)


@dataclass
class HandoffRun:
    """One hand-off policy replaying one workload on a fresh (cold) fleet. Times are modelled
    (wall ms divided by the time scale)."""

    workload: str
    round: int
    policy: str  # "threshold:N" or "slo"
    error: str | None = None
    requests: int = 0
    ok: int = 0
    failed: int = 0
    failed_by_reason: dict[str, int] = field(default_factory=dict)
    ttft_mean_ms: float = math.nan
    ttft_p50_ms: float = math.nan
    ttft_p90_ms: float = math.nan
    ttft_p99_ms: float = math.nan
    gap_p99_ms: float = math.nan
    goodput: int = 0  # requests within both targets
    goodput_per_s: float = math.nan  # per modelled second of the run
    wall_s: float = math.nan
    ttft_mean_by_class: dict[str, float] = field(default_factory=dict)  # replay's classes
    disaggregated: int = 0  # the controller's records: decided disaggregated
    local: int = 0  # ... decided local
    reasons: dict[str, int] = field(default_factory=dict)  # decisions by kind of reason
    by_decision: dict[str, dict[str, float]] = field(default_factory=dict)  # means per decision
    sim_lag_s: float = 0.0  # engines' pdctl_sim_lag_seconds_total: modelled time run late
    log: str = ""

    @property
    def label(self) -> str:
        return policy_label(self.policy)


@dataclass
class HandoffResult:
    options: HandoffOptions
    workloads: list[Workload]
    runs: list[HandoffRun]
    best_threshold: int | None  # the fixed threshold with the best mean TTFT at the high load
    handoff_goals: list[Goal]
    records_file: str = ""
    argv: dict[str, list[str]] = field(default_factory=dict)
    workdir: str = ""
