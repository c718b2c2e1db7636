"""The what-if benchmark's options and result: the discrete-event run's speed on a trace hour,
and its fidelity against the live simulated fleet through the real controller."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from bench.scenarios.cache.model import TRACE
from pdctl_api.schema.cluster import KvMode

WHATIF_MODEL = "llama-3.1-8b"
WHATIF_CONTEXT = 32768  # Mooncake's prompts average 12k tokens; most fit whole
WHATIF_HARDWARE = "h100-sxm"
WHATIF_LINK = "ib-ndr"
FIDELITY_PARTS = ("ttft", "queue", "prefill", "transfer", "decode_sched", "gap_p99")


@dataclass
class WhatIfOptions:
    trace: Path = TRACE
    speed_minutes: float = 60.0  # of the trace, on the speed layout
    speed_prefill: int = 4  # the speed run's 16-instance fleet (TP1 each)
    speed_decode: int = 12
    fidelity_requests: int = 300  # the live fleet's slice
    fidelity_start_s: float = 0.0
    fidelity_prefill: int = 2
    fidelity_decode: int = 2
    fidelity_rate_scale: float = 1.0
    time_scale: float = 1.0  # the live fleet's sim.time_scale
    skip_fidelity: bool = False
    # the real CPU lab (vLLM, this generated model) instead of the simulated fleet: 1 + 1 TP1,
    # lab-tiny on cpu-lab over host memory, as ``pdctl lab`` runs it
    lab_model_dir: Path | None = None
    kv_mode: KvMode = "pull"  # the hand-off of both sides: pull, or push (NixlPushConnector)

    @classmethod
    def defaults(cls, quick: bool) -> WhatIfOptions:
        if quick:
            return cls(speed_minutes=5.0, fidelity_requests=40)
        return cls()


@dataclass
class SpeedRun:
    requests: int = 0
    trace_s: float = 0.0  # the slice's span
    wall_s: float = 0.0  # the discrete-event run on this machine
    events: int = 0
    ttft_p50_ms: float = math.nan
    within_share: float = math.nan


@dataclass
class Fidelity:
    """One TTFT part's p50 and p90 (ms), live and discrete-event."""

    part: str
    live_p50: float = math.nan
    des_p50: float = math.nan
    live_p90: float = math.nan
    des_p90: float = math.nan

    @staticmethod
    def error(des: float, live: float) -> float:
        return (des - live) / live if live else math.nan

    @property
    def p50_error(self) -> float:
        return self.error(self.des_p50, self.live_p50)

    @property
    def p90_error(self) -> float:
        return self.error(self.des_p90, self.live_p90)


@dataclass
class WhatIfResult:
    options: WhatIfOptions
    speed: SpeedRun = field(default_factory=SpeedRun)
    fidelity: list[Fidelity] = field(default_factory=list)
    fidelity_requests: int = 0
    live_failed: int = 0
    live_wall_s: float = 0.0
    des_wall_s: float = 0.0
    error: str | None = None
