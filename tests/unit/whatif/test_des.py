"""The discrete-event driver against closed forms: an M/D/1 queue, one batch, a KV-bound
decode; and the router's own code choosing (policies, the hand-off threshold)."""

from __future__ import annotations

import random

import pytest

from controller.config import RoutingSettings
from controller.engines.sim.cost import step_duration
from controller.replay.trace import TraceRequest
from controller.whatif.events import EventQueue
from controller.whatif.fleet import Goals
from controller.whatif.layout import Layout
from controller.whatif.run import RunSpec, simulate
from pdctl_api import profiles
from tests.unit.whatif.shapes import BOX, TINY, WIRE, kv_box, requests, shape


def spec(routing: RoutingSettings | None = None, **kw: int) -> RunSpec:
    return RunSpec(shape(**kw), routing or RoutingSettings(), Goals(1e9, 1e9))


def test_events_run_in_time_order_ties_in_the_order_scheduled() -> None:
    q, seen = EventQueue(), []
    for when, name in ((2.0, "c"), (1.0, "a"), (1.0, "b"), (0.5, "first")):
        q.at(when, seen.append, name)
    q.run()
    assert seen == ["first", "a", "b", "c"] and q.now == 2.0 and q.handled == 4


def test_one_server_deterministic_service_poisson_arrivals_waits_as_m_d_1() -> None:
    """One engine taking one prompt a step (max_num_seqs 1), each a one-token answer: service
    time D is one prefill step; at load rho the mean wait is rho D / (2 (1 - rho))."""
    prompt = 200
    d = step_duration(TINY, BOX, 1, [(prompt, 0)], [])
    rho, n = 0.6, 10_000
    rng = random.Random(7)
    t, times = 0.0, []
    for _ in range(n):
        times.append(t)
        t += rng.expovariate(rho / d)
    res = simulate(requests(times, prompt, 1), Layout(1, 1), spec(max_num_seqs=1))
    recs = res.served.records
    assert len(recs) == n and all(r.prefill_instance is None for r in recs)
    for r in recs:  # the first token is the prefill step's: TTFT = wait + D
        assert r.ttft_ms == pytest.approx(r.queue_ms + d * 1e3, abs=2e-3)
    mean_wait = sum(r.queue_ms for r in recs) / n / 1e3
    assert mean_wait == pytest.approx(rho * d / (2 * (1 - rho)), rel=0.1)
    assert res.busy_s["decode"] == pytest.approx(n * d, rel=1e-9)


def test_requests_arriving_together_share_one_prefill_step_then_decode_together() -> None:
    n, prompt, out = 4, 100, 5
    res = simulate(requests([0.0] * n, prompt, out), Layout(1, 1), spec())
    first = step_duration(TINY, BOX, 1, [(prompt, 0)] * n, [])
    decode = [step_duration(TINY, BOX, 1, [], [prompt + k] * n) for k in range(1, out)]
    for row in res.served.rows:
        assert row.ttft_ms == pytest.approx(first * 1e3, abs=1e-3)
        assert row.e2e_ms == pytest.approx((first + sum(decode)) * 1e3, abs=1e-3)
        assert row.gaps == out - 1
        assert row.gap_max_ms == pytest.approx(max(decode) * 1e3, abs=1e-3)


def test_kv_capacity_bounds_the_sequences_decoding_at_once() -> None:
    """Room for 600 tokens (37 blocks of 16): two 200+50-token sequences (16 blocks each)
    fit, a third is not admitted until one finishes and frees its blocks."""
    hw = kv_box(600)
    assert profiles.kv_capacity_tokens(profiles.with_context(TINY, 256), hw, 1) == 600
    res = simulate(requests([0.0, 0.0, 0.0, 0.0], 200, 50), Layout(1, 1),
                   spec(hw=hw, context=256))
    rows = res.served.rows
    spans = [(r.ttft_ms - 0, r.e2e_ms) for r in rows]
    assert rows[2].ttft_ms >= min(rows[0].e2e_ms, rows[1].e2e_ms) - 1e-6
    assert rows[3].ttft_ms >= min(rows[0].e2e_ms, rows[1].e2e_ms) - 1e-6
    for at, _ in spans:  # at most two sequences hold KV at any first-token time
        assert sum(1 for a, e in spans if a <= at < e) <= 2
    # With room for all four, all start together.
    free = simulate(requests([0.0] * 4, 200, 50), Layout(1, 1), spec(context=256))
    assert len({r.ttft_ms for r in free.served.rows}) == 1


