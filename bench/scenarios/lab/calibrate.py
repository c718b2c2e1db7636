"""The lab scenario's calibration: the ``cpu-lab`` profile's constants that make the
simulator reproduce the real P/D lab's synchronous medians."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

from bench import stats
from bench.scenarios.lab.model import LabResult


def bisect_log(f: Callable[[float], float], target: float, lo: float, hi: float) -> float:
    """The argument where ``f`` (decreasing) reaches ``target``, by bisection on a log
    scale between ``lo`` and ``hi``."""
    for _ in range(100):
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if f(mid) > target else (lo, mid)
    return (lo * hi) ** 0.5


def suggest_calibration(res: LabResult, data: Path) -> dict[str, float] | None:
    """cpu-lab constants that make the simulator reproduce the real P/D lab's synchronous
    medians: ``mem_bandwidth`` from the decode ITL (a one-sequence decode step is memory-bound
    in the model), ``peak_flops`` from the prefill engine's time on the long prompts (compute-
    bound). Effective figures: they absorb vLLM's per-step CPU overhead, which the roofline's
    fixed 0.5 ms does not cover, and the sim's token estimate (UTF-8 bytes / 4)."""
    from controller.tokens import estimate_tokens
    from pdctl_api import profiles

    real = res.setups["disagg"].profiles.get("synchronous") if "disagg" in res.setups else None
    if real is None:
        return None
    itl_s = real.itl_p50_ms / 1e3
    prefill_ms = real.router.get("disaggregated", {}).get("prefill_ms")
    m, hw = profiles.model("lab-tiny"), profiles.hardware("cpu-lab")
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    long_rows = [r for r in rows if r["prompt_tokens_count"] >= res.threshold]
    n_est = int(stats.median(estimate_tokens(r["prompt"]) for r in long_rows))
    ctx = n_est + res.options.output_tokens // 2
    out: dict[str, float] = {
        "sim_tokens_of_median_long_prompt": n_est,
        "lab_tokens_of_median_long_prompt": stats.median(
            r["prompt_tokens_count"] for r in long_rows)}
    out["mem_bandwidth"] = bisect_log(
        lambda bw: profiles.decode_step_seconds(
            m, dataclasses.replace(hw, mem_bandwidth=bw), 1, [ctx]), itl_s, 1e6, 1e13)
    if prefill_ms:
        hw2 = dataclasses.replace(hw, mem_bandwidth=out["mem_bandwidth"])
        out["peak_flops"] = bisect_log(
            lambda pf: profiles.step_seconds(
                m, dataclasses.replace(hw2, peak_flops=pf), 1, n_est, 0, []),
            prefill_ms / 1e3, 1e6, 1e15)
    return out
