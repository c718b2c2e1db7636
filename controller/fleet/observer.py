"""Observing the engines: process exits, health probes and /metrics polls, returned as values.

Nothing here changes an instance; the fleet loop hands what was observed to the registry,
which alone applies it.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import httpx

from controller.launchers.base import Launched, Launcher
from controller.models import Instance
from controller.vllm_metrics import sum_labelled, sum_series

LOAD_SERIES = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:kv_cache_usage_perc": "kv_usage",
    "vllm:nixl_xfer_time_seconds_sum": "nixl_xfer_s",
    "vllm:nixl_xfer_time_seconds_count": "nixl_xfers",
    "vllm:nixl_bytes_transferred_sum": "nixl_bytes",
    "vllm:nixl_num_kv_expired_reqs_total": "kv_expired",
    "vllm:nixl_num_notifications_after_expiry_total": "kv_after_expiry",
    "vllm:nixl_num_failed_transfers_total": "nixl_failed",
    "vllm:prompt_tokens_total": "prompt_tokens",
    "vllm:generation_tokens_total": "generation_tokens",
    # prometheus_client's process collector: vLLM's API server has it unless it runs several
    # API servers (multiprocess mode); a restarted engine's differs
    "process_start_time_seconds": "started",
}
# Cumulative series, by EngineLoad field: one going back means the engine started over.
CUMULATIVE = {"prompt_tokens": "vllm:prompt_tokens_total",
              "generation_tokens": "vllm:generation_tokens_total",
              "nixl_xfers": "vllm:nixl_xfer_time_seconds_count",
              "kv_expired": "vllm:nixl_num_kv_expired_reqs_total",
              "kv_after_expiry": "vllm:nixl_num_notifications_after_expiry_total",
              "nixl_failed": "vllm:nixl_num_failed_transfers_total"}
PROMPT_TOKENS_BY_SOURCE = "vllm:prompt_tokens_by_source_total"
METRICS_TIMEOUT_S = 2.0
OVERLOAD_MIN = 2  # timeouts in one sweep before "all timed out" reads as controller overload


@dataclass(frozen=True)
class EngineLoad:
    """One engine's /metrics, summed over its series (an engine may expose several)."""

    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float = 0.0
    nixl_xfers: float = 0.0  # cumulative, vllm:nixl_xfer_time_seconds_count
    nixl_xfer_s: float = 0.0  # cumulative, vllm:nixl_xfer_time_seconds_sum
    nixl_bytes: float = 0.0  # cumulative, vllm:nixl_bytes_transferred_sum
    kv_expired: float = 0.0  # cumulative, vllm:nixl_num_kv_expired_reqs (prefill side)
    kv_after_expiry: float = 0.0  # cumulative, vllm:nixl_num_notifications_after_expiry
    nixl_failed: float = 0.0  # cumulative, vllm:nixl_num_failed_transfers (decode side)
    prompt_tokens: float = 0.0  # cumulative, vllm:prompt_tokens_total
    generation_tokens: float = 0.0  # cumulative, vllm:generation_tokens_total
    started: float = 0.0  # unix s, process_start_time_seconds (0: the engine does not say)
    # cumulative, vllm:prompt_tokens_by_source{source="local_compute"}: prompt tokens the
    # engine computed itself (None: it does not say)
    local_compute: float | None = None

    @classmethod
    def parse(cls, text: str) -> EngineLoad:
        return cls(**parse_load(text))


def parse_load(text: str) -> dict[str, float]:
    """Sum the load and NIXL series of a vLLM /metrics page, by ``EngineLoad`` field."""
    out = {LOAD_SERIES[name]: v for name, v in sum_series(text, LOAD_SERIES).items()}
    local = sum_labelled(text, PROMPT_TOKENS_BY_SOURCE, "source", "local_compute")
    if local is not None:
        out["local_compute"] = local
    return out


