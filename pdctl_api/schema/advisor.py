"""The advisor (``GET /api/v1/advisor``): the fleet ratio and the disaggregate-or-colocate
verdict from the observed traffic, the KV transfer's share of TTFT and the decode pool's KV
capacity."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pdctl_api.schema.common import Public

Decision = Literal["colocate", "depends", "disaggregate", "strongly-disaggregate",
                   "barely-pays"]


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

    tp: int = Field(description="the decode TP it is computed for")
    tokens_per_instance: int = Field(description="tokens of KV cache one instance holds")
    context_p50: float = Field(description="prompt + output tokens per request, median")
    context_p99: float
    sequences_at_p50: int = Field(description="median contexts one instance holds at once")
    sequences_at_p99: int
    observed: bool = Field(description="contexts from traffic, else the assumed default")
    tight: bool = Field(description="fewer than 16 p99 contexts fit: memory caps the batch")
    note: str


class AdvisorPublic(Public):
    """``GET /api/v1/advisor``: fleet ratio and disaggregate-or-colocate advice."""

    traffic: TrafficPublic
    fleet_ratio: FleetRatioPublic
    verdict: VerdictPublic
    kv_transfer: KvTransferPublic
    kv_capacity: KvCapacityPublic | None = None