def test_prompts_from_the_threshold_go_through_a_prefill_instance_and_move_their_kv() -> None:
    routing = RoutingSettings(disagg_min_prompt_tokens=256)
    res = simulate(requests([0.0, 1.0, 2.0], 512, 4) + requests([3.0], 100, 4)[:1],
                   Layout(1, 1, 1, 1), spec(routing))
    long_, short = res.served.records[:3], res.served.records[3]
    for r in long_:
        assert r.prefill_instance == "prefill-0" and r.decision == "disaggregated"
        moved = profiles.kv_bytes(TINY, 512, 16)
        assert r.kv_bytes == moved
        assert r.transfer_ms == pytest.approx(profiles.transfer_seconds(moved, WIRE) * 1e3,
                                              abs=1e-3)
    assert short.prefill_instance is None and short.decision == "local"
    assert "threshold" in (short.decision_reason or "")


def test_decode_instances_are_chosen_by_the_pool_policy() -> None:
    times = [float(i) for i in range(6)]  # one at a time: no load to tell them apart
    rr = simulate(requests(times, 100, 2), Layout(3, 1),
                  spec(RoutingSettings(decode_policy="round_robin")))
    assert [r.decode_instance for r in rr.served.records] == [
        "decode-0", "decode-1", "decode-2"] * 2


