"""The what-if benchmark's pure parts: the fidelity comparison (live records in wall ms
against discrete-event records in modelled ms) and its report."""

from __future__ import annotations

import argparse
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench.scenarios.whatif.model import SpeedRun, WhatIfOptions, WhatIfResult
from bench.scenarios.whatif.run import compare, lab_fleet_config, lab_spec
from bench.scenarios.whatif.text import whatif_report

PARTS = ("ttft", "queue", "prefill", "transfer", "decode_sched", "gap_p99")


def test_live_times_are_unscaled_before_they_are_compared() -> None:
    live = [{f"{p}_ms": 2.0 * v for p in PARTS} for v in (10.0, 20.0, 30.0)]
    des = [SimpleNamespace(**{f"{p}_ms": v * 1.1 for p in PARTS}) for v in (10.0, 20.0, 30.0)]
    got = compare(live, des, scale=2.0)
    assert [f.part for f in got] == list(PARTS)
    for f in got:
        assert f.live_p50 == 20.0 and f.des_p50 == pytest.approx(22.0)
        assert f.p50_error == pytest.approx(0.1) and f.p90_error == pytest.approx(0.1)


def test_the_report_shows_speed_and_each_part_s_error() -> None:
    res = WhatIfResult(WhatIfOptions(), SpeedRun(12031, 3540.0, 40.0, 3_500_000, 700.0, 0.9),
                       compare([{f"{p}_ms": 10.0 for p in PARTS}],
                               [SimpleNamespace(**{f"{p}_ms": 12.0 for p in PARTS})], 1.0),
                       fidelity_requests=1)
    text = whatif_report(res)
    assert "12,031 requests" in text and "88x the trace's time" in text
    assert "| queue | 10.0 | 12.0 | +20% | 10.0 | 12.0 | +20% |" in text


def test_against_the_lab_both_sides_run_the_labs_configuration(tmp_path: Path) -> None:
    """``--lab``: the live side is ``pdctl lab``'s real configuration and the discrete-event
    side the same model, hardware, link and routing, in real time on the lab's 1 + 1."""
    from bench.scenarios.whatif import WhatIfScenario

    ap = argparse.ArgumentParser()
    scenario = WhatIfScenario()
    scenario.add_options(ap)
    o = scenario.options(ap.parse_args(["--lab", str(tmp_path), "--time-scale", "0.5"]))
    assert (o.fidelity_prefill, o.fidelity_decode, o.time_scale) == (1, 1, 1.0)
    cfg = lab_fleet_config(tmp_path)
    assert cfg["backend"] == "vllm" and cfg["model"]["path"] == str(tmp_path.resolve())
    spec = lab_spec()
    assert (spec.shape.model.name, spec.shape.hardware.name, spec.shape.link.name) == (
        cfg["model"]["name"], cfg["hardware"]["accelerator"], cfg["hardware"]["kv_link"])
    assert spec.routing.disagg_min_prompt_tokens == cfg["routing"]["disagg_min_prompt_tokens"]
    res = WhatIfResult(o, SpeedRun(10, 60.0, 1.0, 100, 50.0, 1.0), [])
    assert "the real CPU lab (vLLM, KV over NIXL)" in whatif_report(res)
