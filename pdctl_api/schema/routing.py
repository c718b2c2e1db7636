"""The routing settings (``GET|PATCH /api/v1/routing``): each field's type, bounds and
description, written once here. The answer declares the fields, the PATCH body takes them
from it (``changes_of``), and the controller's ``routing`` configuration section
(``controller.config``) is the answer with the configuration's defaults."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from pdctl_api.schema.common import Public, UpdateBody, changes_of

PolicyName = Literal["round_robin", "least_loaded", "cache_aware"]
DisaggPolicyName = Annotated[Literal["threshold", "slo"], Field(description=(
    "how each request is handed off: threshold (disaggregated when its prompt has at least "
    "disagg_min_prompt_tokens tokens) or slo (disaggregated when that is faster for its "
    "uncached tokens, the queues and the KV transfer, protecting the gap target; "
    "docs/routing-and-accounting.md)"))]

MinPromptTokens = Annotated[int, Field(ge=0, le=10_000_000, description=(
    "shorter prompts are served colocated by a decode instance"))]
TransferAlertShare = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False, description=(
    "alert when KV transfer exceeds this share of TTFT"))]
MaxAttempts = Annotated[int, Field(ge=1, le=10, description=(
    "instances tried per hop before giving up (or falling back)"))]
RequestTimeoutS = Annotated[float, Field(gt=0, le=86_400, allow_inf_nan=False, description=(
    "longest wait for an engine's answer (each read), seconds"))]
MaxInflight = Annotated[int, Field(ge=0, le=1_000_000, description=(
    "client requests in flight in this controller; one more is answered 429 with "
    "Retry-After at once (0: no limit)"))]
MaxInflightPerInstance = Annotated[int, Field(ge=0, le=1_000_000, description=(
    "requests the router has in flight on one instance; a full instance gets no new one "
    "(a full prefill pool: served colocated; a full decode pool: 429) (0: no limit)"))]
PrefillMaxInflight = Annotated[int, Field(ge=0, le=100_000, description=(
    "prompts the router has in flight on one prefill instance; beyond that, requests wait "
    "in the router, first come first served, for a slot on any prefill instance (one that "
    "becomes ready meanwhile included), so that a backlog does not sit in one engine's "
    "queue after the pool grows; the wait counts in the queue part of TTFT (0: no limit, "
    "no router queue)"))]
CacheLoadLimit = Annotated[int, Field(ge=0, le=100_000, description=(
    "cache_aware: an instance with more than this many requests (in flight plus waiting) "
    "above the least loaded one gets no request for its cached prefix; 0: affinity only "
    "among the least loaded"))]
PrefillQueueTimeoutS = Annotated[float, Field(gt=0, le=3600, allow_inf_nan=False, description=(
    "longest a request waits in the router for a prefill slot; then it is served "
    "colocated"))]


class RoutingPublic(Public):
    """``GET|PATCH /api/v1/routing``: the routing settings in force."""

    disagg_min_prompt_tokens: MinPromptTokens
    transfer_alert_share: TransferAlertShare
    prefill_policy: PolicyName
    decode_policy: PolicyName
    max_attempts: MaxAttempts
    request_timeout_s: RequestTimeoutS
    # An older controller does not send these: no limits, no router prefill queue.
    max_inflight: MaxInflight = 0
    max_inflight_per_instance: MaxInflightPerInstance = 0
    prefill_max_inflight: PrefillMaxInflight = 0
    prefill_queue_timeout_s: PrefillQueueTimeoutS = 30.0
    cache_load_limit: CacheLoadLimit = 4
    disagg_policy: DisaggPolicyName = "threshold"


@changes_of(RoutingPublic)
class RoutingUpdate(UpdateBody):
    """``PATCH /api/v1/routing`` body."""


ROUTING_FIELDS = tuple(RoutingUpdate.model_fields)