def test_cache_aware_routing_sends_a_shared_prefix_where_it_is_cached() -> None:
    times = [0.0, 10.0, 20.0, 30.0]
    reqs = requests(times, 1024, 2, shared=2)  # the same two 512-token blocks
    aware = simulate(reqs, Layout(2, 1), spec(RoutingSettings(decode_policy="cache_aware")))
    loaded = simulate(reqs, Layout(2, 1), spec(RoutingSettings(decode_policy="least_loaded")))
    assert len({r.decode_instance for r in aware.served.records}) == 1
    assert [r.cached_tokens for r in aware.served.records][1:] == [1023 // 16 * 16] * 3
    assert len({r.decode_instance for r in loaded.served.records}) == 2
    assert sum(r.ttft_ms for r in aware.served.records) < sum(
        r.ttft_ms for r in loaded.served.records)


def test_the_slo_policy_serves_a_prompt_the_decode_instance_holds_locally() -> None:
    """The second request repeats the first's prompt: after the first, the decode instance
    holds it (its pulled KV is cached), so ``slo`` serves it there; ``threshold`` would send
    it through the prefill pool again."""
    routing = RoutingSettings(disagg_min_prompt_tokens=1)
    reqs = requests([0.0, 5.0], 2048, 4, shared=4)
    slo = simulate(reqs, Layout(1, 1, 1, 1, "slo"), spec(routing)).served.records
    fixed = simulate(reqs, Layout(1, 1, 1, 1), spec(routing)).served.records
    assert [r.decision for r in fixed] == ["disaggregated"] * 2
    assert slo[1].decision == "local" and slo[1].prefill_instance is None
    assert slo[1].decode_cached_tokens_predicted is None  # local: no KV moved
    assert "local ~" in (slo[1].decision_reason or "")
    assert slo[1].ttft_ms < fixed[1].ttft_ms


@pytest.mark.parametrize("policy", ["least_loaded", "round_robin"])
def test_runs_of_decode_steps_as_one_event_give_the_same_results(policy: str) -> None:
    """Poisson arrivals of mixed lengths on 1 prefill + 2 decode: every request's times,
    parts and gaps equal with decode runs as one event and stepped one by one."""
    rng = random.Random(3)
    t, reqs = 0.0, []
    for i in range(300):
        t += rng.expovariate(40.0)
        prompt, out = rng.choice((100, 700, 1500)), rng.randint(1, 120)
        reqs += requests([t], prompt, out, shared=rng.randint(0, 1))
        reqs[-1] = reqs[-1].__class__(i + 1, t, prompt, out, reqs[-1].hash_ids)
    routing = RoutingSettings(disagg_min_prompt_tokens=512, decode_policy=policy)
    hw = kv_box(6000)  # tight: decode runs meet a full pool now and then
    fast = simulate(reqs, Layout(2, 1, 1, 1), spec(routing, hw=hw), fast=True)
    slow = simulate(reqs, Layout(2, 1, 1, 1), spec(routing, hw=hw), fast=False)
    assert fast.events < slow.events / 2
    for a, b in zip(fast.served.records, slow.served.records, strict=True):
        assert (a.decode_instance, a.prefill_instance, a.ttft_ms, a.e2e_ms, a.queue_ms,
                a.prefill_ms, a.transfer_ms, a.decode_sched_ms, a.gap_p99_ms, a.gap_max_ms,
                a.gaps, a.cached_tokens) == (
                b.decode_instance, b.prefill_instance, b.ttft_ms, b.e2e_ms, b.queue_ms,
                b.prefill_ms, b.transfer_ms, b.decode_sched_ms, b.gap_p99_ms, b.gap_max_ms,
                b.gaps, b.cached_tokens)
    assert fast.busy_s == pytest.approx(slow.busy_s, rel=1e-9)


def test_the_rate_scale_divides_the_trace_s_times() -> None:
    reqs = requests([0.0, 4.0, 8.0], 100, 2)
    base = spec()
    faster = RunSpec(base.shape, base.routing, base.targets, rate_scale=2.0)
    assert simulate(reqs, Layout(1, 1), base).window_s == 8.0
    rows = simulate(reqs, Layout(1, 1), faster).served.rows
    assert [r.due_s for r in rows] == [0.0, 2.0, 4.0]
    assert [r.trace_s for r in rows] == [0.0, 4.0, 8.0]  # the trace's own times


def test_push_writes_what_pull_reads_and_skips_the_decode_engines_step() -> None:
    """Push (both hops at once, the prefill writes into blocks the decode hop registered):
    alone, the request's TTFT and bytes are pull's -- the same prefill, the same transfer on
    the link; while the decode engine runs a long decode, a pulled request waits for the step
    in progress before its transfer starts, a pushed one's blocks were registered on arrival
    and the write starts when the prefill ends."""
    routing = RoutingSettings(disagg_min_prompt_tokens=256)
    alone = requests([0.0], 4000, 4)
    pull = simulate(alone, Layout(1, 1, 1, 1), spec(routing))
    push = simulate(alone, Layout(1, 1, 1, 1, kv_mode="push"), spec(routing))
    [a], [b] = pull.served.records, push.served.records
    assert b.prefill_instance == "prefill-0" and b.kv_bytes == a.kv_bytes > 0
    assert b.ttft_ms == pytest.approx(a.ttft_ms, abs=1e-6)
    # a colocated 200-token answer keeps the decode engine stepping; then a long prompt
    busy = [TraceRequest(1, 0.0, 100, 200, (5000,)),
            TraceRequest(2, 0.01, 4000, 4, tuple(range(6000, 6008)))]
    pull = simulate(busy, Layout(1, 1, 1, 1), spec(routing), fast=False)
    push = simulate(busy, Layout(1, 1, 1, 1, kv_mode="push"), spec(routing), fast=False)
    [a], [b] = ([r for r in res.served.records if r.id == "r1"] for res in (pull, push))
    assert a.prefill_instance == b.prefill_instance == "prefill-0"
    assert b.ttft_ms < a.ttft_ms
    assert Layout(1, 1, 1, 1, kv_mode="push").label.endswith("(threshold, KV push)")
