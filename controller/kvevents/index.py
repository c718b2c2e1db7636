"""Which instance holds which prefix block, from the engines' KV events. Pure: no I/O, no
clock (callers pass ``now``), every decision returned as data.

Keyed by the controller's own chain hash (``hashing.block_chain_hash``), not the engine's:
an engine's hashes depend on its ``--prefix-caching-hash-algo`` and ``PYTHONHASHSEED`` (random
per process for xxhash) and arrive truncated to 64 bits, while a ``BlockStored`` event carries
its blocks' token ids and its parent's engine hash. So each stored block is translated once,
``own = block_chain_hash(own(parent), tokens)``, and a per-instance map from engine hash to
own hash serves later children and removals. The router hashes a prompt the same way, whatever
each engine runs, at a fifth of the CPU of vLLM's pickle+SHA-256 (see ``hashing``).

Sequence numbers: a batch is applied only in order. A gap (``seq`` past the next expected)
returns ``NeedReplay(from_seq)`` and applies nothing; the caller replays and feeds the batches
back (duplicates are ignored), or calls ``replay_failed``. A stale instance holds no entries
(``longest_prefix`` says 0, ``trusted`` is false: route it by load) until it is rebuilt: an
``AllBlocksCleared`` event, or a publisher restart (``seq`` 0 again). ``remove`` drops an
instance (stopped, restarted, failed).

Not indexed (counted as ``skipped``): blocks of another medium (the CPU offload tier), of
another block size (partial-block entries), and with LoRA or extra keys (cache salt,
multimodal, prompt embeddings), which a router hashing token ids alone cannot predict;
their descendants find no parent and count as ``unresolved``. A hash stored twice (two
physical blocks, or two KV-cache groups) needs two removals: entries are refcounted."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from controller.kvevents.hashing import ROOT_HASH, block_contents, pack_ids
from controller.kvevents.wire import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EngineBlockHash,
    KVEventBatch,
)

DEFAULT_MAX_BLOCKS = 1 << 20
RATE_WINDOW_S = 10.0


@dataclass(frozen=True)
class Applied:
    instance: str
    seq: int
    stored: int
    removed: int
    cleared: bool


@dataclass(frozen=True)
class Duplicate:
    instance: str
    seq: int


@dataclass(frozen=True)
class NeedReplay:
    instance: str
    from_seq: int


@dataclass(frozen=True)
class MarkedStale:
    instance: str
    reason: str


@dataclass(frozen=True)
class Restarted:
    """The publisher started over (``seq`` 0 after later ones): entries dropped, then the
    batch applied."""

    instance: str
    applied: Applied


@dataclass(frozen=True)
class Ignored:
    """A batch of a stale instance without an ``AllBlocksCleared`` to rebuild from."""

    instance: str
    seq: int


Outcome = Applied | Duplicate | NeedReplay | MarkedStale | Restarted | Ignored


@dataclass(frozen=True)
class InstanceHealth:
    instance: str
    blocks: int
    last_seq: int | None
    stale: bool
    stale_reason: str | None
    events_per_s: float
    events: int
    skipped: int
    unresolved: int
    replays: int
    restarts: int


@dataclass
class _Instance:
    engine: dict[EngineBlockHash, list[int]] = field(default_factory=dict)  # -> [own, refs]
    own: dict[int, int] = field(default_factory=dict)  # own hash -> refs
    last_seq: int | None = None
    stale_reason: str | None = None
    events: int = 0
    skipped: int = 0
    unresolved: int = 0
    replays: int = 0
    restarts: int = 0
    window_start: float | None = None
    window_events: int = 0
    rate: float = 0.0
    expect_since: float | None = None

    def drop(self) -> None:
        self.engine.clear()
        self.own.clear()


class BlockIndex:
    def __init__(self, block_size: int, *, max_blocks: int = DEFAULT_MAX_BLOCKS,
                 mediums: Iterable[str | None] = (MEDIUM_GPU, None)) -> None:
        if block_size < 1 or max_blocks < 1:
            raise ValueError("block_size and max_blocks must be positive")
        self.block_size = block_size
        self.max_blocks = max_blocks
        self.mediums = frozenset(mediums)
        self._by_name: dict[str, _Instance] = {}

    # -- membership ---------------------------------------------------------------------
    def add(self, instance: str) -> None:
        """Expect ``instance``'s events from sequence number 0 (a fresh engine)."""
        self._by_name[instance] = _Instance()

    def reset(self, instance: str) -> None:
        """Start ``instance`` over before a rebuild from its publisher's replay buffer:
        no entries, not stale, expecting seq 0 again (its counters are kept)."""
        st = self._by_name.get(instance)
        if st is not None:
            st.drop()
            st.stale_reason = None
            st.last_seq = None
            st.expect_since = None

    def remove(self, instance: str) -> None:
        self._by_name.pop(instance, None)

    def instances(self) -> list[str]:
        return sorted(self._by_name)

    # -- events -------------------------------------------------------------------------
    def apply(self, instance: str, seq: int, batch: KVEventBatch, now: float) -> Outcome:
        st = self._by_name.get(instance)
        if st is None:
            st = self._by_name[instance] = _Instance()
        if seq == 0 and st.last_seq is not None:
            st.drop()
            st.stale_reason = None
            st.last_seq = None
            st.restarts += 1
            applied = self._apply_in_order(instance, st, seq, batch, now)
            return Restarted(instance, applied) if isinstance(applied, Applied) else applied
        if st.last_seq is not None and seq <= st.last_seq:
            return Duplicate(instance, seq)
        expected = 0 if st.last_seq is None else st.last_seq + 1
        if seq > expected and st.stale_reason is None:
            st.replays += 1
            return NeedReplay(instance, expected)
        return self._apply_in_order(instance, st, seq, batch, now)

    def replay_failed(self, instance: str, reason: str) -> MarkedStale:
        """The caller could not fill a gap: the instance is stale until rebuilt."""
        return self.mark_stale(instance, f"replay failed: {reason}")

    def mark_stale(self, instance: str, reason: str) -> MarkedStale:
        st = self._by_name.get(instance)
        if st is not None:  # an instance removed meanwhile stays removed
            st.drop()
            st.stale_reason = reason
        return MarkedStale(instance, reason)

    def note_expected(self, instance: str, now: float) -> None:
        """The router sent ``instance`` work that will store new blocks: if no event comes
        within the silence limit, ``check_silence`` marks it stale."""
        st = self._by_name.get(instance)
        if st is not None and st.expect_since is None:
            st.expect_since = now

    def check_silence(self, now: float, silence_s: float,
                      instance: str | None = None) -> list[MarkedStale]:
        out = []
        for name, st in list(self._by_name.items()):
            if instance is not None and name != instance:
                continue
            if (st.stale_reason is None and st.expect_since is not None
                    and now - st.expect_since > silence_s):
                st.expect_since = None
                out.append(self.mark_stale(name, f"no KV events for {silence_s:g} s after "
                                                 "work that stores blocks"))
        return out

    def _apply_in_order(self, instance: str, st: _Instance, seq: int, batch: KVEventBatch,
                        now: float) -> Applied | MarkedStale | Ignored:
        st.last_seq = seq
        st.expect_since = None
        self._count(st, len(batch.events), now)
        stored = removed = 0
        cleared = False
        for event in batch.events:
            if isinstance(event, AllBlocksCleared):
                st.drop()
                st.stale_reason = None
                cleared = True
                stored = removed = 0
            elif st.stale_reason is not None:
                continue
            elif isinstance(event, BlockStored):
                stored += self._store(st, event)
            elif isinstance(event, BlockRemoved):
                removed += self._remove(st, event)
            if len(st.engine) > self.max_blocks:
                return self.mark_stale(instance, f"more than {self.max_blocks} blocks")
        if st.stale_reason is not None:
            return Ignored(instance, seq)
        return Applied(instance, seq, stored, removed, cleared)

    def _store(self, st: _Instance, ev: BlockStored) -> int:
        n = len(ev.block_hashes)
        if (ev.medium not in self.mediums or ev.block_size != self.block_size
                or ev.lora_id is not None or ev.lora_name is not None
                or len(ev.token_ids) != n * ev.block_size):
            st.skipped += n
            return 0
        if ev.parent_block_hash is None:
            parent = ROOT_HASH
        elif (entry := st.engine.get(ev.parent_block_hash)) is not None:
            parent = entry[0]
        else:
            st.unresolved += n
            return 0
        keys = ev.extra_keys or ()
        try:
            contents = block_contents(pack_ids(ev.token_ids), self.block_size)
        except (OverflowError, TypeError):  # not 32-bit token ids: nothing a prompt matches
            st.skipped += n
            return 0
        for i, engine_hash in enumerate(ev.block_hashes):
            if i < len(keys) and keys[i] is not None:
                st.skipped += n - i
                return i
            own = hash((parent, contents[i]))  # hashing.block_chain_hash, batched
            entry = st.engine.get(engine_hash)
            if entry is None:
                st.engine[engine_hash] = [own, 1]
            elif entry[0] == own:
                entry[1] += 1
            else:  # the engine reused a hash for other tokens: trust the newest
                self._unref_own(st, entry[0], entry[1])
                st.engine[engine_hash] = [own, 1]
            st.own[own] = st.own.get(own, 0) + 1
            parent = own
        return n

    def _remove(self, st: _Instance, ev: BlockRemoved) -> int:
        if ev.medium not in self.mediums:
            return 0
        removed = 0
        for engine_hash in ev.block_hashes:
            entry = st.engine.get(engine_hash)
            if entry is None:
                continue
            entry[1] -= 1
            if entry[1] <= 0:
                del st.engine[engine_hash]
            self._unref_own(st, entry[0], 1)
            removed += 1
        return removed

    @staticmethod
    def _unref_own(st: _Instance, own: int, refs: int) -> None:
        left = st.own.get(own, 0) - refs
        if left > 0:
            st.own[own] = left
        else:
            st.own.pop(own, None)

    @staticmethod
    def _count(st: _Instance, events: int, now: float) -> None:
        st.events += events
        if st.window_start is None:
            st.window_start = now
        elapsed = now - st.window_start
        if elapsed >= RATE_WINDOW_S:
            st.rate = st.window_events / elapsed
            st.window_start, st.window_events = now, 0
        st.window_events += events

    # -- queries ------------------------------------------------------------------------
    def last_seq(self, instance: str) -> int | None:
        st = self._by_name.get(instance)
        return None if st is None else st.last_seq

    def trusted(self, instance: str) -> bool:
        st = self._by_name.get(instance)
        return st is not None and st.stale_reason is None

    def longest_prefix(self, instance: str, chain_hashes: Sequence[int]) -> int:
        """Tokens of the prompt's leading full blocks ``instance`` holds (0 when stale or
        unknown)."""
        st = self._by_name.get(instance)
        if st is None or st.stale_reason is not None:
            return 0
        own = st.own
        n = 0
        for h in chain_hashes:
            if h not in own:
                break
            n += 1
        return n * self.block_size

    def overlaps(self, chain_hashes: Sequence[int]) -> dict[str, int]:
        """``longest_prefix`` for every trusted instance."""
        return {name: self.longest_prefix(name, chain_hashes)
                for name, st in self._by_name.items() if st.stale_reason is None}

    def health(self, instance: str, now: float) -> InstanceHealth | None:
        st = self._by_name.get(instance)
        if st is None:
            return None
        rate = st.rate
        if st.window_start is not None and now - st.window_start >= RATE_WINDOW_S:
            rate = st.window_events / (now - st.window_start)
        return InstanceHealth(instance, len(st.own), st.last_seq, st.stale_reason is not None,
                              st.stale_reason, rate, st.events, st.skipped, st.unresolved,
                              st.replays, st.restarts)

    def health_all(self, now: float) -> list[InstanceHealth]:
        return [h for name in self.instances() if (h := self.health(name, now)) is not None]
