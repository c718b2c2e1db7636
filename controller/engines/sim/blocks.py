"""The KV block pool with vLLM 0.32's prefix caching (``vllm/v1/core/block_pool.py``), as
pure data: no clock, no I/O.

Blocks are handed out by integer id, lazily, so a large pool costs no memory. A block has a
reference count (requests and prefill handles holding it) and, once its tokens are known to
be in it, a hash (``block_hashes``): then it is *cached* and a later request whose prompt
starts with the same full blocks reuses it instead of computing it (``lookup``, ``touch``).

Free blocks wait in vLLM's free block queue: blocks never handed out first (in id order, as
vLLM's queue starts), then freed ones in the order they were freed. A request's blocks are
freed last block first (vLLM's ``free`` passes them reversed), so a prompt's tail is evicted
before its head. Allocation takes from the head of the queue; a cached block taken from
there is evicted: its hash is forgotten and ``BlockRemoved`` recorded. A hit on a cached
block with no holder takes it out of the queue (``touch``).

Hashes: ``block_chain_hash`` over each full block's token ids, chained from the parent's
hash and from ``SIM_ROOT_HASH`` for a prompt's first block, cut to 64 bits as vLLM's int
hashes are. The root differs from the controller's own on purpose: like a real engine's,
these hashes are not the router's, which translates them from the token ids each
``BlockStored`` carries.

Events (``BlockStored``, ``BlockRemoved``, ``AllBlocksCleared``) are recorded only when
``record_events`` is on, and taken by the engine with ``take_events``."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from controller.kvevents.hashing import block_contents, pack_ids
from controller.kvevents.wire import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EngineBlockHash,
    KVEvent,
)

HASH_MASK = (1 << 64) - 1
# The parent of every prompt's first block in the simulated engines' chain.
SIM_ROOT_HASH = 0x51D_C0FFEE


def block_hashes(token_ids: Sequence[int] | bytes, block_size: int) -> list[int]:
    """The engine hashes of the full blocks of ``token_ids`` (or them packed), in order."""
    out: list[int] = []
    parent = SIM_ROOT_HASH
    for content in block_contents(
            token_ids if isinstance(token_ids, bytes) else pack_ids(token_ids), block_size):
        parent = hash((parent, content)) & HASH_MASK  # hashing.block_chain_hash, batched
        out.append(parent)
    return out


class BlockPool:
    """``capacity`` blocks, their reference counts, hashes and the free block queue."""

    def __init__(self, capacity: int, block_size: int = 16, record_events: bool = False
                 ) -> None:
        self.capacity = capacity
        self.block_size = block_size
        self.record_events = record_events
        self.used = 0  # blocks with a holder
        self._next = 0  # ids >= this were never handed out (the head of the free queue)
        self._queue: dict[int, None] = {}  # freed blocks, oldest first (insertion order)
        self._refs: dict[int, int] = {}  # block id -> holders (only blocks with holders)
        self._hash_of: dict[int, int] = {}  # block id -> hash, for cached blocks
        self._cached: dict[int, dict[int, None]] = {}  # hash -> its blocks, first cached first
        self._events: list[KVEvent] = []

    # ---- state -----------------------------------------------------------------------------

    @property
    def free(self) -> int:
        """Blocks without a holder: never used, or cached and evictable."""
        return self.capacity - self.used

    @property
    def usage(self) -> float:
        """Used share of the pool, 0..1 (cached blocks without a holder are free)."""
        return self.used / self.capacity if self.capacity else 0.0

    @property
    def num_cached(self) -> int:
        return len(self._hash_of)

    def cached_hashes(self) -> set[int]:
        """The hashes the cache holds now (what the engine's events announced and not
        removed since)."""
        return set(self._cached)

    def hash_of(self, block_id: int) -> int | None:
        return self._hash_of.get(block_id)

    def refs(self, block_id: int) -> int:
        return self._refs.get(block_id, 0)

    # ---- prefix hits -----------------------------------------------------------------------

    def lookup(self, hashes: Sequence[int]) -> list[int]:
        """The cached blocks of the longest prefix of ``hashes`` (vLLM's
        ``find_longest_cache_hit``); the caller limits ``hashes`` to what may hit."""
        out: list[int] = []
        for h in hashes:
            blocks = self._cached.get(h)
            if not blocks:
                break
            out.append(next(iter(blocks)))
        return out

    def evictable(self, block_ids: Sequence[int]) -> int:
        """How many of ``block_ids`` have no holder (a hit on them uses free space)."""
        return sum(1 for b in block_ids if b not in self._refs)

    def touch(self, block_ids: Sequence[int]) -> None:
        """A request holds these (hit) blocks: out of the free queue if no one held them."""
        for b in block_ids:
            refs = self._refs.get(b, 0)
            if refs == 0:
                self._queue.pop(b, None)
                self.used += 1
            self._refs[b] = refs + 1

    # ---- allocation ------------------------------------------------------------------------

    def take(self, n: int) -> list[int]:
        """``n`` block ids from the head of the free queue, evicting cached ones; the caller
        checks ``free`` first."""
        if n > self.free:
            raise ValueError(f"asked for {n} blocks, {self.free} free")
        fresh = min(n, self.capacity - self._next)
        ids = list(range(self._next, self._next + fresh))
        self._next += fresh
        evicted: list[EngineBlockHash] = []
        # One pass over the queue's head: ``next(iter(...))`` per block would rescan the
        # holes that deletions leave at a dict's front (quadratic in a busy engine).
        victims = list(itertools.islice(self._queue, n - fresh))
        queue = self._queue
        for b in victims:
            del queue[b]
            h = self._uncache(b)
            if h is not None:
                evicted.append(h)
        ids += victims
        for b in ids:
            self._refs[b] = 1
        self.used += n
        if evicted and self.record_events:
            self._events.append(BlockRemoved(block_hashes=evicted, medium=MEDIUM_GPU))
        return ids

    def give_back(self, ids: Sequence[int]) -> None:
        """One holder lets go of ``ids`` (a request's blocks, in order); blocks left without
        holders join the free queue's tail, last block first (vLLM frees in reverse)."""
        for b in reversed(ids):
            refs = self._refs[b] - 1
            if refs:
                self._refs[b] = refs
                continue
            del self._refs[b]
            self.used -= 1
            self._queue[b] = None

    # ---- caching ---------------------------------------------------------------------------

    def cache(self, block_ids: Sequence[int], hashes: Sequence[int], token_ids: Sequence[int],
              first: int, upto: int) -> None:
        """Blocks ``first..upto-1`` of a request now hold its tokens: hash them (the ones
        not cached yet) and record one ``BlockStored`` per run of newly cached blocks.
        ``block_ids``, ``hashes`` and ``token_ids`` are the request's."""
        run: list[EngineBlockHash] = []
        run_start = first
        for i in range(first, upto):
            b, h = block_ids[i], hashes[i]
            if b in self._hash_of:  # a hit, cached already
                self._store(run, run_start, hashes, token_ids)
                run, run_start = [], i + 1
                continue
            self._hash_of[b] = h
            self._cached.setdefault(h, {})[b] = None
            run.append(h)
        self._store(run, run_start, hashes, token_ids)

    def _store(self, run: list[EngineBlockHash], start: int, hashes: Sequence[int],
               token_ids: Sequence[int]) -> None:
        if not run or not self.record_events:
            return
        bs = self.block_size
        self._events.append(BlockStored(
            block_hashes=run, parent_block_hash=hashes[start - 1] if start else None,
            token_ids=list(token_ids[start * bs:(start + len(run)) * bs]), block_size=bs,
            lora_id=None, medium=MEDIUM_GPU, lora_name=None))

    def _uncache(self, b: int) -> int | None:
        h = self._hash_of.pop(b, None)
        if h is not None:
            blocks = self._cached[h]
            del blocks[b]
            if not blocks:
                del self._cached[h]
        return h

    def reset(self) -> bool:
        """Forget every cached hash (vLLM's ``reset_prefix_cache``): only when no block has
        a holder, as in vLLM; records ``AllBlocksCleared``. False (nothing done) otherwise."""
        if self.used:
            return False
        self._hash_of.clear()
        self._cached.clear()
        if self.record_events:
            self._events.append(AllBlocksCleared())
        return True

    # ---- events ----------------------------------------------------------------------------

    @property
    def has_events(self) -> bool:
        return bool(self._events)

    def take_events(self) -> list[KVEvent]:
        events, self._events = self._events, []
        return events
