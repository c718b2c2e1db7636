"""The simulated engine's scheduler and cost model: pure, driven step by step."""

from __future__ import annotations

import pytest

from controller.engines.sim.cost import step_duration
from controller.engines.sim.scheduler import Scheduler, Seq, Status, StepResult
from pdctl_api import profiles


def sched(blocks: int = 1000, *, seqs: int = 8, budget: int = 64, bs: int = 16,
          lease: float = 30.0) -> Scheduler:
    return Scheduler(blocks, bs, max_num_seqs=seqs, max_num_batched_tokens=budget,
                     kv_lease_s=lease)


def step(s: Scheduler, now: float = 0.0) -> tuple[list[tuple[str, int]], StepResult]:
    plan = s.schedule()
    chunks = [(seq.seq_id, n) for seq, n in plan.chunks]
    return chunks, s.complete(plan, now)


def run_until_done(s: Scheduler, limit: int = 1000) -> int:
    for i in range(limit):
        if not (s.running or s.waiting):
            return i
        step(s)
    raise AssertionError("did not drain")


def test_long_prompt_is_chunked_by_the_token_budget() -> None:
    s = sched(budget=100)
    s.add(Seq("a", prompt_tokens=250, max_tokens=2))
    assert step(s)[0] == [("a", 100)]
    assert step(s)[0] == [("a", 100)]
    chunks, result = step(s)
    assert chunks == [("a", 50)]
    assert [q.seq_id for q in result.tokens] == ["a"]  # first token after the last chunk
    chunks, result = step(s)
    assert chunks == [("a", 1)]
    assert [q.seq_id for q in result.finished] == ["a"]
    assert s.pool.used == 0


def test_decodes_go_first_and_prefill_fills_the_rest_of_the_budget() -> None:
    s = sched(budget=10)
    for i in range(4):
        s.add(Seq(f"d{i}", prompt_tokens=2, max_tokens=50))
    step(s)  # four 2-token prefills -> each has its first token
    s.add(Seq("p", prompt_tokens=100, max_tokens=1))
    chunks, _ = step(s)
    assert chunks == [("d0", 1), ("d1", 1), ("d2", 1), ("d3", 1), ("p", 6)]
    chunks, _ = step(s)
    assert chunks[:4] == [("d0", 1), ("d1", 1), ("d2", 1), ("d3", 1)]
    assert chunks[4] == ("p", 6)  # a running prefill continues after the decodes


def test_max_num_seqs_bounds_the_running_batch() -> None:
    s = sched(seqs=2)
    for i in range(3):
        s.add(Seq(f"r{i}", prompt_tokens=4, max_tokens=5))
    chunks, _ = step(s)
    assert [c[0] for c in chunks] == ["r0", "r1"]
    assert (s.num_running, s.num_waiting) == (2, 1)


def test_admission_waits_for_blocks_then_proceeds() -> None:
    s = sched(blocks=4, bs=16)
    s.add(Seq("a", prompt_tokens=64, max_tokens=1))
    s.add(Seq("b", prompt_tokens=16, max_tokens=1))
    chunks, result = step(s)
    assert chunks == [("a", 64)]
    assert s.num_waiting == 1  # b waits: all four blocks are a's
    assert [q.seq_id for q in result.finished] == ["a"]
    assert step(s)[0] == [("b", 16)]


def test_decode_that_needs_a_block_preempts_the_newest_sequence() -> None:
    s = sched(blocks=3, bs=4, budget=64)
    s.add(Seq("old", prompt_tokens=4, max_tokens=5))
    s.add(Seq("new", prompt_tokens=8, max_tokens=5))
    step(s)  # old: 1 block, new: 2 blocks; pool full
    assert s.pool.free == 0
    chunks, _ = step(s)  # old's 5th token needs a second block
    assert chunks == [("old", 1)]
    assert s.num_preemptions == 1
    assert s.waiting[0].seq_id == "new" and s.waiting[0].num_computed == 0
    assert run_until_done(s) > 0
    assert s.pool.used == 0


def test_prefill_hop_keeps_its_blocks_until_pulled() -> None:
    s = sched(bs=16)
    s.add(Seq("p", prompt_tokens=40, max_tokens=1, hold_kv=True))
    _, result = step(s, now=5.0)
    assert [q.seq_id for q in result.finished] == ["p"]
    handle = s.handles["p"]
    assert len(handle.blocks) == 3 and handle.prompt_tokens == 40 and handle.created_at == 5.0
    assert handle.expires_at == 35.0  # finish time + the 30 s lease
    assert s.pool.used == 3
    assert s.pull("p") == handle
    assert s.pool.used == 0
    assert s.pull("p") is None


