"""The control API's contract (``/api/v1/*``, ``/healthz``): the JSON every route answers and
accepts, as pydantic models, and the enums they share. The controller declares its routes with
them, and the CLI and the console read the answers through them; nothing here knows how the
controller computes a value.

Fields an older controller does not send (``kv_integrity``, ``quarantine``, ``suspect``,
``kv_handle``, the lease counters in ``nixl``) have defaults, so a newer client still reads it.
"""

from __future__ import annotations

import enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.json_schema import SkipJsonSchema

# ---- enums ---------------------------------------------------------------------------------


class Role(enum.StrEnum):
    PREFILL = "prefill"
    DECODE = "decode"


class InstanceState(enum.StrEnum):
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    STOPPED = "stopped"
    FAILED = "failed"

    @classmethod
    def terminal_states(cls) -> frozenset[InstanceState]:
        return frozenset({cls.STOPPED, cls.FAILED})

    @property
    def terminal(self) -> bool:
        return self in self.terminal_states()

    @property
    def routable(self) -> bool:
        """Only a ready instance takes new requests."""
        return self is InstanceState.READY

    @property
    def holds_accelerators(self) -> bool:
        return not self.terminal

    @property
    def drainable(self) -> bool:
        """The controller accepts an operator's drain of a ready or starting instance."""
        return self in (InstanceState.READY, InstanceState.STARTING)


class RequestPath(enum.StrEnum):
    DISAGGREGATED = "disaggregated"
    COLOCATED = "colocated"


PolicyName = Literal["round_robin", "least_loaded"]
Decision = Literal["colocate", "depends", "disaggregate", "strongly-disaggregate",
                   "barely-pays"]
ActionKind = Literal["start", "drain", "stop"]
PARTS = ("queue", "prefill", "transfer", "decode_sched", "overhead")  # TTFT, in this order


class Public(BaseModel):
    """An answer of the API. Unknown fields (a newer controller's) are ignored."""

    model_config = ConfigDict(extra="ignore")


# ---- pools and instances -------------------------------------------------------------------


class PoolSize(Public):
    size: int
    tp: int


class PoolActual(Public):
    ready: int
    starting: int
    draining: int
    ready_at_desired_tp: int


class QuarantinePublic(Public):
    """A pool whose engines keep crashing in service: no new instance before it runs out."""

    remaining_s: float
    crashes: int
    last_error: str


class PoolPublic(Public):
    """``GET|PATCH /api/v1/pools/{role}``, and each pool of ``/cluster``."""

    desired: PoolSize
    actual: PoolActual
    converged: bool
    quarantine: QuarantinePublic | None = None
    valid_tp: list[int] | None = Field(None, description=(
        "the TPs this pool may change to now: they divide the model's heads, fit memory and "
        "a node, and pair with the other pool's TP; None from an older controller"))


class LoadPublic(Public):
    inflight: int = Field(description="requests the router has sent it and not finished")
    running: float
    waiting: float
    kv_cache_usage: float


class NixlPublic(Public):
    """The engine's cumulative NIXL counters as the controller last polled them."""

    transfers: float
    seconds: float
    bytes: float
    recent_xfer_ms: float
    kv_expired_requests: float | None = None
    notifications_after_expiry: float | None = None
    failed_transfers: float | None = Field(None, description=(
        "KV pulls that failed on this (decode) engine, cumulative "
        "(vllm:nixl_num_failed_transfers); None from an older controller"))


class InstancePublic(Public):
    """``GET /api/v1/instances[/{id}]``, ``POST .../drain``, each instance of ``/cluster``."""

    id: str
    role: Role
    url: str
    state: InstanceState
    tp: int
    accelerators: list[int] = Field(default_factory=list)
    created_at: float
    ready_at: float | None = None
    load: LoadPublic
    nixl: NixlPublic
    last_error: str | None = None
    pid: int | None = Field(None, description="local process id (local launcher only)")
    node: str | None = Field(None, description="the Ray node's IP (ray launcher only)")


