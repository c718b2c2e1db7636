"""Continuous batching in the style of vLLM v1, as pure data: no clock, no I/O.

The engine asks for a ``StepPlan``, sleeps the plan's modelled duration, then calls
``complete`` and learns which sequences produced a token or finished. Every sequence is a
count of computed tokens against its total (prompt + outputs so far), so prefill, chunked
prefill, decode, recompute after preemption and a decode that starts from remote KV are one
mechanism. Times are passed in (``now``) so tests drive the scheduler from tables.

Prefix caching follows vLLM 0.32's v1 KV cache manager (see ``blocks``): a sequence admitted
with nothing computed first looks up its prompt's leading full blocks in the cache, at most
``total - 1`` tokens of them (vLLM's ``max_cache_hit_length``: the last token is always
computed, to sample from), and starts computing after the hit. A block is cached once it is
scheduled to be filled (vLLM's ``allocate_slots`` caches the full blocks of the tokens it
schedules); a decode hop's blocks only once its KV pull is done (vLLM delays caching of
asynchronously loaded blocks). Only prompt blocks are cached: blocks filled by generated
tokens are not hashed here (vLLM would cache those too).
"""

from __future__ import annotations

import enum
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from controller.engines.sim.blocks import BlockPool, block_hashes


class Status(enum.Enum):
    WAITING = "waiting"
    WAITING_FOR_REMOTE_KV = "waiting_for_remote_kv"  # blocks allocated, KV pull in flight
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"


@dataclass(eq=False, slots=True)
class Seq:
    """One request inside the engine."""

    seq_id: str
    prompt_tokens: int
    max_tokens: int
    hold_kv: bool = False  # prefill hop: keep the KV blocks under a handle when finished
    remote_kv: bool = False  # decode hop: context arrives from a remote prefill before compute
    status: Status = Status.WAITING
    num_computed: int = 0  # tokens whose KV is in this engine's cache
    num_output: int = 0
    external_tokens: int = 0  # prompt tokens whose KV came over the wire
    scheduled: bool = False  # has been part of a step (ends its queue time)
    blocks: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)  # the prompt's (empty: never cached)
    block_size: int = 0  # block_hashes are over blocks of this size (0: none yet)
    block_hashes: list[int] = field(default_factory=list)  # the prompt's full blocks
    local_hit: int = 0  # prompt tokens found in this engine's prefix cache when admitted
    num_cached_blocks: int = 0  # leading blocks of ``blocks`` that are cached (hashed)
    preempted: bool = False

    @property
    def hit_blocks(self) -> int:
        return self.local_hit // self.block_size if self.block_size else 0

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.num_output

    @property
    def decoding(self) -> bool:
        """Needs exactly one more token computed on top of a cache: a decode step."""
        return self.num_computed > 0 and self.total - self.num_computed == 1


@dataclass(eq=False, slots=True)
class Handle:
    """KV blocks a finished prefill hop keeps for a decode engine to pull, under a lease.

    The lease starts at the finish time and is pushed later by heartbeats (never earlier),
    like NixlConnector's ``_reqs_to_send`` deadlines.
    """

    seq_id: str
    prompt_tokens: int
    blocks: list[int]
    created_at: float
    expires_at: float


@dataclass(slots=True)
class StepPlan:
    chunks: list[tuple[Seq, int]] = field(default_factory=list)  # (sequence, new tokens)
    kv_loads: list[Seq] = field(default_factory=list)  # start these KV pulls now
    first_scheduled: list[Seq] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.chunks

    def workload(self) -> tuple[list[tuple[int, int]], list[int]]:
        """``(prefill chunks as (tokens, context), decode contexts)`` for the cost model.

        Read before ``complete``: contexts are the cache sizes the step starts from.
        """
        prefill: list[tuple[int, int]] = []
        decode: list[int] = []
        for seq, n in self.chunks:
            if n == 1 and seq.num_computed > 0:
                decode.append(seq.num_computed + 1)
            else:
                prefill.append((n, seq.num_computed))
        return prefill, decode


