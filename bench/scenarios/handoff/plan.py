"""The hand-off scenario's workloads: the Mooncake slice at two rate scales, a slice of the
Azure conversation trace, and a synthetic short-prompt, short-output trace (written as
Mooncake JSONL, prompts that share nothing); each with the facts of what it asks of the
fleet."""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

from bench.scenarios.cache.model import CACHE_HARDWARE as HARDWARE
from bench.scenarios.cache.model import DECODE, MODEL, PREFILL, TP
from bench.scenarios.handoff.model import (
    AZURE_LOAD,
    HIGH,
    LOW,
    SYNTH,
    HandoffOptions,
    Workload,
)
from controller.replay.prompts import fit_context
from controller.replay.schedule import Slice, select
from controller.replay.trace import BLOCK_TOKENS, blocks_for, load_trace
from pdctl_api import profiles

SYNTH_PROMPT = (64, 768)  # the synthetic load's prompt tokens, uniform
SYNTH_OUTPUT = (16, 96)  # ... and output tokens
SYNTH_BASE_ID = 1 << 40  # its hash ids: far from any trace's, each block its own


def synth_trace(path: Path, n: int, rate: float, seed: int = 11) -> Path:
    """``n`` short requests, Poisson arrivals at ``rate`` per second, as Mooncake JSONL."""
    rng = random.Random(seed)
    t, next_id, lines = 0.0, SYNTH_BASE_ID, []
    for _ in range(n):
        prompt = rng.randint(*SYNTH_PROMPT)
        ids = list(range(next_id, next_id + blocks_for(prompt)))
        next_id += len(ids)
        lines.append(json.dumps({"timestamp": round(t * 1e3, 3), "input_length": prompt,
                                 "output_length": rng.randint(*SYNTH_OUTPUT),
                                 "hash_ids": ids}))
        t += rng.expovariate(rate)
    path.write_text("\n".join(lines) + "\n")
    return path


def fill_facts(w: Workload, time_scale: float) -> Workload:
    """``w``'s lengths, rate and the modelled prefill work it asks (no prefix hits) against
    the prefill pool's time and the whole fleet's."""
    m, hw = profiles.model(MODEL), profiles.hardware(HARDWARE)
    reqs = select(load_trace(w.trace), Slice(w.start_s, w.limit, time_scale, w.rate_scale))
    if not reqs:
        raise ValueError(f"{w.trace}: no request at or after {w.start_s:g} s")
    fitted = [fit_context(r, m.max_model_len) for r in reqs]
    span = (reqs[-1].time_s - reqs[0].time_s) / w.rate_scale
    work = sum(profiles.prefill_seconds(m, hw, TP, f.prompt_tokens) for f in fitted)
    w.prompt_mean = statistics.fmean(f.prompt_tokens for f in fitted)
    w.output_mean = statistics.fmean(f.max_tokens for f in fitted)
    if span > 0:
        w.rate = len(reqs) / span
        w.prefill_util = work / span / PREFILL
        w.fleet_util = work / span / (PREFILL + DECODE)
    return w


def workloads(o: HandoffOptions, workdir: Path) -> list[Workload]:
    """Every workload of a run, its facts filled (the synthetic trace written to
    ``workdir``)."""
    synth = synth_trace(workdir / "short-synthetic.jsonl", o.synth_requests, o.synth_rate)
    out = [Workload(HIGH, o.trace, o.start_s, o.limit, o.high),
           Workload(LOW, o.trace, o.start_s, o.limit, o.low),
           Workload(SYNTH, synth, 0.0, o.synth_requests, 1.0, short=True),
           Workload(AZURE_LOAD, o.azure, o.azure_start_s, o.azure_limit, o.azure_rate_scale,
                    short=True)]
    return [fill_facts(w, o.time_scale) for w in out]


assert BLOCK_TOKENS == 512  # the synthetic trace's blocks are the trace format's
