"""Core value types: roles, instance states (which own their classification), instances and
request records."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# The enums are part of the API contract: defined there, re-exported here.
from pdctl_api.schema import InstanceState, RequestPath, Role


@dataclass(frozen=True)
class PoolTarget:
    """A pool's desired size, tensor parallelism and KV transfer mode: ``pull`` (vLLM's
    NixlConnector: the decode engine reads the KV from the prefill engine) or ``push``
    (NixlPushConnector: the prefill engine writes it into the decode engine's blocks)."""

    size: int
    tp: int
    kv_mode: str = "pull"


@dataclass
class Instance:
    """One engine instance as the controller sees it.

    Only the fleet's registry writes it (``controller.fleet.registry``): lifecycle from the
    fleet loop, ``running``/``waiting``/``kv_usage`` and NIXL counters from the engine's own
    /metrics. Requests in flight are the router's (``RoutingTable.inflight``).
    """

    id: str
    role: Role
    tp: int
    url: str
    state: InstanceState = InstanceState.STARTING
    created_at: float = 0.0
    ready_at: float | None = None
    drain_started_at: float | None = None
    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float = 0.0
    nixl_xfers: float = 0.0  # cumulative, from vllm:nixl_xfer_time_seconds_count
    nixl_xfer_s: float = 0.0  # cumulative, from vllm:nixl_xfer_time_seconds_sum
    nixl_bytes: float = 0.0  # cumulative, from vllm:nixl_bytes_transferred_sum
    recent_xfer_ms: float = 0.0  # mean NIXL transfer time since the previous poll
    kv_expired: float = 0.0  # cumulative, vllm:nixl_num_kv_expired_reqs (prefill side)
    kv_after_expiry: float = 0.0  # cumulative, vllm:nixl_num_notifications_after_expiry
    nixl_failed: float = 0.0  # cumulative, vllm:nixl_num_failed_transfers (decode side)
    # cumulative prompt tokens it computed itself (vllm:prompt_tokens_by_source, source
    # local_compute); None when the engine does not say
    local_compute: float | None = None
    health_failures: int = 0
    # Engines seen behind its address so far, less one: a restart in place (same URL, a new
    # process) voids the KV handles the old one gave out (``Registry.restarted``).
    incarnation: int = 0
    ended_at: float | None = None
    last_error: str | None = None
    accelerators: tuple[int, ...] = ()  # the devices (GPUs, CPU cores) it runs on
    slots: tuple[int, ...] = ()  # placement slots; differ from devices when instances share
    node: str | None = None  # the Ray node it runs on; None for local processes
    kv_mode: str = "pull"  # its KV connector: "pull" (NixlConnector), "push" (NixlPushConnector)
    # Its NIXL identity, which a push-mode decode hop must name: {"engine_id", "host", "port"
    # (the side channel), "tp_size"}; None where the controller does not know it (external).
    kv_peer: dict[str, Any] | None = None
    handle: Any = field(default=None, repr=False)

    def public(self, inflight: int = 0, handles_out: int = 0) -> dict[str, Any]:
        return {
            "id": self.id,
            "role": self.role.value,
            "url": self.url,
            "state": self.state.value,
            "tp": self.tp,
            "kv_mode": self.kv_mode,
            "accelerators": list(self.accelerators),
            "created_at": self.created_at,
            "ready_at": self.ready_at,
            "load": {
                "inflight": inflight,
                "kv_handles_out": handles_out,
                "running": self.running,
                "waiting": self.waiting,
                "kv_cache_usage": self.kv_usage,
            },
            "nixl": {"transfers": self.nixl_xfers, "seconds": self.nixl_xfer_s,
                     "bytes": self.nixl_bytes, "recent_xfer_ms": self.recent_xfer_ms,
                     "kv_expired_requests": self.kv_expired,
                     "notifications_after_expiry": self.kv_after_expiry,
                     "failed_transfers": self.nixl_failed},
            "last_error": self.last_error,
            "pid": self.pid,
            "node": self.node,
            "kv_peer": self.kv_peer,
        }

    @property
    def pid(self) -> int | None:
        """The local process id, for instances this controller runs as processes."""
        handle = getattr(self.handle, "handle", None)
        return handle.get("pid") if isinstance(handle, dict) else None


@dataclass
class RequestRecord:
    """One finished client request and where its time-to-first-token went (milliseconds)."""

    id: str
    started_at: float  # unix time the controller received the request
    endpoint: str
    path: RequestPath
    status: str  # "ok" | "error" | "cancelled"
    stream: bool
    prompt_tokens: int
    output_tokens: int
    prefill_instance: str | None
    decode_instance: str | None
    queue_ms: float = 0.0
    prefill_ms: float = 0.0
    transfer_ms: float = 0.0
    decode_sched_ms: float = 0.0
    overhead_ms: float = 0.0
    ttft_ms: float = 0.0
    itl_ms: float = 0.0
    e2e_ms: float = 0.0
    kv_bytes: int = 0
    retries: int = 0
    error: str | None = None
    # The prefill engine's id of the KV the decode hop read (vLLM's remote_request_id), and
    # whether that engine reported the read as one of blocks it had already freed.
    kv_handle: str | None = None
    suspect: bool = False
    # Inter-token gaps of a streamed answer as the router relayed it (0 for whole answers):
    # the 99th percentile, the worst, and how many.
    gap_p99_ms: float = 0.0
    gap_max_ms: float = 0.0
    gaps: int = 0
    # Prompt tokens served from the prefix cache of the instance that computed the prompt:
    # as the router predicted from the engines' KV events (None: no pool routes by cache),
    # and as the engine reported (None: it reports none). On the disaggregated path, also
    # what the decode instance held (its KV was not pulled for those tokens).
    cached_tokens_predicted: int | None = None
    cached_tokens: int | None = None
    decode_cached_tokens_predicted: int | None = None
    # The hand-off decision (``controller.router.handoff``): "disaggregated" or "local", and
    # why. The path taken can differ (a failed prefill hop is served colocated).
    decision: str | None = None
    decision_reason: str | None = None
    # Routed disaggregated, but its decode engine computed the prompt itself: the KV never
    # arrived (``controller.obs.kv_fallback``).
    kv_fallback: bool = False

    @property
    def decided(self) -> float:
        """The decision as a number (the request log's columns): 1 disaggregated, 0 local,
        -1 none (refused before routing)."""
        return 1.0 if self.decision == "disaggregated" else (
            0.0 if self.decision == "local" else -1.0)

    def public(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "started_at": self.started_at,
            "endpoint": self.endpoint,
            "path": self.path.value,
            "status": self.status,
            "stream": self.stream,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "prefill_instance": self.prefill_instance,
            "decode_instance": self.decode_instance,
            "queue_ms": self.queue_ms,
            "prefill_ms": self.prefill_ms,
            "transfer_ms": self.transfer_ms,
            "decode_sched_ms": self.decode_sched_ms,
            "overhead_ms": self.overhead_ms,
            "ttft_ms": self.ttft_ms,
            "itl_ms": self.itl_ms,
            "e2e_ms": self.e2e_ms,
            "kv_bytes": self.kv_bytes,
            "retries": self.retries,
            "error": self.error,
            "kv_handle": self.kv_handle,
            "suspect": self.suspect,
            "gap_p99_ms": self.gap_p99_ms,
            "gap_max_ms": self.gap_max_ms,
            "cached_tokens_predicted": self.cached_tokens_predicted,
            "cached_tokens": self.cached_tokens,
            "decode_cached_tokens_predicted": self.decode_cached_tokens_predicted,
            "decision": self.decision,
            "decision_reason": self.decision_reason,
            "kv_fallback": self.kv_fallback,
        }
