"""The simulated engine's prefix cache as pure code: the block pool's hits, LRU eviction and
events, and the scheduler's use of it (the last-token rule, decode hops pulling only the
missing blocks, metrics hooks)."""

from __future__ import annotations

from collections.abc import Sequence

from controller.engines.sim.blocks import SIM_ROOT_HASH, BlockPool, block_hashes
from controller.engines.sim.scheduler import Scheduler, Seq, Status
from controller.kvevents.hashing import ROOT_HASH, block_chain_hash, prompt_chain_hashes
from controller.kvevents.wire import AllBlocksCleared, BlockRemoved, BlockStored

BS = 4


def sched(blocks: int = 64, budget: int = 1000) -> tuple[Scheduler, list[tuple[int, int]]]:
    lookups: list[tuple[int, int]] = []
    s = Scheduler(blocks, BS, max_num_seqs=8, max_num_batched_tokens=budget,
                  record_events=True, on_lookup=lambda q, h: lookups.append((q, h)))
    return s, lookups


def run(s: Scheduler, seq: Seq) -> None:
    """Add ``seq`` and step until it finished (or waits for remote KV)."""
    s.add(seq)
    for _ in range(100):
        if seq.status in (Status.FINISHED, Status.WAITING_FOR_REMOTE_KV):
            return
        s.complete(s.schedule(), 0.0)
    raise AssertionError("did not finish")


def stored(events: Sequence[object]) -> list[BlockStored]:
    return [e for e in events if isinstance(e, BlockStored)]


def test_hashes_chain_from_the_simulator_root_and_fit_64_bits() -> None:
    ids = list(range(10))
    hashes = block_hashes(ids, BS)
    assert len(hashes) == 2  # the trailing partial block has none
    assert hashes[0] == block_chain_hash(SIM_ROOT_HASH, ids[:4]) & (2**64 - 1)
    assert hashes[1] == block_chain_hash(hashes[0], ids[4:8]) & (2**64 - 1)
    assert all(0 <= h < 2**64 for h in hashes)
    assert SIM_ROOT_HASH != ROOT_HASH
    assert set(hashes).isdisjoint(prompt_chain_hashes(ids, BS))  # not the controller's


def test_a_shared_prefix_hits_and_skips_its_compute() -> None:
    s, lookups = sched()
    a = Seq("a", 10, 1, token_ids=list(range(10)))
    run(s, a)
    events = s.pool.take_events()
    assert [e.block_hashes for e in stored(events)] == [block_hashes(range(10), BS)]
    assert stored(events)[0].parent_block_hash is None
    assert stored(events)[0].token_ids == list(range(8))
    b = Seq("b", 13, 1, token_ids=list(range(8)) + [99] * 5)
    s.add(b)
    plan = s.schedule()
    assert plan.chunks == [(b, 5)]  # 13 tokens, 8 of them hit
    assert plan.workload() == ([(5, 8)], [])  # computes the 5 others on an 8-token context
    assert b.local_hit == 8
    assert [s.pool.hash_of(x) for x in b.blocks[:2]] == block_hashes(range(8), BS)
    assert lookups == [(10, 0), (13, 8)]
    new = stored(s.pool.take_events())
    assert len(new) == 1 and new[0].parent_block_hash == block_hashes(range(8), BS)[-1]
    assert new[0].token_ids == list(b.token_ids[8:12])


def test_the_last_token_is_always_computed() -> None:
    s, lookups = sched()
    run(s, Seq("a", 8, 1, token_ids=list(range(8))))
    again = Seq("b", 8, 1, token_ids=list(range(8)))
    s.add(again)
    plan = s.schedule()
    # max hit = 8 - 1 = 7 tokens, rounded down to whole blocks: one block of 4
    assert again.local_hit == 4 and plan.chunks == [(again, 4)]
    s.complete(plan, 0.0)
    longer = Seq("c", 9, 1, token_ids=list(range(8)) + [5])
    s.add(longer)
    plan = s.schedule()
    assert longer.local_hit == 8 and plan.chunks == [(longer, 1)]
    assert lookups[1:] == [(8, 4), (9, 8)]


