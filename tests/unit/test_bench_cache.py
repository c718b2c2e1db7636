"""The cache benchmark's pure parts: the LRU hit-rate bound of a trace slice, the slice's
facts, and the goals read from a result."""

from __future__ import annotations

import math

import pytest

from bench.scenarios.cache.bound import lru_hit_bound
from bench.scenarios.cache.model import CacheOptions, PolicyRun, Sweep, SweepCell
from tests.unit.test_replay_trace import needs_traces

B = 512


def test_nothing_shared_nothing_hit() -> None:
    b = lru_hit_bound([((1, 2), 1000), ((3, 4), 1000)], 100)
    assert (b.hit_tokens, b.query_tokens, b.evictions) == (0, 2000, 0)
    assert b.rate == 0.0


def test_a_repeated_prompt_hits_all_but_its_last_token() -> None:
    b = lru_hit_bound([((1, 2), 2 * B), ((1, 2), 2 * B)], 100)
    # vLLM's cap: at most prompt - 1 tokens, in whole 16-token engine blocks
    assert b.hit_tokens == 2 * B - 16
    assert b.query_tokens == 4 * B


def test_only_the_leading_run_of_blocks_hits() -> None:
    b = lru_hit_bound([((1, 2, 3), 3 * B), ((1, 9, 3), 3 * B)], 100)
    assert b.hit_tokens == B  # block 3 is cached but follows a miss


def test_a_partly_filled_block_hits_only_its_filled_tokens() -> None:
    # the first prompt fills 100 tokens of block 2 (96 in whole engine blocks)
    b = lru_hit_bound([((1, 2), B + 100), ((1, 2, 5), 3 * B)], 100)
    assert b.hit_tokens == B + 96
    # once a request fills the block, a later one hits it whole
    b = lru_hit_bound([((1, 2), B + 100), ((1, 2, 5), 3 * B), ((1, 2, 6), 3 * B)], 100)
    assert b.hit_tokens == (B + 96) + 2 * B


def test_lru_evicts_the_least_recently_used() -> None:
    reqs = [((1, 2), 2 * B), ((3, 4), 2 * B), ((1, 2), 2 * B), ((5, 6), 2 * B),
            ((3, 4), 2 * B)]
    small = lru_hit_bound(reqs, 4)
    # capacity 4: (1,2) is used again (hit), then (5,6) evicts (3,4), so the last misses
    assert small.hit_tokens == 2 * B - 16
    assert small.evictions == 4  # and (3, 4) back evicts (1, 2)
    big = lru_hit_bound(reqs, 100)
    assert big.hit_tokens == 2 * (2 * B - 16) and big.evictions == 0


def test_zero_capacity_and_bad_input() -> None:
    assert lru_hit_bound([((1,), 100), ((1,), 100)], 0).hit_tokens == 0
    with pytest.raises(ValueError):
        lru_hit_bound([((1,), 2 * B)], 10)  # two blocks of tokens, one hash id
    with pytest.raises(ValueError):
        lru_hit_bound([], -1)


def test_the_bound_grows_with_capacity() -> None:
    reqs = [((0, i % 7, 100 + i), 3 * B) for i in range(50)]
    rates = [lru_hit_bound(reqs, c).rate for c in (0, 3, 10, 1000)]
    assert rates == sorted(rates) and rates[0] == 0 and rates[-1] > rates[1]


@needs_traces
def test_the_default_slice() -> None:
    from bench.scenarios.cache.plan import slice_facts

    f = slice_facts(CacheOptions.defaults(quick=True))
    assert f.requests == 120 and f.rate > 1
    assert 0 < f.bound_prefill <= f.bound_fleet <= f.bound_infinite < 1
    assert f.capacity_fleet == 2 * f.capacity_prefill
    assert 0.5 < f.prefill_utilization < 1.5


def _run(policy: str, p90: float, goodput: float, hits: float = 0.0, failed: int = 0
         ) -> PolicyRun:
    return PolicyRun(1, policy, "vllm-router" if policy == "vllm-router" else "pdctl",
                     requests=100, ok=100 - failed, failed=failed, ttft_p90_ms=p90,
                     goodput_per_s=goodput, prefill_hits=hits, prefill_queries=1000.0)


def test_goals_read_the_runs() -> None:
    from bench.scenarios.cache.model import CacheResult
    from bench.scenarios.cache.text import cache_text, goals

    runs = [_run("round_robin", 5000, 1.0), _run("least_loaded", 3000, 1.2),
            _run("cache_aware", 2000, 1.3, hits=95.0), _run("vllm-router", 2500, 1.1, failed=1)]
    sweep = Sweep(cells=[SweepCell(1024, "round_robin", 10, 0, 0.01),
                         SweepCell(1024, "cache_aware", 10, 0, 0.015)])
    res = CacheResult(CacheOptions(), 100, 30.0, 3.3, 12000.0, 60000, 0.97, 0.1, 0.12, 0.2,
                      3904, 7808, runs, sweep, [])
    res.goals = goals(res)
    assert [x.met for x in res.goals] == [False, True, True, True, True, False, True, None]
    text = cache_text(res)
    assert "NOT MET" in text and "vllm-router (round 1): 0 refused, 1 failed" in text
    assert math.isclose(runs[2].hit_rate, 0.095)


def test_the_fleet_and_the_command_lines() -> None:
    from pathlib import Path

    from bench.scenarios.cache.trace_run import fleet_config, replay_argv, vllm_router_argv

    o = CacheOptions()
    cfg = fleet_config(o, "cache_aware")
    assert cfg["routing"] == {"prefill_policy": "cache_aware", "decode_policy": "cache_aware"}
    assert cfg["pools"]["prefill"] == cfg["pools"]["decode"] == {"size": 4, "tp": 4}
    assert cfg["model"]["name"] == "llama-3.1-70b" and cfg["sim"]["time_scale"] == 0.5
    mixed = fleet_config(o, "cache_aware/least_loaded")["routing"]
    assert mixed == {"prefill_policy": "cache_aware", "decode_policy": "least_loaded"}
    argv = replay_argv(o, "http://x", Path("r.json"))
    assert "--text-prompts" in argv
    # goodput's targets are modelled ms: the replay measures wall ms
    assert argv[argv.index("--ttft-ms") + 1] == "1500"
    router = vllm_router_argv("vr", {"prefill": ["p1", "p2"], "decode": ["d1"]}, 9)
    assert router[:6] == ["vr", "--vllm-pd-disaggregation", "--prefill", "p1", "--prefill", "p2"]
    assert router[router.index("--policy") + 1] == "cache_aware"
