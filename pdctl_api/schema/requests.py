"""Finished requests and their statistics: ``/api/v1/requests`` (each request and where its
time to first token went), ``/stats`` (a window's aggregates) and ``/timeseries`` (the same,
bucket by bucket)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pdctl_api.schema.common import Public, RequestPath, Role

PARTS = ("queue", "prefill", "transfer", "decode_sched", "overhead")  # TTFT, in this order


# ---- requests ------------------------------------------------------------------------------


class RequestPublic(Public):
    """``GET /api/v1/requests``: one finished request and where its TTFT went (ms): the five
    parts add up to ``ttft_ms``."""

    id: str
    started_at: float
    endpoint: str
    path: RequestPath
    status: str = Field(description="ok | error (the fleet failed it) | cancelled (the client "
                        "left) | rejected (refused: a malformed request, admission control)")
    stream: bool
    prompt_tokens: int
    output_tokens: int
    prefill_instance: str | None = None
    decode_instance: str | None = None
    queue_ms: float = Field(description=(
        "waiting to be scheduled: in the router's prefill queue, then in the engine that "
        "computed the prompt"))
    prefill_ms: float = Field(description="scheduled -> first token on that engine")
    transfer_ms: float = Field(description="the KV pull on the decode engine (disaggregated)")
    decode_sched_ms: float = Field(description=(
        "the decode engine's wait after the KV arrived, and its own first token"))
    overhead_ms: float = Field(description="the rest: the router, HTTP hops, retries")
    ttft_ms: float
    itl_ms: float = Field(description="mean inter-token latency, as the engine reports it")
    e2e_ms: float
    kv_bytes: int
    retries: int
    error: str | None = None
    kv_handle: str | None = Field(None, description=(
        "the prefill engine's id of the KV the decode hop read (vLLM's remote_request_id)"))
    suspect: bool = Field(False, description=(
        "its prefill engine reported a read of that KV after it had freed it"))
    gap_p99_ms: float = Field(0.0, description="streamed answers: the 99th percentile of the "
                              "gaps between the chunks the router relayed (0: not streamed)")
    gap_max_ms: float = Field(0.0, description="streamed answers: the worst gap")
    cached_tokens_predicted: int | None = Field(None, description=(
        "prompt tokens the router expected the instance that computed the prompt (the "
        "prefill instance, or the decode instance on the colocated path) to hold in its "
        "prefix cache, from the engines' KV events; null when no pool routes by cache"))
    cached_tokens: int | None = Field(None, description=(
        "prompt tokens that engine reported served from its prefix cache "
        "(usage.prompt_tokens_details.cached_tokens); null when it reports none"))
    decode_cached_tokens_predicted: int | None = Field(None, description=(
        "disaggregated: prompt tokens the decode instance already held, whose KV was not "
        "pulled over NIXL (from the KV events)"))
    decision: Literal["disaggregated", "local"] | None = Field(None, description=(
        "the hand-off decision (routing.disagg_policy); the path can differ when the "
        "prefill hop failed"))
    decision_reason: str | None = Field(None, description="why, in words")
    kv_fallback: bool = Field(False, description=(
        "routed disaggregated, but its decode engine computed the prompt itself: the KV "
        "never arrived (silent fallback)"))


# ---- a window's statistics -----------------------------------------------------------------


class Percentiles(Public):
    p50: float
    p90: float
    p95: float | None = None  # None from an older controller
    p99: float
    mean: float
    max: float


class Components(Public):
    """One summary per TTFT part."""

    queue: Percentiles
    prefill: Percentiles
    transfer: Percentiles
    decode_sched: Percentiles
    overhead: Percentiles

    def part(self, name: str) -> Percentiles:
        value: Percentiles = getattr(self, name)
        return value


class KvWindowPublic(Public):
    bytes: float
    bytes_per_s: float
    transfer_gbps: float


class PathStats(Public):
    """One path's requests in a window: how many, failed, retried; TTFT and KV transfer."""

    requests: int
    failed: int = Field(description="ended in an error (not cancelled by the client)")
    retries: int = Field(description="hops retried on another instance, summed")
    ttft_ms: Percentiles
    transfer_ms: Percentiles


class TransferShare(Percentiles):
    """transfer_ms / ttft_ms over disaggregated requests, and the alert on its median."""

    alert_share: float
    alert: bool


class NixlTotals(Public):
    transfers: float
    bytes: float
    seconds: float
    gbps: float


class PoolUtilization(Public):
    ready_instances: int
    inflight: int
    running: float
    waiting: float
    busy_share: float
    kv_cache_usage_mean: float
    nixl: NixlTotals


class KvIntegrityPublic(Public):
    """Reads of KV blocks a prefill engine had already freed (lease expired)."""

    expired_requests: float = 0.0
    notifications_after_expiry: float = 0.0
    expired_in_window: float = 0.0
    after_expiry_in_window: float = 0.0
    suspect_requests: int = 0
    alert: bool = False


class FallbackPairPublic(Public):
    prefill: str
    decode: str
    requests: int