def test_a_hit_on_a_held_block_shares_it() -> None:
    s, _ = sched()
    a = Seq("a", 9, 50, token_ids=list(range(9)))
    s.add(a)
    s.complete(s.schedule(), 0.0)  # a's prompt done, a keeps decoding
    b = Seq("b", 9, 1, token_ids=list(range(9)))
    s.add(b)
    s.schedule()
    assert b.blocks[:2] == a.blocks[:2]
    assert s.pool.refs(a.blocks[0]) == 2
    assert s.pool.used == 4  # 3 of a's, and b's own last block


def test_freed_blocks_stay_cached_and_are_evicted_lru_tail_first() -> None:
    pool = BlockPool(4, BS, record_events=True)
    tokens = list(range(8))
    hashes = block_hashes(tokens, BS)
    a = pool.take(2)
    pool.cache(a, hashes, tokens, 0, 2)
    pool.give_back(a)
    assert pool.used == 0 and pool.free == 4 and pool.cached_hashes() == set(hashes)
    assert pool.lookup(hashes) == a
    other = pool.take(2)  # never-used blocks first: nothing evicted
    assert set(other).isdisjoint(a) and pool.lookup(hashes) == a
    pool.give_back(other)
    pool.take_events()
    assert pool.take(1) == [a[1]]  # a's tail block was freed first
    assert pool.take_events() == [BlockRemoved(block_hashes=[hashes[1]], medium="GPU")]
    assert pool.lookup(hashes) == [a[0]]  # the head block still hits


def test_a_hit_takes_an_evictable_block_off_the_free_queue() -> None:
    pool = BlockPool(2, BS, record_events=True)
    tokens = list(range(4))
    hashes = block_hashes(tokens, BS)
    a = pool.take(1)
    pool.cache(a, hashes, tokens, 0, 1)
    pool.give_back(a)
    pool.take(1)  # the other, never-used block
    hit = pool.lookup(hashes)
    assert pool.evictable(hit) == 1
    pool.touch(hit)
    assert pool.free == 0 and pool.refs(a[0]) == 1
    pool.give_back(hit)
    assert pool.free == 1 and pool.lookup(hashes) == a


def test_the_scheduler_evicts_for_new_work_and_reports_removals() -> None:
    s, _ = sched(blocks=4)
    run(s, Seq("a", 8, 1, token_ids=list(range(8))))  # 2 blocks, then 1 more to decode
    s.pool.take_events()
    run(s, Seq("b", 16, 1, token_ids=list(range(100, 116))))  # needs all 4 blocks
    events = s.pool.take_events()
    removed = [h for e in events if isinstance(e, BlockRemoved) for h in e.block_hashes]
    assert sorted(removed) == sorted(block_hashes(range(8), BS))
    assert s.pool.cached_hashes() == set(block_hashes(range(100, 116), BS))


def test_a_decode_hop_pulls_only_the_blocks_it_misses() -> None:
    s, lookups = sched()
    run(s, Seq("warm", 9, 1, token_ids=list(range(8)) + [77]))  # caches 2 blocks
    s.pool.take_events()
    hop = Seq("hop", 14, 3, remote_kv=True, token_ids=list(range(8)) + [1] * 6)
    run(s, hop)
    assert hop.status is Status.WAITING_FOR_REMOTE_KV
    assert hop.hit_blocks == 2 and len(hop.blocks) == 4  # 2 hits, 2 blocks to pull into
    assert lookups[-1] == (14, 8)
    assert not stored(s.pool.take_events())  # pulled blocks are cached once they arrive
    s.kv_loaded("hop")
    assert hop.num_computed == 13 and hop.external_tokens == 5  # 13 - 8 local hits
    new = stored(s.pool.take_events())
    assert len(new) == 1 and new[0].block_hashes == [block_hashes(hop.token_ids, BS)[2]]
    assert new[0].parent_block_hash == block_hashes(range(8), BS)[1]


def test_reset_needs_every_block_free() -> None:
    s, _ = sched()
    a = Seq("a", 9, 50, token_ids=list(range(9)))
    s.add(a)
    s.complete(s.schedule(), 0.0)
    assert not s.pool.reset()
    s.abort("a")
    s.pool.take_events()
    assert s.pool.reset()
    assert s.pool.take_events() == [AllBlocksCleared()]
    assert s.pool.cached_hashes() == set() and s.pool.lookup(block_hashes(range(9), BS)) == []


def test_no_events_are_kept_unless_asked() -> None:
    s = Scheduler(16, BS, 8, 100)
    run(s, Seq("a", 9, 1, token_ids=list(range(9))))
    assert not s.pool.has_events and s.pool.num_cached == 2
