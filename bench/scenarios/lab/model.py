"""The lab scenario's options, constants and results: one guidellm run per profile, per
setup, and the whole run's workload and calibration."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.report import RESULTS_DIR, ROOT

GUIDELLM = ROOT / ".bench" / "venv-guidellm" / "bin" / "guidellm"
LAB_SETUPS = ("disagg", "colocated", "sim")
PROFILES = ("synchronous", "concurrent")
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def note(msg: str) -> None:
    """A progress line, with the time of day (setups take minutes)."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


@dataclass
class LabOptions:
    quick: bool = False
    setups: tuple[str, ...] = LAB_SETUPS
    work: Path = RESULTS_DIR / "lab-work"  # data files, guidellm outputs, logs
    model_dir: Path = ROOT / "lab-model"
    streams: int = 4  # the concurrent profile's
    sync_requests: int = 40
    sync_seconds: float = 120.0  # cap of the synchronous run
    conc_requests: int = 80
    conc_seconds: float = 120.0
    output_tokens: int = 64
    pdctl_root: Path | None = None  # the controllers' source tree (default: this checkout)
    real_from: Path | None = None  # take the setups not run now from this earlier result
    start_timeout: float = 420.0  # seconds allowed for vLLM engines to become ready
    idle_probe: float = 5.0  # seconds of idle CPU sampling with the engines up

    @staticmethod
    def defaults(quick: bool) -> LabOptions:
        if quick:
            return LabOptions(quick=True, sync_requests=12, sync_seconds=45, conc_requests=24,
                              conc_seconds=45)
        return LabOptions()


@dataclass
class ProfileResult:
    """One guidellm run against one setup."""

    requests_ok: int
    requests_errored: int
    duration_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    itl_p50_ms: float
    itl_p99_ms: float
    req_per_s: float
    output_tok_per_s: float
    ttft_p50_long_ms: float
    ttft_p50_short_ms: float
    n_long: int
    n_short: int
    cpu: dict[str, float] = field(default_factory=dict)
    guidellm_cmd: str = ""
    router: dict[str, dict[str, float]] = field(default_factory=dict)  # medians per path
    tail: list[dict[str, Any]] = field(default_factory=list)  # the slowest requests
    lease: dict[str, float] | None = None  # prefill KV lease counters after the run


@dataclass
class SetupResult:
    engines_ready_s: float | None = None
    idle_cpu: dict[str, float] = field(default_factory=dict)
    profiles: dict[str, ProfileResult] = field(default_factory=dict)
    error: str | None = None
    leftover_processes: list[str] = field(default_factory=list)
    setup_s: float = 0.0
    taken_from: str | None = None  # an earlier result file (--real-from)

    @staticmethod
    def from_json(d: dict[str, Any], source: str) -> SetupResult:
        profiles = {k: ProfileResult(**v) for k, v in (d.get("profiles") or {}).items()}
        known = {f.name for f in dataclasses.fields(SetupResult)} - {"profiles", "taken_from"}
        return SetupResult(**{k: v for k, v in d.items() if k in known}, profiles=profiles,
                           taken_from=source)


@dataclass
class LabResult:
    options: LabOptions
    started: str
    threshold: int
    max_model_len: int
    prompt_lengths: dict[str, dict[str, dict[str, float]]]
    data: dict[str, str]
    machine_cpus: int | None
    load_avg_1m_at_start: float
    setups: dict[str, SetupResult] = field(default_factory=dict)
    calibration: dict[str, float] | None = None
    total_s: float = 0.0
