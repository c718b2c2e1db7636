"""The trace slice the cache scenario replays, as ``pdctl replay`` will send it: its requests
(cut to the model's context as the replay cuts them), its rate and lengths, the prefill work
it asks of the pool, and its hit-rate bounds (``bound.lru_hit_bound``) for the prefill pool's
KV capacity, the whole fleet's, and no limit."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from bench.scenarios.cache.bound import TRACE_BLOCK, lru_hit_bound
from bench.scenarios.cache.model import (
    CACHE_HARDWARE,
    DECODE,
    DISAGG_MIN_PROMPT,
    MODEL,
    PREFILL,
    TP,
    CacheOptions,
)
from controller.replay.prompts import fit_context
from controller.replay.schedule import Slice, select
from controller.replay.trace import load_trace
from pdctl_api import profiles

ENGINE_BLOCK = 16  # the simulated engines' KV block (--block-size default)


@dataclass
class SliceFacts:
    requests: int
    span_s: float
    rate: float
    prompt_mean: float
    prompt_max: int
    prefill_utilization: float
    bound_prefill: float
    bound_fleet: float
    bound_infinite: float
    capacity_prefill: int  # trace blocks (512 tokens)
    capacity_fleet: int


def engine_capacity_blocks() -> int:
    """One engine's KV capacity in trace blocks (the sim engine's capacity, in 512s)."""
    m, hw = profiles.model(MODEL), profiles.hardware(CACHE_HARDWARE)
    tokens = max(profiles.kv_capacity_tokens(m, hw, TP), m.max_model_len)
    return tokens // ENGINE_BLOCK * ENGINE_BLOCK // TRACE_BLOCK


def slice_facts(o: CacheOptions) -> SliceFacts:
    """The slice of ``o`` as the replay sends it. The bounds count the disaggregated requests
    only (prompt >= the controller's disagg_min_prompt_tokens): the ones whose prefill an
    engine of the prefill pool does, where the measured hit rate is read."""
    m, hw = profiles.model(MODEL), profiles.hardware(CACHE_HARDWARE)
    reqs = select(load_trace(o.trace), Slice(o.start_s, o.limit, o.time_scale, o.rate_scale))
    if not reqs:
        raise ValueError(f"{o.trace}: no request at or after {o.start_s:g} s")
    fitted = [fit_context(r, m.max_model_len) for r in reqs]
    seq = [(r.hash_ids, f.prompt_tokens) for r, f in zip(reqs, fitted, strict=True)
           if f.prompt_tokens >= DISAGG_MIN_PROMPT]
    span = (reqs[-1].time_s - reqs[0].time_s) / o.rate_scale
    work = sum(profiles.prefill_seconds(m, hw, TP, f.prompt_tokens) for f in fitted)
    per_engine = engine_capacity_blocks()
    cap_p, cap_f = per_engine * PREFILL, per_engine * (PREFILL + DECODE)
    return SliceFacts(
        len(reqs), span, len(reqs) / span if span else float("nan"),
        statistics.fmean(f.prompt_tokens for f in fitted), max(f.prompt_tokens for f in fitted),
        work / span / PREFILL if span else float("nan"),
        lru_hit_bound(seq, cap_p, engine_block=ENGINE_BLOCK).rate,
        lru_hit_bound(seq, cap_f, engine_block=ENGINE_BLOCK).rate,
        lru_hit_bound(seq, 1 << 62, engine_block=ENGINE_BLOCK).rate, cap_p, cap_f)
