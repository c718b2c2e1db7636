"""The Advisor page's what-if calculator and the Events page's audit log, each of the
sidebar's window or range."""

from __future__ import annotations

import time
from typing import Any

import httpx

from tests.dashboard.fake import FakeController, make_records
from tests.dashboard.page_helpers import Console, by_label, choose_range, no_exceptions, texts


def test_advisor_what_if(console: Console, fake: FakeController) -> None:
    at = console(fake, "advisor")
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["KV cache"] == "1.34 GB"  # Llama-3-70B, 4096 tokens
    assert metrics["Wire time"] == "26.8 ms"  # over IB NDR at 50 GB/s
    by_label(at.selectbox, "KV link").set_value("tcp-100gbe").run()
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Wire time"] == "134.2 ms"
    assert "Verdict:" in texts(at.info) + texts(at.success) + texts(at.warning)


def test_events_page_lists_the_audit_log(console: Console, fake: FakeController) -> None:
    at = console(fake, "events")
    table = at.dataframe[0].value
    assert list(table["kind"]) == ["pool.update", "controller.start"]
    assert table["before"].iloc[1] == ""


# ---- the window or range of the sidebar ------------------------------------------------------

def test_the_advice_follows_the_window(console: Console, fake: FakeController) -> None:
    """300 requests 7 minutes ago and 300 now: the 5-min window's advice counts the 300 of
    now (it asked for the last 10 minutes whatever the window), a range in the past counts
    that range's."""
    then = time.time() - 420
    fake.records = make_records(300, now=then) + make_records(300)
    at = console(fake, "advisor")
    no_exceptions(at)
    assert by_label(at.metric, "Requests observed").value == "300"
    assert "From the 300 requests that started in the last 300 s" in texts(at.caption)
    by_label(at.selectbox, "Window").set_value("1 h").run()
    assert by_label(at.metric, "Requests observed").value == "600"
    choose_range(at, then)
    no_exceptions(at)
    assert by_label(at.metric, "Requests observed").value == "300"
    assert "From the 300 requests that started between " in texts(at.caption)


def audit_event(eid: int, ago: float, kind: str = "pool.update") -> dict[str, Any]:
    return {"id": eid, "ts": time.time() - ago, "actor": "pdctl-cli", "kind": kind,
            "target": "decode", "before": {"size": 1}, "after": {"size": 2}, "detail": None}


class AuditController(FakeController):
    """``/events`` with its ``limit`` and ``kind``, as the controller's."""

    def route(self, request: httpx.Request, body: Any) -> Any:
        out = super().route(request, body)
        if request.url.path == "/api/v1/events":
            kind = request.url.params.get("kind")
            out = [e for e in out if kind is None or e["kind"] == kind]
            return out[:int(request.url.params.get("limit", 100))]
        return out


def test_events_lists_the_window_only(console: Console) -> None:
    fake = AuditController(audit=[audit_event(3, 10), audit_event(2, 100, "instance.failed"),
                                  audit_event(1, 400)])  # newest first; #1 before the window
    at = console(fake, "events")
    no_exceptions(at)
    assert list(at.dataframe[0].value["id"]) == [3, 2]
    assert "2 events in the last 300 s" in texts(at.caption)
    by_label(at.selectbox, "kind").set_value("instance.failed").run()
    assert list(at.dataframe[0].value["id"]) == [2]
    assert "1 instance.failed event in the last 300 s" in texts(at.caption)
    by_label(at.selectbox, "Window").set_value("1 h").run()
    by_label(at.selectbox, "kind").set_value(None).run()
    assert list(at.dataframe[0].value["id"]) == [3, 2, 1]


def test_events_say_when_the_limit_cut_the_window(console: Console) -> None:
    fake = AuditController(audit=[audit_event(k, 200 - k) for k in range(150, 0, -1)])
    at = console(fake, "events")
    no_exceptions(at)
    assert list(at.dataframe[0].value["id"]) == list(range(150, 50, -1))
    assert "The newest 100 of the events in the last 300 s" in texts(at.caption)
    by_label(at.selectbox, "show").set_value(500).run()
    assert len(at.dataframe[0].value) == 150
    assert "150 events in the last 300 s" in texts(at.caption)