class HandoffPublic(Public):
    """The window's hand-off decisions (``routing.disagg_policy``) and the silent fallbacks:
    requests routed disaggregated whose decode engine computed the prompt itself, and a
    prefill pool that served nothing while disaggregation was on."""

    policy: str
    decided_disaggregated: int = 0
    decided_local: int = 0
    served_disaggregated: int = Field(0, description=(
        "requests that went through a prefill instance (a failed prefill hop is served "
        "colocated although decided disaggregated)"))
    no_prefill: int = Field(0, description=(
        "requests that would have gone disaggregated but found no ready prefill instance"))
    fallback_requests: int = 0
    fallback_pairs: list[FallbackPairPublic] = Field(default_factory=list)
    prefill_idle: bool = Field(False, description=(
        "disaggregation is on (a prefill pool is wanted) but the prefill pool served none of "
        "the window's requests that should have gone through it"))
    alerts: list[str] = Field(default_factory=list, description="what is wrong, in words")


class AdmissionPublic(Public):
    """Admission control now: client requests in flight against ``routing.max_inflight``
    (0: no limit), and the requests refused with 429 since the controller started."""

    inflight: int
    max_inflight: int
    max_inflight_per_instance: int
    refused_total: int
    prefill_waiting: int = 0  # in the router's prefill queue (0 from an older controller)


class StatsPublic(Public):
    """``GET /api/v1/stats?window_s=N``."""

    window_s: float
    covered_s: float | None = Field(None, description=(
        "seconds of the window the controller recorded requests in (its uptime when shorter "
        "than the window): request_rate and kv.bytes_per_s divide by this; None from an "
        "older controller, which divided by window_s"))
    requests: int
    by_status: dict[str, int]
    request_rate: float
    error_rate: float | None = Field(None, description=(
        "failed and refused (429) requests over all requests of the window; None from an "
        "older controller"))
    output_tokens_per_s: float | None = Field(None, description=(
        "tokens generated by the window's successful requests per second of its covered "
        "part"))
    disaggregated_share: float
    ttft_ms: Percentiles
    components_ms: Components
    itl_ms: Percentiles = Field(description="each request's mean inter-token latency, as its "
                                "engine reports it (hides stalls: see gap_*)")
    gap_p99_ms: Percentiles | None = Field(None, description=(
        "streamed requests: each one's 99th-percentile inter-token gap, summarised"))
    gap_max_ms: Percentiles | None = Field(None, description=(
        "streamed requests: each one's worst inter-token gap, summarised"))
    prompt_tokens: Percentiles
    output_tokens: Percentiles
    kv: KvWindowPublic
    transfer_share: TransferShare
    pools: dict[Role, PoolUtilization]
    total_requests: int
    admission: AdmissionPublic | None = None
    kv_integrity: KvIntegrityPublic | None = None
    handoff: HandoffPublic | None = None
    by_path: dict[str, PathStats] | None = Field(None, description=(
        "disaggregated and colocated apart (a mean over both mixes colocated requests' zero "
        "transfer in); None from an older controller"))


# ---- the time series -----------------------------------------------------------------------


class TailPublic(Public):
    p50: float
    p99: float


class TtftBucket(Public):
    p50: float
    p90: float
    p99: float
    mean: float


class PartsMean(Public):
    """Mean of each TTFT part (they add up to the mean TTFT)."""

    queue: float
    prefill: float
    transfer: float
    decode_sched: float
    overhead: float


class BucketPublic(Public):
    t: float
    requests: int
    rate: float
    ok: int
    errors: int
    disaggregated: int
    colocated: int
    decided_disaggregated: int = Field(0, description=(
        "requests the hand-off decision sent disaggregated (routing.disagg_policy)"))
    decided_local: int = Field(0, description="requests it served on their decode instance")
    ttft_ms: TtftBucket
    gap_p99_ms: float | None = Field(None, description=(
        "the 99th percentile of the streamed requests' own p99 inter-token gaps; None: none"))
    itl_ms: float | None = Field(None, description="mean of the requests' mean ITL")
    parts_mean_ms: PartsMean
    kv_bytes: float
    kv_bytes_per_s: float
    transfer_gbps: float
    transfer_p50_ms: float | None = Field(None, description=(
        "KV transfer of the bucket's disaggregated requests; None: none"))
    transfer_p99_ms: float | None = None
    e2e_p50_ms: float | None = Field(None, description=(
        "end-to-end latency (request in -> last byte out) of the bucket's successful "
        "requests; None: none"))
    e2e_p99_ms: float | None = None
    prompt_tokens_per_s: float | None = Field(None, description=(
        "prompt tokens of the bucket's successful requests per second (None: an older "
        "controller)"))
    output_tokens_per_s: float | None = Field(None, description=(
        "tokens generated by the bucket's successful requests per second"))
    ttft_by_path: dict[str, TailPublic | None] | None = Field(None, description=(
        "TTFT p50/p99 of each path's successful requests (disaggregated, colocated); None "
        "for a path without any"))


class TimeseriesPublic(Public):
    """``GET /api/v1/timeseries?window_s=W&step_s=S``: buckets oldest first."""

    window_s: float
    step_s: float
    now: float
    buckets: list[BucketPublic]
