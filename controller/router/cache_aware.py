"""The cache-aware scorer, pure: which instance of a pool should take a prompt, given what
each holds of it (from the engines' KV events) and how loaded each is. Decisions as data.

A prompt costs an instance its *uncached* tokens (a cached prefix is neither prefilled again
nor, on a decode instance, pulled over NIXL again) plus the uncached tokens the router has
already sent there and not yet seen finish. The instance with the lowest cost wins, so a
warm instance keeps its conversation until its queue outweighs what the cache saves, and a
cold fleet is routed by queued work. Affinity never piles requests on one instance: an
instance with more than ``load_limit`` requests (in flight plus waiting) above the least
loaded candidate is not eligible at all. Equal costs rotate from a moving start, so a burst
of identical prompts on a cold fleet spreads instead of herding onto the first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Candidate:
    id: str
    load: int  # requests in flight (router) plus waiting (engine)
    queued_tokens: int  # uncached prompt tokens the router has in flight there
    cached_tokens: int  # leading prompt tokens it holds (0: none, or its index is stale)
    trusted: bool = True  # its block index is up to date


@dataclass(frozen=True)
class CacheChoice:
    instance: str
    cached_tokens: int
    cost: int
    reason: str


def choose(candidates: Sequence[Candidate], prompt_tokens: int, load_limit: int,
           start: int = 0) -> CacheChoice:
    """The candidate to send a ``prompt_tokens``-token prompt to (``candidates`` non-empty);
    ``start`` rotates ties."""
    if not candidates:
        raise ValueError("no candidates")
    n = len(candidates)
    order = [candidates[(start + k) % n] for k in range(n)]
    least = min(c.load for c in order)
    eligible = [c for c in order if c.load <= least + load_limit]
    best = min(eligible, key=lambda c: _cost(c, prompt_tokens))
    cost = _cost(best, prompt_tokens)
    warmest = max(order, key=lambda c: c.cached_tokens)
    if warmest.cached_tokens == 0:
        untrusted = sum(1 for c in order if not c.trusted)
        why = (f"no instance holds a cached prefix of the prompt; fewest queued tokens "
               f"({best.queued_tokens:,})")
        if untrusted:
            why += f"; {untrusted} of {n} without an up-to-date KV index (routed by load)"
        return CacheChoice(best.id, 0, cost, why)
    held = f"{best.cached_tokens:,} of {prompt_tokens:,} prompt tokens cached"
    if best.cached_tokens >= warmest.cached_tokens:
        why = f"{held}, {best.queued_tokens:,} uncached tokens queued"
    elif warmest not in eligible:
        why = (f"{warmest.id} holds {warmest.cached_tokens:,} tokens but has {warmest.load} "
               f"requests, over the load limit ({least} + {load_limit}); {held} here")
    else:
        why = (f"{warmest.id} holds {warmest.cached_tokens:,} tokens but "
               f"{warmest.queued_tokens:,} uncached tokens are queued there; {held} here, "
               f"{best.queued_tokens:,} queued")
    return CacheChoice(best.id, best.cached_tokens, cost, why)


def _cost(c: Candidate, prompt_tokens: int) -> int:
    return max(0, prompt_tokens - c.cached_tokens) + c.queued_tokens
