"""``GET /api/v1/utilization``: each instance's and each pool's load over a window, bucket by
bucket, against the capacity the planner's performance profiles give.

The buckets are ``/api/v1/timeseries``'s (``t`` their starts, oldest first); every series is a
list aligned with ``t``, ``None`` where the instance had nothing in that bucket (before it
started, after it ended: its line stops). Engine load (running, waiting, KV cache usage) is the
mean of the controller's polls of the engine's /metrics in the bucket; token rates are the
finished requests' tokens: a prompt counts on the instance that computed it (the prefill
instance, or the decode instance of a colocated request) when its prefill ended, the output
tokens on the decode instance, spread over its decode. Rates and capacities are in the answer's
``clock``: modelled time on a scaled simulation (wall rate x ``time_scale``), else wall time.
KV cache usage and utilization are ratios (1.0 = 100 %)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pdctl_api.schema.common import InstanceState, Public, Role

RateClock = Literal["modelled", "wall"]


class CapacityPublic(Public):
    """What one instance carries at 100 %, read from the planner's performance profile of its
    engine, model, accelerator and TP; both rates ``None`` (and ``reason`` says why) where no
    profile fits."""

    profile: str | None = Field(None, description="the profile's key, e.g. "
                                "sim-llama-3-70b-h100-sxm-tp2")
    prompt_tokens_per_s: float | None = Field(None, description=(
        "prompt tokens per second one instance prefills at ``prompt_tokens``-token prompts"))
    output_tokens_per_s: float | None = Field(None, description=(
        "output tokens per second one instance decodes at ``context_tokens``-token contexts "
        "with the planner's ITL target met (the KV cache's room included)"))
    prompt_tokens: float | None = Field(None, description="the prompt length read")
    context_tokens: float | None = Field(None, description="the decode context length read")
    basis: str = Field(description="the capacity used and its basis, in words")
    reason: str | None = Field(None, description="why there is no capacity")


class LoadSeriesPublic(Public):
    """One instance's (or one pool's) figures per bucket, aligned with the answer's ``t``."""

    samples: list[int] = Field(description="load polls in the bucket (a pool: instances "
                               "polled)")
    running: list[float | None] = Field(description="mean requests running (a pool: summed)")
    waiting: list[float | None] = Field(description="mean requests waiting (a pool: summed)")
    kv_cache_usage: list[float | None] = Field(description=(
        "mean KV cache usage, 0..1 (a pool: the mean of its instances')"))
    prompt_tokens_per_s: list[float | None] = Field(description=(
        "prompt tokens prefilled per second (a pool: summed)"))
    output_tokens_per_s: list[float | None] = Field(description=(
        "output tokens decoded per second (a pool: summed)"))
    utilization: list[float | None] = Field(description=(
        "token rate / capacity (1.0 = 100 %); a decode instance's colocated prompts add their "
        "share of its prompt capacity; None: no capacity or nothing in the bucket"))


class InstanceLoadPublic(Public):
    id: str
    role: Role
    tp: int | None = Field(description="None: not known (an instance the controller forgot)")
    state: InstanceState | None = Field(None, description="now; None: no longer known to the "
                                        "controller")
    capacity: CapacityPublic
    series: LoadSeriesPublic


class LoadSummaryPublic(Public):
    """A pool over the whole window: the means of its buckets where it had any, and its
    utilization as all its tokens over all the capacity it had."""

    running: float | None = None
    waiting: float | None = None
    kv_cache_usage: float | None = None
    prompt_tokens_per_s: float | None = None
    output_tokens_per_s: float | None = None
    utilization: float | None = None


class PoolLoadPublic(Public):
    role: Role
    work: Literal["prompt", "output"] = Field(description=(
        "the tokens its capacity counts: prompt for prefill, output for decode"))
    instances: list[int] = Field(description="instances with a poll or a token in the bucket")
    capacity_tokens_per_s: list[float | None] = Field(description=(
        "the summed ``work`` capacity of those of them with a profile"))
    series: LoadSeriesPublic
    window: LoadSummaryPublic
    reason: str | None = Field(None, description="why its utilization is missing or partial")


class UtilizationPublic(Public):
    """``GET /api/v1/utilization?window_s=W&step_s=S``: per instance seen in the window (live
    or ended) and per pool."""

    window_s: float
    step_s: float
    now: float
    t: list[float] = Field(description="the buckets' starts (unix s), as /timeseries lays them")
    clock: RateClock = Field(description="the clock of the rates and capacities")
    time_scale: float = Field(description="wall seconds per modelled second (1: not scaled)")
    itl_target_ms: float = Field(description="the ITL target the decode capacity meets")
    basis: str = Field(description="how the figures are made, in words")
    instances: list[InstanceLoadPublic]
    pools: dict[Role, PoolLoadPublic]