def test_handles_expire_when_their_lease_ends() -> None:
    s = sched(lease=10.0)
    for i, t in enumerate((0.0, 1.0, 2.0)):
        s.add(Seq(f"h{i}", prompt_tokens=16, max_tokens=1, hold_kv=True))
        step(s, now=t)
    assert s.next_expiry() == 10.0
    assert s.expire(now=9.9) == []
    assert [h.seq_id for h in s.expire(now=11.5)] == ["h0", "h1"]
    assert list(s.handles) == ["h2"]
    assert s.pool.used == 1
    assert s.next_expiry() == 12.0
    s.expire(now=12.0)  # a lease ends at its expiry time, inclusive
    assert s.next_expiry() is None and s.pool.used == 0


def test_heartbeats_extend_leases_out_of_creation_order() -> None:
    s = sched(lease=10.0)
    for i, t in enumerate((0.0, 1.0, 2.0)):
        s.add(Seq(f"h{i}", prompt_tokens=16, max_tokens=1, hold_kv=True))
        step(s, now=t)
    assert s.extend(["h0", "nobody", "h2"], until=20.0) == 2  # unknown ids are ignored
    assert s.extend(["h0"], until=15.0) == 1  # never earlier than a lease already is
    assert s.handles["h0"].expires_at == 20.0
    # h0 is oldest but now lives longest: expiry scans every handle, not a prefix
    assert [h.seq_id for h in s.expire(now=11.0)] == ["h1"]
    assert s.next_expiry() == 20.0
    assert sorted(h.seq_id for h in s.expire(now=20.0)) == ["h0", "h2"]


def test_abort_frees_blocks_and_a_step_in_flight_skips_it() -> None:
    s = sched()
    s.add(Seq("a", prompt_tokens=32, max_tokens=5))
    s.add(Seq("b", prompt_tokens=32, max_tokens=5))
    plan = s.schedule()
    aborted = s.abort("a")
    assert aborted is not None and aborted.status is Status.ABORTED
    result = s.complete(plan, 0.0)
    assert [q.seq_id for q in result.tokens] == ["b"]
    assert s.pool.used == 2 and s.num_running == 1
    assert s.abort("a") is None


def test_abort_while_waiting() -> None:
    s = sched(seqs=1)
    s.add(Seq("a", prompt_tokens=4, max_tokens=5))
    s.add(Seq("b", prompt_tokens=4, max_tokens=5))
    step(s)
    s.abort("b")
    assert s.num_waiting == 0


def test_remote_kv_allocates_then_waits_for_the_pull() -> None:
    s = sched(bs=16)
    s.add(Seq("d", prompt_tokens=100, max_tokens=3, remote_kv=True))
    plan = s.schedule()
    assert plan.empty and [q.seq_id for q in plan.kv_loads] == ["d"]
    assert s.pool.used == 7 and s.num_waiting == 1 and s.num_running == 0
    assert s.schedule().kv_loads == []  # the pull is started once
    s.kv_loaded("d")
    plan = s.schedule()
    assert [(q.seq_id, n) for q, n in plan.chunks] == [("d", 1)]
    assert plan.workload() == ([], [100])  # priced as a decode over the pulled context
    result = s.complete(plan, 0.0)
    assert [q.seq_id for q in result.tokens] == ["d"]
    assert s.get("d") is not None and s.get("d").external_tokens == 99  # type: ignore[union-attr]


def test_failed_pull_with_recompute_prefills_locally() -> None:
    s = sched(bs=16, budget=1000)
    s.add(Seq("d", prompt_tokens=100, max_tokens=2, remote_kv=True))
    s.schedule()
    s.kv_failed("d")
    chunks, result = step(s)
    assert chunks == [("d", 100)]
    assert result.tokens[0].external_tokens == 0
    assert s.pool.used == 7


def test_duplicate_ids_are_refused() -> None:
    s = sched()
    s.add(Seq("x", prompt_tokens=4, max_tokens=1, hold_kv=True))
    with pytest.raises(ValueError, match="already in use"):
        s.add(Seq("x", prompt_tokens=4, max_tokens=1))
    step(s)
    assert s.in_use("x")  # its handle still holds the id


def test_several_prefill_chunks_cost_the_sum_of_their_attention() -> None:
    m, hw = profiles.model("llama-3-70b"), profiles.hardware("h100-sxm")
    chunks = [(512, 0), (256, 1024), (64, 0)]
    flops = sum(profiles.prefill_flops(m, n, c) for n, c in chunks)
    expected = flops / (hw.peak_flops * profiles.Efficiency().prefill_mfu * 4)
    got = step_duration(m, hw, 4, chunks, []) - profiles.Efficiency().step_overhead_s
    assert got == pytest.approx(expected, rel=1e-4)


def test_decode_cost_is_the_profiles_decode_step() -> None:
    m, hw = profiles.model("llama-3-8b"), profiles.hardware("h100-sxm")
    assert step_duration(m, hw, 1, [], [100, 200]) == profiles.decode_step_seconds(
        m, hw, 1, [100, 200])
