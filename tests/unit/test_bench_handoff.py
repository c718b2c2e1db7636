"""The hand-off benchmark's pure parts: policies and labels, the best threshold, the goals,
the decision reasons' kinds, the records' summary, the synthetic trace and the report."""

from __future__ import annotations

import math
from pathlib import Path

from bench.scenarios.handoff import later_policies
from bench.scenarios.handoff.model import (
    AZURE_LOAD,
    HIGH,
    LOCAL,
    LOW,
    SLO,
    SYNTH,
    HandoffOptions,
    HandoffResult,
    HandoffRun,
    Workload,
    policy_label,
    policy_threshold,
    threshold_policy,
)
from bench.scenarios.handoff.plan import synth_trace
from bench.scenarios.handoff.text import best_threshold, handoff_goals, handoff_text
from bench.scenarios.handoff.trace_run import compact, handoff_fleet_config, reason_kind
from bench.scenarios.handoff.trace_run import summarize_records as summarize
from controller.replay.trace import load_trace


def run(workload: str, policy: str, mean: float, p90: float | None = None,
        p99: float | None = None, rnd: int = 1, error: str | None = None) -> HandoffRun:
    r = HandoffRun(workload, rnd, policy, error=error, requests=10, ok=10)
    r.ttft_mean_ms = mean
    r.ttft_p90_ms = mean * 2 if p90 is None else p90
    r.ttft_p99_ms = mean * 3 if p99 is None else p99
    return r


def loads() -> list[Workload]:
    p = Path("x")
    return [Workload(HIGH, p, 0, 10, 1.5), Workload(LOW, p, 0, 10, 0.6),
            Workload(SYNTH, p, 0, 10, 1.0, short=True),
            Workload(AZURE_LOAD, p, 0, 10, 1.0, short=True)]


def test_policy_names_and_labels() -> None:
    assert policy_threshold(threshold_policy(8192)) == 8192
    assert policy_threshold(SLO) is None
    assert policy_label(threshold_policy(0)) == "always-disagg"
    assert policy_label(threshold_policy(LOCAL)) == "always-local"
    assert policy_label(threshold_policy(16384)) == "threshold 16k"
    assert policy_label(threshold_policy(1000)) == "threshold 1000"
    assert policy_label(SLO) == "slo"


def test_best_threshold_by_mean_ttft_median_over_rounds() -> None:
    runs = [run(HIGH, threshold_policy(0), 9000), run(HIGH, threshold_policy(8192), 5000),
            run(HIGH, threshold_policy(8192), 7000, rnd=2),
            run(HIGH, threshold_policy(LOCAL), 5500), run(HIGH, SLO, 100),
            run(LOW, threshold_policy(2048), 10),
            run(HIGH, threshold_policy(2048), 1, error="boom")]
    assert best_threshold(runs) == LOCAL  # 8k's median is 6000
    assert best_threshold([run(HIGH, SLO, 1)]) is None
    # a tie goes to the lower threshold
    assert best_threshold([run(HIGH, threshold_policy(2048), 5.0),
                           run(HIGH, threshold_policy(0), 5.0)]) == 0


def test_later_policies() -> None:
    assert later_policies(8192) == [threshold_policy(8192), threshold_policy(0),
                                    threshold_policy(LOCAL), SLO]
    assert later_policies(0) == [threshold_policy(0), threshold_policy(LOCAL), SLO]
    assert later_policies(None) == [threshold_policy(0), threshold_policy(LOCAL), SLO]


def result(runs: list[HandoffRun], best: int | None) -> HandoffResult:
    return HandoffResult(HandoffOptions(), loads(), runs, best, [])


def test_goals_met_and_not() -> None:
    local = threshold_policy(LOCAL)
    runs = [run(HIGH, threshold_policy(8192), 6000), run(HIGH, SLO, 2900),
            run(SYNTH, local, 100), run(SYNTH, SLO, 109),
            run(AZURE_LOAD, local, 200), run(AZURE_LOAD, SLO, 200, p90=450)]
    g = handoff_goals(result(runs, 8192))
    assert [x.met for x in g] == [True, True, False, True]
    assert "threshold 8k" in g[0].text and "2.07x" in g[0].detail
    assert "p90 450 vs 400 ms (+12%)" in g[2].detail
    runs[1] = run(HIGH, SLO, 3100)
    assert handoff_goals(result(runs, 8192))[0].met is False


def test_goals_not_measured_and_failures() -> None:
    runs = [run(HIGH, SLO, 1000), run(SYNTH, SLO, 1, error="FleetError: gone")]
    g = handoff_goals(result(runs, None))
    assert g[0].met is None and g[1].met is None and g[2].met is None
    assert g[3].met is False and "run failed: FleetError" in g[3].detail


