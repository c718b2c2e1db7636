"""The hand-off decision, pure: serve a request disaggregated (prefill pool, KV transfer,
decode instance) or locally on its decode instance, and why. Decisions as data.

Two policies (routing setting ``disagg_policy``):

- ``threshold``: by prompt length alone, ``disagg_min_prompt_tokens`` (the fixed rule that
  Dynamo and llm-d ship).
- ``slo``: by what this request would cost each way now. What counts is the *uncached* part
  of the prompt (a 12k-token prompt whose first 11k tokens the decode instance holds is a
  short prompt), the work queued on each side, and the KV bytes the decode instance would
  have to receive:

  - local TTFT ~ (prefill work queued on the decode instance + the prompt's uncached tokens
    there) x the decode instance's prefill cost per token;
  - disaggregated TTFT ~ (work queued on the best prefill instance + its uncached tokens)
    x the prefill pool's cost per token + the KV transfer of the tokens the decode instance
    lacks + the second hop's overhead.

  The decode instance's own queued prefills delay the disaggregated first token too (it
  comes from the same engine). Disaggregated wins when it is clearly faster
  (``DISAGG_GAIN``), with one exception that protects the inter-token gap: a local prefill
  would stall the decode instance's running streams for up to one prefill chunk (vLLM's
  chunked prefill), so when that stall exceeds the gap target, the disaggregated path would
  still meet the TTFT target at no more than ``GUARD_TTFT_COST`` times the local TTFT, and
  TTFT is not already over its target recently, the request goes disaggregated although
  local would be faster.

The costs per token are measured by the router (``HandoffRates``) and start from the model's
roofline; the decision only reads numbers and returns a value the tests assert.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

DisaggPolicy = Literal["threshold", "slo"]
NO_PREFILL = "no ready prefill instance"  # the reason when the prefill pool cannot serve
# Disaggregate only for a clear gain: the second hop's cost varies (a pair's first transfer,
# HTTP, the decode engine's scheduling) more than the learnt mean says.
DISAGG_GAIN = 0.8
# The gap guard trades at most this much TTFT (disaggregated over local) for the running
# streams' gaps.
GUARD_TTFT_COST = 1.5


@dataclass(frozen=True)
class Inputs:
    """What the ``slo`` policy weighs for one request (times in ms, work in tokens)."""

    prompt_tokens: int
    prefill_ready: bool  # a ready prefill instance the decode instance can pair with
    prefill_uncached: int  # prompt tokens the best prefill candidate would compute
    prefill_queued: int  # prompt tokens already queued there (and in the router's queue)
    decode_uncached: int  # prompt tokens the chosen decode instance would compute locally
    decode_queued: int  # prompt tokens it has yet to prefill for others
    decode_running: int  # streams running on it (a local prefill stalls them)
    prefill_ms_per_token: float  # the prefill pool's prefill cost
    local_ms_per_token: float  # the decode instance's prefill cost
    transfer_ms: float  # this request's KV (the blocks the decode instance lacks) on its link
    hop_ms: float  # what the second hop adds (HTTP, scheduling)
    chunk_tokens: int  # the most prompt tokens one engine step computes (chunked prefill)
    ttft_target_ms: float
    gap_target_ms: float
    ttft_recent_ms: float | None = None  # recent TTFT p95, None: too few requests yet


@dataclass(frozen=True)
class HandoffDecision:
    disaggregated: bool
    reason: str
    local_ms: float | None = None  # the estimates it weighed (slo only)
    disagg_ms: float | None = None

    @property
    def name(self) -> str:
        return "disaggregated" if self.disaggregated else "local"


def by_threshold(prompt_tokens: int, min_tokens: int, prefill_ready: bool) -> HandoffDecision:
    """The fixed rule: prompts of at least ``min_tokens`` tokens go disaggregated."""
    if prompt_tokens < min_tokens:
        return HandoffDecision(False, f"threshold: {prompt_tokens:,} prompt tokens < "
                               f"{min_tokens:,}")
    if not prefill_ready:
        return HandoffDecision(False, NO_PREFILL)
    return HandoffDecision(True, f"threshold: {prompt_tokens:,} prompt tokens >= {min_tokens:,}")


def by_slo(x: Inputs) -> HandoffDecision:
    """The per-request decision (module docstring)."""
    if not x.prefill_ready:
        return HandoffDecision(False, NO_PREFILL)
    if x.decode_uncached <= 1:
        return HandoffDecision(False, f"decode instance holds the prompt ({x.prompt_tokens:,} "
                               "tokens cached): nothing to prefill or move")
    local = (x.decode_queued + x.decode_uncached) * x.local_ms_per_token
    # The decode instance still works through the prefills queued on it before it can give
    # this request its first token, whichever path the prompt takes.
    ready = ((x.prefill_queued + x.prefill_uncached) * x.prefill_ms_per_token
             + x.transfer_ms)
    disagg = max(ready, x.decode_queued * x.local_ms_per_token) + x.hop_ms
    est = f"local ~{local:,.0f} ms, disaggregated ~{disagg:,.0f} ms"
    if disagg < local * DISAGG_GAIN:
        return HandoffDecision(True, f"{est}", local, disagg)
    stall = min(x.decode_uncached, x.chunk_tokens) * x.local_ms_per_token
    if not x.decode_running or stall <= x.gap_target_ms:
        return HandoffDecision(False, est, local, disagg)
    pressed = x.ttft_recent_ms is not None and x.ttft_recent_ms > x.ttft_target_ms
    stalls = f"{est}; local prefill would stall {x.decode_running} streams ~{stall:,.0f} ms"
    if pressed:
        why = (f"TTFT p95 {x.ttft_recent_ms:,.0f} ms is over its {x.ttft_target_ms:,.0f} ms "
               "target")
    elif disagg > x.ttft_target_ms:
        why = f"disaggregated would miss the {x.ttft_target_ms:,.0f} ms TTFT target"
    elif disagg > local * GUARD_TTFT_COST:
        why = f"disaggregated would cost over {GUARD_TTFT_COST:g}x the local TTFT"
    else:
        return HandoffDecision(True, f"{stalls} (gap target {x.gap_target_ms:,.0f} ms)",
                               local, disagg)
    return HandoffDecision(False, f"{stalls}, but {why}", local, disagg)
