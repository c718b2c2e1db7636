"""The silent-fallback watch (``controller.obs.kv_fallback``) and the window's hand-off report
(``controller.obs.handoff_report``): the engine's ``local_compute`` counter against what the
router gave each decode instance to compute."""

from __future__ import annotations

from pathlib import Path

from controller.metrics import Metrics
from controller.models import Instance, InstanceState, RequestPath, RequestRecord, Role
from controller.obs.handoff_report import IDLE_MIN, handoff_report
from controller.obs.kv_fallback import FallbackWatch
from controller.requests_log import RequestLog
from controller.router.handoff import NO_PREFILL
from controller.store import Store


def _decode(counter: float | None, iid: str = "decode-0") -> Instance:
    return Instance(iid, Role.DECODE, 1, "http://d", state=InstanceState.READY,
                    local_compute=counter)


def _rec(rid: str, path: RequestPath, prompt: int = 1000, cached: int | None = 0,
         decision: str | None = None, reason: str | None = None) -> RequestRecord:
    disagg = path is RequestPath.DISAGGREGATED
    return RequestRecord(
        id=rid, started_at=0.0, endpoint="/v1/completions", path=path, status="ok",
        stream=False, prompt_tokens=prompt, output_tokens=4,
        prefill_instance="prefill-0" if disagg else None, decode_instance="decode-0",
        cached_tokens=cached, decision=decision, decision_reason=reason)


class World:
    def __init__(self, tmp: Path) -> None:
        self.log = RequestLog(1000)
        self.metrics = Metrics()
        self.store = Store(tmp / "state.db")
        self.watch = FallbackWatch(self.log, self.metrics, self.store, slack_tokens=16,
                                   clock=lambda: 100.0)

    def finish(self, rec: RequestRecord) -> None:
        self.log.add(rec)
        self.watch.ended(rec)

    def fallbacks(self) -> float:
        return self.metrics.registry.get_sample_value(
            "pdctl_kv_fallback_requests_total",
            {"prefill": "prefill-0", "decode": "decode-0"}) or 0.0


def test_kv_that_arrived_raises_nothing(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.watch.check([_decode(500.0)])  # first sight: the counter's base
    for k in range(5):
        w.watch.sent(f"d{k}", "decode-0", "prefill-0", 1000, 1000)
        w.watch.sent(f"c{k}", "decode-0", None, 1000, 1000)
    # the engine computed 1 token of each received prompt and 600 of each colocated one
    w.watch.check([_decode(500.0 + 5 * 1 + 5 * 600)])
    for k in range(5):
        w.finish(_rec(f"d{k}", RequestPath.DISAGGREGATED))
        w.finish(_rec(f"c{k}", RequestPath.COLOCATED, cached=400))
    w.watch.check([_decode(500.0 + 5 * 1 + 5 * 600)])
    assert w.fallbacks() == 0
    assert not any(r.kv_fallback for r in w.log.window(1e9, 1e9))
    assert w.watch.summary(60)["fallback_requests"] == 0


def test_prompts_computed_by_the_decode_engine_are_flagged(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.watch.check([_decode(0.0)])
    w.watch.sent("ok", "decode-0", "prefill-0", 1000, 1000)
    w.watch.sent("lost", "decode-0", "prefill-0", 2000, 2000)
    w.finish(_rec("ok", RequestPath.DISAGGREGATED))
    w.watch.check([_decode(1.0)])  # "ok" arrived
    w.watch.check([_decode(2001.0)])  # "lost" was computed locally, still streaming
    assert w.fallbacks() == 1
    w.finish(_rec("lost", RequestPath.DISAGGREGATED, prompt=2000))
    lost, ok = w.log.find("lost"), w.log.find("ok")
    assert lost is not None and lost.kv_fallback
    assert ok is not None and not ok.kv_fallback
    s = w.watch.summary(60)
    assert s["fallback_pairs"] == [{"prefill": "prefill-0", "decode": "decode-0",
                                    "requests": 1}]
    events = w.store.events(100, kind="kv.fallback")
    assert len(events) == 1 and "computed its 2,000 prompt tokens itself" in events[0]["detail"]
    w.watch.check([_decode(2001.0)])  # counted once
    assert w.fallbacks() == 1


def test_a_fallback_found_after_the_request_ended_marks_its_record(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.watch.check([_decode(0.0)])
    w.watch.sent("r", "decode-0", "prefill-0", 1000, 1000)
    w.finish(_rec("r", RequestPath.DISAGGREGATED))
    w.watch.check([_decode(1000.0)])
    rec = w.log.find("r")
    assert rec is not None and rec.kv_fallback and w.fallbacks() == 1


def test_colocated_work_in_flight_is_never_a_fallback(tmp_path: Path) -> None:
    """A colocated prompt counts before its request ends: its whole prompt is allowed."""
    w = World(tmp_path)
    w.watch.check([_decode(0.0)])
    w.watch.sent("c", "decode-0", None, 5000, 5000)
    w.watch.sent("d", "decode-0", "prefill-0", 1000, 1000)
    w.watch.check([_decode(5001.0)])
    assert w.fallbacks() == 0


def test_an_engine_restart_resets_the_base_and_silent_engines_are_not_watched(
        tmp_path: Path) -> None:
    w = World(tmp_path)
    w.watch.check([_decode(10_000.0)])
    w.watch.check([_decode(3.0)])  # restarted: counter went back
    w.watch.sent("d", "decode-0", "prefill-0", 1000, 1000)
    w.watch.check([_decode(4.0)])
    w.watch.check([_decode(None, "decode-1")])
    assert w.fallbacks() == 0


def test_report_raises_an_idle_prefill_pool() -> None:
    recs = [_rec(f"r{k}", RequestPath.COLOCATED, decision="local", reason=NO_PREFILL)
            for k in range(IDLE_MIN)]
    r = handoff_report(recs, "threshold", prefill_wanted=1, fallback={}, window_s=300)
    assert r["prefill_idle"] and r["no_prefill"] == IDLE_MIN
    assert "prefill pool served none of the 5 requests" in r["alerts"][0]
    # a colocated fleet (no prefill pool wanted), or one that served some: no alarm
    assert not handoff_report(recs, "threshold", 0, {}, 300)["prefill_idle"]
    served = [*recs, _rec("d", RequestPath.DISAGGREGATED, decision="disaggregated")]
    r = handoff_report(served, "threshold", 1, {}, 300)
    assert not r["prefill_idle"] and r["served_disaggregated"] == 1
    assert r["decided_disaggregated"] == 1 and r["decided_local"] == IDLE_MIN


def test_report_lists_fallback_pairs() -> None:
    fb = {"fallback_requests": 3, "fallback_pairs": [
        {"prefill": "prefill-0", "decode": "decode-1", "requests": 3}]}
    r = handoff_report([], "slo", 1, fb, 300)
    assert r["fallback_requests"] == 3
    assert "3 requests routed prefill-0 -> decode-1 were computed on decode-1" in r["alerts"][0]
