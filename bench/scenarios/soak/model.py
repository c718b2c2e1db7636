"""The soak's options, its result and the pure parts: the fault rotation, how each client
outcome is judged, and whether memory and file descriptors stayed flat."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from bench.loadgen import DROPPED, TIMEOUT, Arrival

FAULTS = ("kill-decode", "kill-prefill", "stall-prefill", "tp-change")
# Errors the client was told about (an HTTP error in OpenAI's shape, an error event ending a
# stream): allowed, a fault may cause them. Anything else is a request lost or wrong.
CLEAR_ERRORS = ("http ", "stream error event", "error body")
LEASE_S = 6  # kv.lease_s: the shortest the controller takes, so a stall outlives it soon
SOAK_MODEL = "llama-3-8b"
# The controller's request buffer, full within the first fifth of a full run (6 req/s): the
# memory check then compares a full buffer with a full buffer, so growth is a leak, not the
# 100,000 records the default keeps (about 3 KB each) filling up.
REQUEST_BUFFER = 2000


@dataclass
class SoakOptions:
    duration: float = 1800.0  # seconds of load
    rate: float = 6.0  # requests/s offered (Poisson)
    fault_every: float = 120.0  # seconds between faults, rotating through FAULTS
    sample_every: float = 5.0  # seconds between memory and descriptor samples
    planner_interval: float = 60.0
    prefill: int = 2
    decode: int = 2
    time_scale: float = 1.0
    timeout: float = 60.0  # the client gives up on a request after this
    seed: int = 1
    keep: bool = False

    @classmethod
    def defaults(cls, quick: bool) -> SoakOptions:
        if quick:  # every fault once, the planner deciding a few times
            return cls(duration=100.0, fault_every=20.0, planner_interval=15.0)
        return cls()


@dataclass
class SoakSample:
    t: float  # seconds since the load started
    rss_mb: float
    fds: int


@dataclass
class FaultDone:
    t: float
    kind: str
    target: str
    detail: str


@dataclass
class SoakResult:
    options: SoakOptions
    requests: int = 0
    ok: int = 0
    clear_errors: dict[str, int] = field(default_factory=dict)
    lost: dict[str, int] = field(default_factory=dict)  # by kind: hung, dropped, wrong
    lost_samples: dict[str, list[str]] = field(default_factory=dict)
    faults: list[FaultDone] = field(default_factory=list)
    samples: list[SoakSample] = field(default_factory=list)
    planner_changes: int = 0
    instance_failures: list[str] = field(default_factory=list)
    kv_handles_left: dict[str, int] = field(default_factory=dict)  # instance -> handles held
    processes_left: int = 0
    logs: str = ""
    wall_s: float = 0.0

    @property
    def lost_total(self) -> int:
        return sum(self.lost.values())

    def memory(self) -> dict[str, float]:
        """RSS (MB) of the controller: the median of the first and of the last fifth of the
        samples, their ratio, and the peak."""
        return _flat([s.rss_mb for s in self.samples])

    def descriptors(self) -> dict[str, float]:
        return _flat([float(s.fds) for s in self.samples])


def fault_at(k: int) -> str:
    """The k-th fault of the rotation."""
    return FAULTS[k % len(FAULTS)]


def judge(arrivals: list[Arrival], unfinished: int, res: SoakResult,
          samples: dict[str, list[str]]) -> None:
    """Count each arrival as ok, a clear error, or lost (into ``res``)."""
    res.requests = len(arrivals)
    for a in arrivals:
        if a.error is None:
            res.ok += 1
        elif a.error.startswith(CLEAR_ERRORS):
            res.clear_errors[a.error] = res.clear_errors.get(a.error, 0) + 1
        else:
            kind = "hung (client timeout)" if a.error == TIMEOUT else (
                "dropped by the client's cap" if a.error == DROPPED else a.error)
            res.lost[kind] = res.lost.get(kind, 0) + 1
            if a.error in samples:
                res.lost_samples[kind] = samples[a.error]
    if unfinished:
        res.lost["never finished"] = res.lost.get("never finished", 0) + unfinished


def _flat(values: list[float]) -> dict[str, float]:
    if not values:
        return {"first": 0.0, "last": 0.0, "ratio": 1.0, "peak": 0.0}
    fifth = max(1, len(values) // 5)
    first, last = statistics.median(values[:fifth]), statistics.median(values[-fifth:])
    return {"first": round(first, 1), "last": round(last, 1),
            "ratio": round(last / first, 3) if first else 1.0, "peak": round(max(values), 1)}


def problems(res: SoakResult, quick: bool) -> list[str]:
    """Why the soak failed: requests lost, state held, processes left, memory or descriptors
    that grew (judged on a full run only: a short one has not filled its buffers)."""
    out = []
    if res.lost_total:
        out.append(f"{res.lost_total} requests lost or wrong: {res.lost}")
    if res.kv_handles_left:
        out.append(f"KV handles still held after the lease: {res.kv_handles_left}")
    if res.processes_left:
        out.append(f"{res.processes_left} processes left behind")
    if len(res.faults) < (1 if quick else len(FAULTS)):
        out.append(f"only {len(res.faults)} faults injected")
    if not quick:
        mem, fds = res.memory(), res.descriptors()
        if mem["ratio"] > 1.25:
            out.append(f"controller memory grew {mem['first']} -> {mem['last']} MB")
        if fds["last"] > fds["first"] + 20:
            out.append(f"controller file descriptors grew {fds['first']:g} -> {fds['last']:g}")
    return out


def soak_config(o: SoakOptions) -> dict[str, Any]:
    """The controller's config: a small simulated 8B fleet, an engine process per instance
    (so one can be killed alone), the KV lease at its shortest, the planner applying."""
    return {
        "backend": "sim",
        "model": {"name": SOAK_MODEL},
        "hardware": {"accelerator": "h100-sxm", "accelerators_per_node": 8, "nodes": 1},
        "pools": {"prefill": {"size": o.prefill, "tp": 1},
                  "decode": {"size": o.decode, "tp": 1}},
        "routing": {"disagg_min_prompt_tokens": 512},
        "kv": {"lease_s": LEASE_S},
        "sim": {"time_scale": o.time_scale, "processes": 0},
        "planner": {"mode": "apply", "interval_s": o.planner_interval, "min_requests": 10,
                    "ttft_ms": 2000.0, "max_prefill": 3, "max_decode": 3},
        "controller": {"health_interval_s": 1.0, "start_timeout_s": 120.0,
                       "request_buffer": REQUEST_BUFFER},
    }