class InstanceLogPublic(Public):
    """``GET /api/v1/instances/{id}/log``: the tail of its engine's log."""

    id: str
    log: str


class ModelPublic(Public):
    name: str
    served_name: str
    params: float
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    kv_bytes_per_token: int


class HardwarePublic(Public):
    accelerator: str
    accelerators_per_node: int
    nodes: int
    total_accelerators: int
    used_accelerators: int
    kv_link: str


class RoutingPublic(Public):
    """``GET|PATCH /api/v1/routing``: the routing settings in force."""

    disagg_min_prompt_tokens: int
    transfer_alert_share: float
    prefill_policy: PolicyName
    decode_policy: PolicyName
    max_attempts: int
    request_timeout_s: float
    max_inflight: int = 0  # 0: no limit (also what an older controller means)
    max_inflight_per_instance: int = 0
    prefill_max_inflight: int = 0  # 0: no router prefill queue (also an older controller)
    prefill_queue_timeout_s: float = 30.0


class ClusterPublic(Public):
    """``GET /api/v1/cluster``."""

    model: ModelPublic
    backend: str
    hardware: HardwarePublic
    pools: dict[Role, PoolPublic]
    routing: RoutingPublic
    instances: list[InstancePublic]
    time_scale: float = Field(1.0, description=(
        "wall seconds per modelled second: sim.time_scale for simulated engines, 1 for real "
        "ones. Every time the API reports is wall time; modelled = wall / time_scale"))


# ---- the dry run of a pool change ----------------------------------------------------------


class PlannedAction(Public):
    """One step the planner would take: ``start`` names the role and TP of a new instance,
    ``drain`` and ``stop`` the instance they act on."""

    kind: ActionKind
    instance_id: str | None = None
    role: Role | None = None
    tp: int | None = None
    reason: str


class PoolPlanPublic(Public):
    """``PATCH /api/v1/pools/{role}?dry_run=true``: the change validated like the real one,
    nothing changed, and what the next reconcile step would do for the pool."""

    role: Role
    desired: PoolSize
    actions: list[PlannedAction]
    notes: list[str] = Field(default_factory=list, description=(
        "what else the change means, e.g. the KV cache a decode instance at this TP holds "
        "against the contexts of the last 10 minutes"))


# ---- requests and their statistics ---------------------------------------------------------


class RequestPublic(Public):
    """``GET /api/v1/requests``: one finished request and where its TTFT went (ms)."""

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
    queue_ms: float
    prefill_ms: float
    transfer_ms: float
    decode_sched_ms: float
    overhead_ms: float
    ttft_ms: float
    itl_ms: float
    e2e_ms: float
    kv_bytes: int
    retries: int
    error: str | None = None
    kv_handle: str | None = None
    suspect: bool = False
    gap_p99_ms: float = Field(0.0, description="streamed answers: the 99th percentile of the "
                              "gaps between the chunks the router relayed (0: not streamed)")
    gap_max_ms: float = Field(0.0, description="streamed answers: the worst gap")


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
    by_path: dict[str, PathStats] | None = Field(None, description=(
        "disaggregated and colocated apart (a mean over both mixes colocated requests' zero "
        "transfer in); None from an older controller"))


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


class TimeseriesPublic(Public):
    """``GET /api/v1/timeseries?window_s=W&step_s=S``: buckets oldest first."""

    window_s: float
    step_s: float
    now: float
    buckets: list[BucketPublic]


# ---- advice, audit log, health -------------------------------------------------------------


class TrafficPublic(Public):
    observed: bool
    requests: int
    mean_isl: float
    mean_osl: float
    short_request_share: float
    note: str | None = None


class FleetRatioPublic(Public):
    decode_per_prefill_accelerators: float
    decode_per_prefill_instances: float
    prefill_cost_per_token_s: float
    decode_cost_per_token_s: float
    decode_batch: float
    decode_batch_observed: bool
    formula: str


class VerdictPublic(Public):
    decision: Decision
    reasons: list[str]


