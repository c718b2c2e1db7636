"""``GET /api/v1/cache``: the fleet's prefix cache over a window, as the router predicted it
from the engines' KV events and as the engines reported it, per instance and in buckets, and
the state of the controller's block index per instance.

Token counts are of finished requests that started in the window, on the instance that
computed the prompt (the prefill instance; the decode instance of a colocated request).
``hit_rate`` is reported cached tokens over prompt tokens; ``predicted_hit_rate`` the same
with the router's prediction; ``drift`` is (predicted - reported) / prompt tokens over the
requests that have both (0: the index agrees with the engines; positive: the router expects
hits the engines do not give). ``None`` where there is nothing to divide by."""

from __future__ import annotations

from pydantic import Field

from pdctl_api.schema.common import Public, Role


class KvIndexPublic(Public):
    """The controller's block index of one instance (from its KV events)."""

    watched: bool = Field(description="the controller subscribes to the instance's KV events "
                          "(false: it publishes none, e.g. an attached external engine)")
    healthy: bool = Field(description="watched and up to date: cache-aware routing uses it")
    stale_reason: str | None = Field(None, description="why the index is not up to date")
    blocks: int = Field(0, description="prefix blocks indexed")
    events_per_s: float = 0.0
    events: int = 0
    last_seq: int | None = None
    replays: int = Field(0, description="gaps in the event sequence asked to be replayed")
    restarts: int = Field(0, description="times the publisher started over (seq 0 again)")
    skipped: int = Field(0, description="blocks not indexed (another medium or block size, "
                         "LoRA, extra keys)")


class CacheTokens(Public):
    requests: int = Field(description="requests with a prediction or a report")
    prompt_tokens: int
    predicted_tokens: int | None = Field(None, description="null: no prediction was made "
                                         "(no pool routes by cache)")
    reported_tokens: int | None = Field(None, description="null: the engines report none")
    hit_rate: float | None = None
    predicted_hit_rate: float | None = None
    drift: float | None = None


class CacheInstancePublic(CacheTokens):
    instance: str
    role: Role
    kv_index: KvIndexPublic


class CacheBucket(Public):
    t: float = Field(description="the bucket's start, unix seconds")
    hit_rate: float | None = None
    predicted_hit_rate: float | None = None
    drift: float | None = None


class CachePublic(CacheTokens):
    window_s: float
    end: float = Field(description="the window's end, unix seconds")
    step_s: float
    prefill_policy: str
    decode_policy: str
    tokens_saved: int = Field(description="prompt tokens the engines served from their "
                              "prefix caches (reported; predicted where none is reported)")
    decode_kv_bytes_saved: int | None = Field(description=(
        "KV bytes decode instances did not pull because they held those blocks already "
        "(predicted from the index); null: the model's architecture is unknown"))
    decode_kv_bytes_moved: int | None = Field(description=(
        "KV bytes pulled over NIXL, modelled from the uncached prompt blocks; null: the "
        "model's architecture is unknown"))
    warnings: list[str] = Field(default_factory=list, description=(
        "what an operator should know at a glance: a pool routing by cache whose index is "
        "stale or missing (routed by load), predictions far from what the engines report"))
    instances: list[CacheInstancePublic] = Field(default_factory=list)
    buckets: list[CacheBucket] = Field(default_factory=list)
