"""The prefix hit rate a trace slice allows at best: one LRU cache of ``capacity`` trace blocks
(the fleet's KV capacity in 512-token blocks, as if every engine's cache were one and every
request went where its prefix is), the slice's hash ids replayed in order. Pure: no I/O.

A request's hit is its longest run of leading blocks found in the cache, in tokens, capped as
a vLLM engine caps it (and the simulated one): at most ``prompt - 1`` tokens, in whole engine
blocks (``engine_block`` tokens; the last prompt token is always computed). A trace block a
request fills only in part (its prompt's tail) is cached for that many tokens, rounded down
to engine blocks; a later request reusing the id hits those tokens and no more. After the
lookup the request's blocks are used (most recent last); the least recently used leave once
more than ``capacity`` are held.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

TRACE_BLOCK = 512  # the Mooncake trace's hash-id block, in tokens


@dataclass(frozen=True)
class HitBound:
    hit_tokens: int
    query_tokens: int
    capacity_blocks: int
    evictions: int

    @property
    def rate(self) -> float:
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0


def lru_hit_bound(requests: Iterable[tuple[Sequence[int], int]], capacity_blocks: int,
                  block_tokens: int = TRACE_BLOCK, engine_block: int = 16) -> HitBound:
    """``requests``: (hash ids, prompt tokens sent) in order; the hit tokens, query tokens
    (the prompts' tokens) and evictions of one LRU cache of ``capacity_blocks`` blocks."""
    if capacity_blocks < 0 or block_tokens < 1 or engine_block < 1:
        raise ValueError("capacity must be >= 0 and block sizes >= 1")
    cache: OrderedDict[int, int] = OrderedDict()  # hash id -> tokens of it cached
    hits = queries = evictions = 0
    for hash_ids, prompt in requests:
        if prompt < 1:
            continue
        used = -(-prompt // block_tokens)
        if used > len(hash_ids):
            raise ValueError(f"{prompt} tokens need {used} blocks, {len(hash_ids)} given")
        queries += prompt
        found = 0
        for i, h in enumerate(hash_ids[:used]):
            have = cache.get(h)
            if have is None:
                break
            found = i * block_tokens + have
            if have < block_tokens:
                break
        hits += min(found, (prompt - 1) // engine_block * engine_block)
        for i, h in enumerate(hash_ids[:used]):
            fill = min(block_tokens, prompt - i * block_tokens)
            fill = block_tokens if fill == block_tokens else fill // engine_block * engine_block
            cache[h] = max(cache.get(h, 0), fill)
            cache.move_to_end(h)
        while len(cache) > capacity_blocks:
            cache.popitem(last=False)
            evictions += 1
    return HitBound(hits, queries, capacity_blocks, evictions)