def test_reason_kinds() -> None:
    assert reason_kind("local", "threshold: 100 prompt tokens < 512") == "local: threshold"
    assert reason_kind("disaggregated", "threshold: 600 prompt tokens >= 512") == \
        "disaggregated: threshold"
    assert reason_kind("local", "no ready prefill instance") == "local: no prefill instance"
    assert reason_kind("local", "decode instance holds the prompt (9 tokens cached): x") == \
        "local: prompt cached on decode"
    est = "local ~1,200 ms, disaggregated ~800 ms"
    assert reason_kind("disaggregated", est) == "disagg: faster"
    assert reason_kind("disaggregated", est + "; local prefill would stall 3 streams ~90 ms "
                       "(gap target 75 ms)") == "disagg: gap guard"
    assert reason_kind("local", est) == "local: faster (or no clear gain)"
    assert reason_kind("local", est + "; stalls 3 streams ~90 ms but TTFT p95 4,000 ms is "
                       "over its 1,500 ms target") == "local: TTFT over target, guard off"
    assert reason_kind("local", est + "; stalls 3 streams ~90 ms but disaggregated would "
                       "miss the 1,500 ms TTFT target") == "local: disagg would miss TTFT target"
    assert reason_kind(None, None) == "no decision"


def test_compact_and_summary() -> None:
    recs = [compact({"prompt_tokens": 1000, "cached_tokens": 200, "status": "ok",
                     "decision": "disaggregated", "ttft_ms": 500.0, "queue_ms": 100.0,
                     "prefill_ms": 300.0, "decision_reason": "local ~1,200 ms, "
                     "disaggregated ~400 ms"}, 0.5),
            compact({"prompt_tokens": 100, "cached_tokens": None, "status": "ok",
                     "decision": "local", "ttft_ms": 50.0,
                     "decision_reason": "local ~20 ms, disaggregated ~60 ms"}, 0.5),
            compact({"prompt_tokens": 100, "status": "error", "decision": "local"}, 0.5)]
    assert recs[0]["ttft_ms"] == 1000.0 and recs[0]["est_local_ms"] == 2400.0
    r = HandoffRun(HIGH, 1, SLO)
    summarize(r, recs)
    assert (r.disaggregated, r.local) == (1, 1)
    assert r.reasons == {"disagg: faster": 1, "local: faster (or no clear gain)": 1}
    d = r.by_decision["disaggregated"]
    assert d["uncached"] == 800 and d["ttft_ms"] == 1000.0 and d["est_disagg_ms"] == 800.0
    assert math.isnan(r.by_decision["local"]["prefill_ms"]) is False


def test_fleet_config() -> None:
    o = HandoffOptions()
    c = handoff_fleet_config(o, threshold_policy(LOCAL))["routing"]
    assert c == {"prefill_policy": "cache_aware", "decode_policy": "cache_aware",
                 "disagg_policy": "threshold", "disagg_min_prompt_tokens": LOCAL}
    s = handoff_fleet_config(o, SLO)
    assert s["routing"]["disagg_policy"] == "slo"
    assert "disagg_min_prompt_tokens" not in s["routing"]
    assert s["targets"] == {"ttft_p95_ms": 1500.0, "gap_p99_ms": 75.0}


def test_synth_trace_loads(tmp_path: Path) -> None:
    t = load_trace(synth_trace(tmp_path / "s.jsonl", 50, 8.0))
    assert len(t.requests) == 50
    assert all(64 <= r.input_length <= 768 and 16 <= r.output_length <= 96
               for r in t.requests)
    ids = [i for r in t.requests for i in r.hash_ids]
    assert len(ids) == len(set(ids))  # nothing shared


def test_report_text() -> None:
    runs = [run(HIGH, threshold_policy(0), 9000), run(HIGH, SLO, 3000),
            run(SYNTH, threshold_policy(LOCAL), 100), run(SYNTH, SLO, 105),
            run(LOW, SLO, 1, error="FleetError: the replay ran past 600 s")]
    runs[1].reasons = {"disagg: faster": 7, "local: faster": 3}
    runs[1].by_decision = {"local": {"n": 3, "prompt_tokens": 900.0, "uncached": 800.0,
                                     "ttft_ms": 400.0, "queue_ms": 0.0, "prefill_ms": 350.0,
                                     "transfer_ms": 0.0, "est_local_ms": 300.0,
                                     "est_disagg_ms": math.nan}}
    runs[0].ttft_mean_by_class = {"<2k": 100.0}
    res = result(runs, 0)
    res.handoff_goals = handoff_goals(res)
    text = handoff_text(res)
    assert "best by mean TTFT: always-disagg (0 tokens)" in text
    assert "FAILED: FleetError: the replay ran past 600 s" in text
    assert "disagg: faster 7, local: faster 3" in text
    assert "always-disagg 3.00x" in text
    assert "mooncake high always-disagg   round 1: <2k 100" in text
    assert "estimated local 300, disaggregated n/a" in text
