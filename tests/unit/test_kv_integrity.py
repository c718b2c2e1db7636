"""LeaseWatch: the prefill engines' lease counters become events and alerts, and the
engine's "Potentially invalid KV blocks" log line marks the request that read them."""

from __future__ import annotations

from pathlib import Path

from controller.launchers.base import Launched
from controller.metrics import Metrics
from controller.models import Instance, InstanceState, RequestPath, RequestRecord, Role
from controller.obs.kv_integrity import LeaseWatch
from controller.requests_log import RequestLog
from controller.store import Store

INVALID = ("(Worker pid=1) ERROR 12-01 04:28:40 [pull_worker.py:667] Potentially invalid KV "
           "blocks for unrecognized request {} were retrieved by a decode worker. They may "
           "have expired.\n")


def record(rid: str, handle: str | None) -> RequestRecord:
    return RequestRecord(rid, 0.0, "/v1/completions", RequestPath.DISAGGREGATED, "ok", False,
                         10, 2, "prefill-1", "decode-2", kv_handle=handle)


def setup(tmp_path: Path) -> tuple[LeaseWatch, Instance, RequestLog, Store, Path]:
    log = tmp_path / "prefill-1.log"
    log.write_text("engine starting\n")
    inst = Instance("prefill-1", Role.PREFILL, 1, "http://p", state=InstanceState.READY,
                    handle=Launched("http://p", {"log": log}))
    requests = RequestLog(100)
    store = Store(tmp_path / "s.db")
    clock = iter(float(t) for t in range(1000, 2000))
    watch = LeaseWatch(requests, Metrics(), store, clock=lambda: next(clock))
    return watch, inst, requests, store, log


def test_counter_growth_becomes_events_and_an_alert(tmp_path: Path) -> None:
    watch, inst, _, store, _ = setup(tmp_path)
    watch.check([inst])
    assert watch.summary(60)["alert"] is False and store.events() == []
    inst.kv_expired, inst.kv_after_expiry = 2.0, 1.0
    watch.check([inst])
    kinds = {e["kind"]: e for e in store.events()}
    assert set(kinds) == {"kv.expired", "kv.after_expiry"}
    assert kinds["kv.after_expiry"]["target"] == "prefill-1"
    s = watch.summary(60)
    assert s["alert"] and s["notifications_after_expiry"] == 1 and s["expired_requests"] == 2
    watch.check([inst])  # no growth, no new event
    assert len(store.events()) == 2
    assert watch.summary(0.5)["alert"] is False  # the growth is older than the window


def test_the_log_line_marks_the_request_that_read_the_handle(tmp_path: Path) -> None:
    watch, inst, requests, _, log = setup(tmp_path)
    requests.add(record("r1", "cmpl-aaa-0"))
    requests.add(record("r2", "cmpl-bbb-0"))
    with log.open("a") as f:
        f.write(INVALID.format("cmpl-bbb-0"))
        f.write("partial line with no newl")
    watch.check([inst])
    assert [r.suspect for r in requests.recent(2)] == [True, False]
    assert watch.summary(60)["suspect_requests"] == 1
    # A request still being served when the line appears is marked when it is recorded.
    with log.open("a") as f:
        f.write("ine\n" + INVALID.format("cmpl-ccc-0"))
    watch.check([inst])
    requests.add(record("r3", "cmpl-ccc-0"))
    assert requests.recent(1)[0].suspect
    watch.check([inst])  # lines are read once
    assert watch.summary(60)["suspect_requests"] == 2