class KvTransferPublic(Public):
    link: str
    kv_bytes_at_mean_isl: int
    wire_ms: float
    transfer_ms: float
    modelled_share_of_ttft: float
    observed_share_of_ttft_p50: float | None = None
    alert_share: float
    transfer_dominant: bool


class KvCapacityPublic(Public):
    """What one decode instance's KV cache holds of the contexts it serves."""

    tp: int
    tokens_per_instance: int
    context_p50: float
    context_p99: float
    sequences_at_p50: int
    sequences_at_p99: int
    observed: bool
    tight: bool = Field(description="fewer than 16 p99 contexts fit: memory caps the batch")
    note: str


class AdvisorPublic(Public):
    """``GET /api/v1/advisor``: fleet ratio and disaggregate-or-colocate advice."""

    traffic: TrafficPublic
    fleet_ratio: FleetRatioPublic
    verdict: VerdictPublic
    kv_transfer: KvTransferPublic
    kv_capacity: KvCapacityPublic | None = None


class EventPublic(Public):
    """``GET /api/v1/events``: one audit-log entry; ``before``/``after`` are any JSON."""

    id: int
    ts: float
    actor: str
    kind: str
    target: str
    before: Any = None
    after: Any = None
    detail: str | None = None


# ---- the SLA planner -----------------------------------------------------------------------

PlannerMode = Literal["off", "advisory", "apply"]
PredictorName = Literal["constant", "holt"]


class PlanLoad(Public):
    """A load in modelled time: requests/s and mean tokens per request."""

    request_rate: float
    prompt_tokens: float
    output_tokens: float


class PlanObserved(Public):
    """One interval as the planner saw it (modelled ms: wall ms / sim.time_scale)."""

    requests: int
    load: PlanLoad
    ttft_p95_ms: float
    itl_p95_ms: float | None = Field(None, description="inter-token gap p95 (streamed)")
    itl_mean_ms: float | None = None
    prefill_ms_mean: float | None = None
    prefill_queue_p95_ms: float
    decode_queue_p95_ms: float
    decode_concurrency: float
    disagg_token_share: float


class PlanPublic(Public):
    """One pass of the planner: what it saw, predicted and recommended, and why."""

    at: float
    mode: PlannerMode
    current: dict[Role, int]
    recommended: dict[Role, int]
    reasons: list[str]
    hold: str | None = Field(None, description="why the recommendation was not applied now")
    observed: PlanObserved | None = None
    predicted: PlanLoad | None = None
    applied: bool = False
    error: str | None = None


class PlannerBounds(Public):
    min_prefill: int
    max_prefill: int
    min_decode: int
    max_decode: int
    accelerator_budget: int | None = None


class PlannerPublic(Public):
    """``GET /api/v1/planner``: settings, the profiles it plans with, its decisions."""

    mode: PlannerMode
    predictor: PredictorName
    interval_s: float
    ttft_ms: float = Field(description="target TTFT p95 (modelled ms)")
    itl_ms: float = Field(description="target inter-token gap p95 (modelled ms)")
    time_scale: float = Field(1.0, description="sim.time_scale: wall s per modelled s")
    bounds: PlannerBounds
    profiles: dict[Role, str | None]
    problem: str | None = Field(None, description="why the planner cannot run now")
    next_at: float | None = None
    history: list[PlanPublic] = Field(default_factory=list, description="oldest first")


class HealthPublic(Public):
    """``GET /healthz`` (no token): ready instances per pool."""

    status: str
    ready: dict[Role, int]


# ---- request bodies ------------------------------------------------------------------------


class _Update(BaseModel):
    """A PATCH body: only the fields to change, at least one; strict (a number as a string,
    a float for an integer, a boolean for a number, an unknown field, an explicit null: all
    refused); numbers finite and bounded."""

    model_config = ConfigDict(extra="forbid", strict=True,
                              json_schema_extra={"minProperties": 1})

    @model_validator(mode="before")
    @classmethod
    def _no_nulls(cls, data: Any) -> Any:
        if isinstance(data, dict):
            nulls = [k for k, v in data.items() if v is None and k in cls.model_fields]
            if nulls:
                raise ValueError(f"{', '.join(nulls)}: null is not a value; leave the field "
                                 "out to keep it")
        return data


