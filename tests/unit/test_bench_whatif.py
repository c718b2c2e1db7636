"""The what-if benchmark's pure parts: the fidelity comparison (live records in wall ms
against discrete-event records in modelled ms) and its report."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from bench.scenarios.whatif.model import SpeedRun, WhatIfOptions, WhatIfResult
from bench.scenarios.whatif.run import compare
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
