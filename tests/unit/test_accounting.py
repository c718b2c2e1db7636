"""TTFT breakdown: the parts always sum to the TTFT and come from the right sources."""

from __future__ import annotations

import itertools
import random

from controller.router.accounting import Breakdown, EngineTimes, Observation, breakdown


def total(b: Breakdown) -> float:
    return b.queue_ms + b.prefill_ms + b.transfer_ms + b.decode_sched_ms + b.overhead_ms


def test_disaggregated_parts_come_from_both_engines() -> None:
    p = EngineTimes(queue_ms=5.0, ttft_ms=40.0, itl_ms=0.0, kv_transfer_ms=None)
    d = EngineTimes(queue_ms=30.0, ttft_ms=10.0, itl_ms=12.0, kv_transfer_ms=25.0)
    b = breakdown(Observation(ttft_ms=100.0, disaggregated=True, prefill=p, decode=d))
    assert (b.queue_ms, b.prefill_ms, b.transfer_ms, b.decode_sched_ms) == (5, 40, 25, 15)
    assert b.overhead_ms == 15.0
    assert total(b) == b.ttft_ms == 100.0


def test_transfer_without_engine_report_uses_model_capped_by_decode_queue() -> None:
    d = EngineTimes(queue_ms=8.0, ttft_ms=2.0, itl_ms=0.0, kv_transfer_ms=None)
    b = breakdown(Observation(ttft_ms=50.0, disaggregated=True, decode=d, transfer_model_ms=27))
    assert b.transfer_ms == 8.0 and b.decode_sched_ms == 2.0


def test_colocated_has_no_transfer_or_decode_sched() -> None:
    d = EngineTimes(queue_ms=3.0, ttft_ms=20.0, itl_ms=5.0, kv_transfer_ms=None)
    b = breakdown(Observation(ttft_ms=30.0, disaggregated=False, decode=d))
    assert (b.queue_ms, b.prefill_ms, b.transfer_ms, b.decode_sched_ms) == (3, 20, 0, 0)
    assert b.overhead_ms == 7.0


def test_no_engine_metrics_falls_back_to_wall_times() -> None:
    b = breakdown(Observation(ttft_ms=90.0, disaggregated=True, prefill_wall_ms=50.0,
                              decode_wall_to_first_ms=30.0, transfer_model_ms=10.0))
    assert (b.prefill_ms, b.transfer_ms, b.decode_sched_ms) == (50.0, 10.0, 20.0)


def test_engine_parts_larger_than_ttft_are_scaled_to_fit() -> None:
    d = EngineTimes(queue_ms=60.0, ttft_ms=60.0, itl_ms=0.0, kv_transfer_ms=None)
    b = breakdown(Observation(ttft_ms=100.0, disaggregated=False, decode=d))
    assert b.overhead_ms == 0.0
    assert abs(b.queue_ms - 50.0) < 1e-3 and abs(total(b) - 100.0) < 1e-6


def test_invariant_holds_for_random_observations() -> None:
    rng = random.Random(7)
    for disagg, has_p, has_d in itertools.product([True, False], repeat=3):
        for _ in range(200):
            def times(rng: random.Random = rng) -> EngineTimes:
                return EngineTimes(rng.uniform(0, 50), rng.uniform(0, 200), rng.uniform(0, 30),
                                   rng.choice([None, rng.uniform(0, 80)]))
            o = Observation(ttft_ms=rng.uniform(0, 400), disaggregated=disagg,
                            prefill=times() if has_p else None, prefill_wall_ms=rng.uniform(0, 90),
                            decode=times() if has_d else None,
                            decode_wall_to_first_ms=rng.uniform(0, 90),
                            transfer_model_ms=rng.uniform(0, 40))
            b = breakdown(o)
            assert total(b) == b.ttft_ms
            assert min(b.parts().values()) >= 0
            assert abs(b.ttft_ms - round(o.ttft_ms, 3)) < 1e-6


def test_engine_times_parse_rejects_garbage() -> None:
    assert EngineTimes.parse(None) is None
    assert EngineTimes.parse({"queue_time_ms": "x"}) is None
    t = EngineTimes.parse({"queue_time_ms": 1, "time_to_first_token_ms": 2, "mean_itl_ms": 3})
    assert t == EngineTimes(1.0, 2.0, 3.0, None)


def test_gap_summary_is_the_nearest_rank_p99_and_the_worst_gap() -> None:
    from controller.router.accounting import gap_summary

    assert gap_summary(None) == (0.0, 0.0, 0) == gap_summary([])
    assert gap_summary([0.01] * 99 + [0.5]) == (10.0, 500.0, 100)
    assert gap_summary([0.02] * 98 + [0.4, 0.5]) == (400.0, 500.0, 100)
    assert gap_summary([0.03]) == (30.0, 30.0, 1)