def restart_reason(before: EngineLoad, now: EngineLoad) -> str | None:
    """Why two polls of the same address read as two engine processes, or None.

    An engine restarted behind the same address (a pod restarted in place, an engine an
    operator ran again) is a new engine: the KV handles the old one gave out are void and its
    prefix cache is empty. Told by its process start time where the engine exports one, else
    by a cumulative counter going back (Prometheus's own rule for a counter reset)."""
    if before.started and now.started and now.started != before.started:
        return (f"its process start time moved from {before.started:.0f} to "
                f"{now.started:.0f} (unix s)")
    for field_name, series in CUMULATIVE.items():
        was, is_ = getattr(before, field_name), getattr(now, field_name)
        if is_ < was:
            return f"its {series} went back from {was:g} to {is_:g}"
    return None


class Probe(enum.Enum):
    OK = "ok"
    DOWN = "down"  # refused, reset, or answered with an error
    TIMEOUT = "timeout"


@dataclass(frozen=True)
class SweepVerdict:
    failed: tuple[bool, ...]  # per probe: counts as a failed health check
    ready: int  # ready instances probed
    uncounted: int  # their timeouts not counted (most of them timed out at once)

    @property
    def overloaded(self) -> bool:
        return self.uncounted > 0


def count_failures(sweep: Sequence[tuple[bool, Probe]]) -> SweepVerdict:
    """Which probes of one health sweep count against their instance. ``sweep`` holds
    ``(starting, result)`` per probed instance.

    An instance that refuses or answers with an error always counts. A timeout counts unless
    most ready instances timed out in the same sweep: engines do not all hang at once, but a
    controller starved of CPU sees every probe time out -- failing the whole fleet then would
    turn an overload into an outage. Starting instances never count (the start timeout
    covers them)."""
    ready = [r for starting, r in sweep if not starting]
    timeouts = sum(r is Probe.TIMEOUT for r in ready)
    starved = timeouts >= OVERLOAD_MIN and timeouts * 2 > len(ready)
    return SweepVerdict(
        tuple(not starting and (r is Probe.DOWN or (r is Probe.TIMEOUT and not starved))
              for starting, r in sweep),
        len(ready), timeouts if starved else 0)


def launched(inst: Instance) -> Launched:
    assert isinstance(inst.handle, Launched)
    return inst.handle


class Observer:
    """Asks the launcher and the engines; returns what it saw."""

    def __init__(self, launcher: Launcher, client: httpx.AsyncClient, health_timeout_s: float
                 ) -> None:
        self.launcher = launcher
        self.client = client
        self.health_timeout_s = health_timeout_s

    async def exits(self, instances: Iterable[Instance]) -> dict[str, str]:
        """Why each launched instance whose engine has ended is gone."""
        mine = [i for i in instances if i.handle is not None]
        await self.launcher.refresh([launched(i) for i in mine])
        out = {}
        for inst in mine:
            why = self.launcher.exit_reason(launched(inst))
            if why is not None:
                out[inst.id] = why
        return out

    async def probe(self, instances: Sequence[Instance]) -> list[Probe]:
        return list(await asyncio.gather(*(self._probe(i) for i in instances)))

    async def _probe(self, inst: Instance) -> Probe:
        if not inst.url:  # still being placed: nothing to ask yet
            return Probe.DOWN
        try:
            r = await self.client.get(f"{inst.url}/health", timeout=self.health_timeout_s)
        except httpx.TimeoutException:
            return Probe.TIMEOUT
        except httpx.HTTPError:
            return Probe.DOWN
        return Probe.OK if r.status_code == 200 else Probe.DOWN

    async def poll(self, instances: Sequence[Instance]) -> dict[str, EngineLoad]:
        """The parsed /metrics of each instance that answered."""
        texts = await asyncio.gather(*(self._metrics(i) for i in instances))
        return {i.id: EngineLoad.parse(t) for i, t in zip(instances, texts, strict=True)
                if t is not None}

    async def _metrics(self, inst: Instance) -> str | None:
        try:
            r = await self.client.get(f"{inst.url}/metrics", timeout=METRICS_TIMEOUT_S)
            return r.text if r.status_code == 200 else None
        except httpx.HTTPError:
            return None

    async def close(self) -> None:
        await self.client.aclose()