@dataclass(slots=True)
class StepResult:
    tokens: list[Seq]  # produced one token this step (finished ones included)
    finished: list[Seq]


class Scheduler:
    """Waiting and running queues over a block pool, plus the handles of finished prefills."""

    def __init__(self, capacity_blocks: int, block_size: int, max_num_seqs: int,
                 max_num_batched_tokens: int, kv_lease_s: float = 30.0,
                 record_events: bool = False,
                 on_lookup: Callable[[int, int], None] | None = None) -> None:
        self.pool = BlockPool(capacity_blocks, block_size, record_events)
        self.on_lookup = on_lookup  # (queried tokens, hit tokens) of each first admission
        self.kv_lease_s = kv_lease_s
        self.block_size = block_size
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []
        self.handles: dict[str, Handle] = {}  # insertion order is creation order, not expiry
        self.num_preemptions = 0
        self._live: dict[str, Seq] = {}

    # ---- state -------------------------------------------------------------------------

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def kv_usage(self) -> float:
        return self.pool.usage

    def get(self, seq_id: str) -> Seq | None:
        return self._live.get(seq_id)

    def live_ids(self) -> list[str]:
        """The ids of the sequences waiting or running."""
        return list(self._live)

    def in_use(self, seq_id: str) -> bool:
        return seq_id in self._live or seq_id in self.handles

    # ---- requests come and go --------------------------------------------------------------

    def add(self, seq: Seq) -> None:
        if self.in_use(seq.seq_id):
            raise ValueError(f"sequence id {seq.seq_id!r} is already in use")
        if seq.token_ids and not seq.block_hashes:
            seq.block_hashes = block_hashes(seq.token_ids, self.block_size)
        seq.block_size = self.block_size
        self._live[seq.seq_id] = seq
        self.waiting.append(seq)

    def abort(self, seq_id: str) -> Seq | None:
        """Remove a live sequence wherever it is and free its blocks."""
        seq = self._live.pop(seq_id, None)
        if seq is None:
            return None
        if seq.status is Status.RUNNING:
            self.running.remove(seq)
        else:
            self.waiting.remove(seq)
        seq.status = Status.ABORTED
        self._release(seq)
        return seq

    def kv_loaded(self, seq_id: str) -> None:
        """The remote KV arrived: all but the last prompt token are cached.

        vLLM recomputes the last prompt token locally to sample the first output token, so
        the sequence continues with one token to compute, like a decode step.
        """
        seq = self._live[seq_id]
        seq.status, seq.remote_kv = Status.WAITING, False
        seq.num_computed = max(seq.prompt_tokens - 1, seq.local_hit)
        seq.external_tokens = seq.num_computed - seq.local_hit
        self._cache(seq, seq.prompt_tokens)

    def kv_failed(self, seq_id: str) -> None:
        """The pull failed and the policy is recompute: prefill locally in the same blocks."""
        seq = self._live[seq_id]
        seq.status, seq.remote_kv, seq.num_computed = Status.WAITING, False, seq.local_hit

    def pull(self, seq_id: str) -> Handle | None:
        """Hand a prefill's KV to a puller: the handle goes and its blocks are freed."""
        handle = self.handles.pop(seq_id, None)
        if handle is not None:
            self.pool.give_back(handle.blocks)
        return handle

    def expire(self, now: float) -> list[Handle]:
        """Free the handles whose lease ended at or before ``now``.

        Heartbeats move leases in place, so creation order is not expiry order: every
        handle is looked at, as vLLM's ``_reap_expired_send_leases`` does.
        """
        expired = [h for h in self.handles.values() if h.expires_at <= now]
        for handle in expired:
            self.pull(handle.seq_id)
        return expired

    def extend(self, seq_ids: list[str], until: float) -> int:
        """Heartbeat: push the leases of known handles to at least ``until``; unknown ids
        are ignored. Returns how many handles it found."""
        found = 0
        for seq_id in seq_ids:
            handle = self.handles.get(seq_id)
            if handle is not None:
                handle.expires_at = max(handle.expires_at, until)
                found += 1
        return found

    def next_expiry(self) -> float | None:
        """When the earliest lease ends, None without handles."""
        return min((h.expires_at for h in self.handles.values()), default=None)

    # ---- one step --------------------------------------------------------------------------

    def schedule(self) -> StepPlan:
        """Decodes first, then prefill chunks of running sequences, then admit waiting ones."""
        plan = StepPlan()
        budget = self._schedule_decodes(plan, self.max_num_batched_tokens)
        budget = self._schedule_prefills(plan, budget)
        self._admit(plan, budget)
        return plan

    def complete(self, plan: StepPlan, now: float) -> StepResult:
        """Apply a finished step: advance caches, sample tokens, finish sequences."""
        tokens: list[Seq] = []
        finished: list[Seq] = []
        for seq, n in plan.chunks:
            if seq.status is not Status.RUNNING:  # aborted while the step ran
                continue
            seq.num_computed += n
            if seq.num_computed < seq.total:  # a prefill chunk short of the prompt's end
                continue
            seq.num_output += 1
            tokens.append(seq)
            if seq.num_output >= seq.max_tokens:
                self._finish(seq, now)
                finished.append(seq)
        if finished:
            self.running = [s for s in self.running if s.status is Status.RUNNING]
        return StepResult(tokens, finished)

    # ---- runs of decode steps (the discrete-event driver) ------------------------------------

    def _growth(self, steps: int) -> list[tuple[int, int, Seq]]:
        """(step, position, sequence) of each block the running sequences take in the next
        ``steps`` decode steps, in the order ``schedule`` would take them."""
        bs = self.block_size
        out: list[tuple[int, int, Seq]] = []
        for pos, seq in enumerate(self.running):
            first = len(seq.blocks) * bs - seq.num_computed + 1  # the step that overflows
            out.extend((j, pos, seq) for j in range(max(first, 1), steps + 1, bs))
        out.sort(key=lambda g: (g[0], g[1]))
        return out

    def decode_growth(self, steps: int) -> int:
        """Blocks the running sequences would take in ``steps`` decode-only steps from now
        (the step already planned counts as the first)."""
        return len(self._growth(steps))

    def advance_decodes(self, steps: int) -> None:
        """Apply ``steps`` decode-only steps to every running sequence at once, as
        ``schedule`` and ``complete`` would one by one: blocks taken in the same order, one
        token each per step. The caller checks what makes that so: nothing waits, every
        running sequence decodes, none finishes within ``steps`` and the pool has room
        (``decode_growth``), so no step admits, preempts or finishes."""
        for _, _, seq in self._growth(steps):
            seq.blocks.extend(self.pool.take(1))
        for seq in self.running:
            seq.num_computed += steps
            seq.num_output += steps

    # ---- internals -------------------------------------------------------------------------

    def _schedule_decodes(self, plan: StepPlan, budget: int) -> int:
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            if not seq.decoding:
                i += 1
            elif self._grow_or_preempt(seq, seq.num_computed + 1):
                self._put(plan, seq, 1)
                budget -= 1
                i += 1
            # else: seq itself was preempted and left the list; index i is the next one
        return budget

    def _schedule_prefills(self, plan: StepPlan, budget: int) -> int:
        for seq in self.running:
            if budget <= 0:
                break
            if seq.decoding:
                continue
            n = min(seq.total - seq.num_computed, budget)
            # No preemption here: victims would be sequences already placed in this step.
            if self._grow(seq, seq.num_computed + n):
                self._put(plan, seq, n)
                budget -= n
        return budget

    def _admit(self, plan: StepPlan, budget: int) -> None:
        skipped: list[Seq] = []
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if seq.status is Status.WAITING_FOR_REMOTE_KV:
                skipped.append(self.waiting.popleft())
                continue
            hits = self._lookup(seq)
            if seq.remote_kv:  # blocks for the whole prompt, then the pull fills the missing
                if not self._grow(seq, seq.prompt_tokens, hits):
                    break
                self._hit(seq, hits)
                seq.status = Status.WAITING_FOR_REMOTE_KV
                plan.kv_loads.append(seq)
                skipped.append(self.waiting.popleft())
                continue
            start = len(hits) * self.block_size if hits else seq.num_computed
            n = min(seq.total - start, budget)
            if not self._grow(seq, start + n, hits):
                break  # first come, first served: no overtaking a request that does not fit
            self._hit(seq, hits)
            seq.num_computed = start
            self.waiting.popleft()
            seq.status = Status.RUNNING
            self.running.append(seq)
            self._put(plan, seq, n)
            budget -= n
        self.waiting.extendleft(reversed(skipped))

    def _lookup(self, seq: Seq) -> list[int] | None:
        """The cached blocks a sequence with no blocks yet may start from (None: no lookup,
        the sequence keeps its blocks)."""
        if seq.blocks or not seq.block_hashes:
            return None
        return self.pool.lookup(seq.block_hashes[:(seq.total - 1) // self.block_size])

    def _hit(self, seq: Seq, hits: list[int] | None) -> None:
        """``seq`` was admitted (its blocks taken) after a lookup that found ``hits``."""
        if hits is None:
            return
        seq.local_hit = len(hits) * self.block_size
        seq.num_cached_blocks = len(hits)
        if not seq.preempted and self.on_lookup is not None:
            self.on_lookup(seq.total, seq.local_hit)

    def _cache(self, seq: Seq, tokens: int) -> None:
        """The prompt's full blocks within the first ``tokens`` tokens are filled."""
        upto = min(tokens // self.block_size, len(seq.block_hashes), len(seq.blocks))
        if upto > seq.num_cached_blocks:
            self.pool.cache(seq.blocks, seq.block_hashes, seq.token_ids, seq.num_cached_blocks,
                            upto)
            seq.num_cached_blocks = upto

    def _put(self, plan: StepPlan, seq: Seq, n: int) -> None:
        plan.chunks.append((seq, n))
        if seq.num_cached_blocks < len(seq.block_hashes):
            self._cache(seq, seq.num_computed + n)
        if not seq.scheduled:
            seq.scheduled = True
            plan.first_scheduled.append(seq)

    def _grow(self, seq: Seq, tokens: int, hits: list[int] | None = None) -> bool:
        """Give ``seq`` blocks for ``tokens`` cached tokens, the cache ``hits`` first;
        False if the pool is short (then nothing changes)."""
        hits = hits or []
        need = math.ceil(tokens / self.block_size) - len(seq.blocks) - len(hits)
        if need <= 0 and not hits:
            return True
        if max(need, 0) + self.pool.evictable(hits) > self.pool.free:
            return False
        if hits:  # held before taking, so that taking cannot evict them
            self.pool.touch(hits)
            seq.blocks.extend(hits)
        if need > 0:
            seq.blocks.extend(self.pool.take(need))
        return True

    def _grow_or_preempt(self, seq: Seq, tokens: int) -> bool:
        """Grow ``seq``, preempting the newest running sequences (recompute) until it fits.

        False when ``seq`` itself was the one preempted.
        """
        while not self._grow(seq, tokens):
            victim = self.running.pop()
            self._preempt(victim)
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Seq) -> None:
        self._release(seq)
        seq.status, seq.remote_kv, seq.num_computed = Status.WAITING, False, 0
        seq.preempted, seq.local_hit = True, 0
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def _finish(self, seq: Seq, now: float) -> None:
        seq.status = Status.FINISHED
        del self._live[seq.seq_id]
        if seq.hold_kv:
            self.handles[seq.seq_id] = Handle(seq.seq_id, seq.prompt_tokens, seq.blocks, now,
                                              now + self.kv_lease_s)
            seq.blocks = []
        else:
            self._release(seq)

    def _release(self, seq: Seq) -> None:
        self.pool.give_back(seq.blocks)
        seq.blocks = []
        seq.num_cached_blocks = 0
