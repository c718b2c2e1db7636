"""The cluster: pools and instances (``/api/v1/cluster``, ``/pools/{role}``, ``/instances``),
the dry run of a pool change, ``/healthz`` and ``/access``. The pool fields' bounds
(``InstanceCount``, ``TensorParallel``) are also the ``pools`` configuration section's."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from pdctl_api.schema.common import InstanceState, Maybe, Public, Role, UpdateBody
from pdctl_api.schema.routing import RoutingPublic

ActionKind = Literal["start", "drain", "stop"]

InstanceCount = Annotated[int, Field(ge=0, le=10_000, description="instances in the pool")]
TensorParallel = Annotated[int, Field(ge=1, le=1024, description=(
    "tensor parallelism: the accelerators one instance runs on"))]
KvMode = Literal["pull", "push"]
PoolKvMode = Annotated[KvMode, Field(description=(
    "how the KV cache moves from prefill to decode: pull (vLLM's NixlConnector, the decode "
    "engine reads it after the prefill hop) or push (NixlPushConnector, both hops sent at "
    "once and the prefill engine writes the KV into the decode engine's blocks)"))]


# ---- pools and instances -------------------------------------------------------------------


class PoolSize(Public):
    size: InstanceCount
    tp: TensorParallel
    kv_mode: PoolKvMode = "pull"  # "pull" from an older controller


class PoolActual(Public):
    ready: int
    starting: int
    draining: int
    ready_at_desired_tp: int = Field(description=(
        "ready instances at the desired TP and KV mode"))


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


class PoolUpdate(UpdateBody):
    """``PATCH /api/v1/pools/{role}`` body: the new desired size, TP and/or KV mode."""

    size: Maybe[InstanceCount] = None
    tp: Maybe[TensorParallel] = None
    kv_mode: Maybe[PoolKvMode] = None


class LoadPublic(Public):
    inflight: int = Field(description="requests the router has sent it and not finished")
    kv_handles_out: int = Field(0, ge=0, description=(
        "a prefill instance's KV handles whose request has not ended and whose lease has not "
        "run out: a draining prefill instance stays while any is out"))
    running: float
    waiting: float
    kv_cache_usage: float


class NixlPublic(Public):
    """The engine's cumulative NIXL counters as the controller last polled them. An older
    controller sends none of the lease counters (``kv_expired_requests``,
    ``notifications_after_expiry``: prefill side) nor ``failed_transfers`` (decode side)."""

    transfers: float
    seconds: float
    bytes: float
    recent_xfer_ms: float
    kv_expired_requests: float | None = Field(None, description=(
        "requests whose KV expired before it was read (vllm:nixl_num_kv_expired_reqs)"))
    notifications_after_expiry: float | None = Field(None, description=(
        "reads of KV already freed (vllm:nixl_num_notifications_after_expiry)"))
    failed_transfers: float | None = Field(None, description=(
        "KV pulls that failed (vllm:nixl_num_failed_transfers)"))


class KvPeerPublic(Public):
    """An engine's NIXL identity: what a push-mode decode hop names as its prefill engine."""

    engine_id: str = Field(description="vLLM's kv_transfer_config.engine_id")
    host: str = Field(description="the NIXL side channel's host")
    port: int = Field(description="the NIXL side channel's port")
    tp_size: int


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
    kv_mode: KvMode = Field("pull", description="its KV connector's mode (pull from an older "
                            "controller)")
    kv_peer: KvPeerPublic | None = Field(None, description=(
        "its NIXL identity; None where the controller does not know it (external engines)"))


class InstanceLogPublic(Public):
    """``GET /api/v1/instances/{id}/log``: the tail of its engine's log."""

    id: str
    log: str


class ModelPublic(Public):
    """The served model; its architecture numbers are null where it is unknown (external
    engines serving a model with no profile and no model.path)."""

    name: str
    served_name: str
    params: float | None
    layers: int | None
    heads: int | None
    kv_heads: int | None
    head_dim: int | None
    kv_bytes_per_token: int | None


class HardwarePublic(Public):
    accelerator: str
    accelerators_per_node: int
    nodes: int
    total_accelerators: int
    used_accelerators: int
    kv_link: str


class RouterWorkerPublic(Public):
    """One router worker process (``controller.data_workers`` above 1)."""

    index: int
    pid: int
    inflight: int = Field(description="its client requests in flight")
    arrived: int = Field(description="valid client requests it has taken")


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
    kv_lease_s: float | None = Field(None, description=(
        "how long a prefill engine keeps a finished request's KV blocks for the decode's "
        "read (kv.lease_s); None where the controller does not set it (external engines) "
        "or is older"))
    state_problem: str | None = Field(None, description=(
        "why the state directory cannot be written (its disk full, say), from the last "
        "failed write until one succeeds: operators' changes are refused with 503 meanwhile"))
    router_workers: list[RouterWorkerPublic] = Field(default_factory=list, description=(
        "the router worker processes serving the data plane beside the controller's own "
        "(controller.data_workers - 1 of them; empty with one process)"))


# ---- the dry run of a pool change ----------------------------------------------------------


class PlannedAction(Public):
    """One step the planner would take: ``start`` names the role, TP and KV mode of a new
    instance, ``drain`` and ``stop`` the instance they act on."""

    kind: ActionKind
    instance_id: str | None = None
    role: Role | None = None
    tp: int | None = None
    kv_mode: KvMode | None = None
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


# ---- health and access ---------------------------------------------------------------------


class HealthPublic(Public):
    """``GET /healthz`` (no token): ready instances per pool. ``GET /readyz``: the same, with
    ``status`` "ready" (200) or "not ready" (503) and ``reason`` when not ready."""

    status: str
    ready: dict[Role, int]
    reason: str | None = None


class AccessPublic(Public):
    """``GET /api/v1/access``: what the request's token may do."""

    role: Literal["admin", "viewer"]
    may_change: bool