class PoolUpdate(_Update):
    """``PATCH /api/v1/pools/{role}`` body: the new desired size and/or TP."""

    size: int | SkipJsonSchema[None] = Field(None, ge=0, le=10_000)
    tp: int | SkipJsonSchema[None] = Field(None, ge=1, le=1024)


class RoutingUpdate(_Update):
    """``PATCH /api/v1/routing`` body."""

    disagg_min_prompt_tokens: int | SkipJsonSchema[None] = Field(None, ge=0, le=10_000_000)
    transfer_alert_share: float | SkipJsonSchema[None] = Field(None, gt=0, le=1,
                                                               allow_inf_nan=False)
    prefill_policy: PolicyName | SkipJsonSchema[None] = None
    decode_policy: PolicyName | SkipJsonSchema[None] = None
    max_attempts: int | SkipJsonSchema[None] = Field(None, ge=1, le=10)
    request_timeout_s: float | SkipJsonSchema[None] = Field(None, gt=0, le=86_400,
                                                            allow_inf_nan=False)
    max_inflight: int | SkipJsonSchema[None] = Field(None, ge=0, le=1_000_000, description=(
        "client requests in flight in the controller; more are answered 429 (0: no limit)"))
    max_inflight_per_instance: int | SkipJsonSchema[None] = Field(
        None, ge=0, le=1_000_000, description="requests in flight on one instance (0: no limit)")
    prefill_max_inflight: int | SkipJsonSchema[None] = Field(
        None, ge=0, le=100_000, description=(
            "prompts in flight on one prefill instance; more wait in the router's prefill "
            "queue (0: no limit, no queue)"))
    prefill_queue_timeout_s: float | SkipJsonSchema[None] = Field(
        None, gt=0, le=3600, allow_inf_nan=False, description=(
            "longest wait in the router's prefill queue; then served colocated"))


ROUTING_FIELDS = tuple(RoutingUpdate.model_fields)


class AccessPublic(Public):
    """``GET /api/v1/access``: what the request's token may do."""

    role: Literal["admin", "viewer"]
    may_change: bool


class TargetsPublic(Public):
    """``GET|PATCH /api/v1/targets``: the operator's service targets."""

    ttft_p95_ms: float
    ttft_p99_ms: float
    gap_p99_ms: float
    error_rate: float


class TargetsUpdate(_Update):
    """``PATCH /api/v1/targets`` body."""

    ttft_p95_ms: float | SkipJsonSchema[None] = Field(None, gt=0, le=3_600_000,
                                                      allow_inf_nan=False)
    ttft_p99_ms: float | SkipJsonSchema[None] = Field(None, gt=0, le=3_600_000,
                                                      allow_inf_nan=False)
    gap_p99_ms: float | SkipJsonSchema[None] = Field(None, gt=0, le=600_000,
                                                     allow_inf_nan=False)
    error_rate: float | SkipJsonSchema[None] = Field(None, ge=0, le=1, allow_inf_nan=False)


class PlannerUpdate(_Update):
    """``PATCH /api/v1/planner`` body."""

    mode: PlannerMode | SkipJsonSchema[None] = None
    ttft_ms: float | SkipJsonSchema[None] = Field(None, gt=0, le=3_600_000,
                                                  allow_inf_nan=False)
    itl_ms: float | SkipJsonSchema[None] = Field(None, gt=0, le=60_000, allow_inf_nan=False)
    interval_s: float | SkipJsonSchema[None] = Field(None, ge=1, le=86_400,
                                                     allow_inf_nan=False)
    predictor: PredictorName | SkipJsonSchema[None] = None


class ErrorPublic(BaseModel):
    """Every control-API error: ``detail`` says why; ``field`` names the offending field of a
    refused change when the controller knows it."""

    detail: str
    field: str | None = None
