"""The charts' marks and the Overview's incidents, from audit-log tables."""

from __future__ import annotations

import time
from typing import Any

from dashboard import timeline
from pdctl_api.schema import EventPublic
from tests.dashboard.test_health import stats

NOW = time.time()


def ev(k: int, dt: float, kind: str, target: str, detail: str | None = None,
       actor: str = "controller", after: Any = None) -> EventPublic:
    return EventPublic(id=k, ts=NOW - 100 + dt, actor=actor, kind=kind, target=target,
                       after=after, detail=detail)


KILLED = [  # newest first, as the audit log reads
    ev(6, 60, "instance.ready", "decode-3", "healthy after 1.2 s"),
    ev(5, 58, "instance.starting", "decode-3", "decode pool below size (1/2)"),
    ev(4, 57, "instance.failed", "decode-1", "process exited with status -9 (SIGKILL)"),
    ev(3, 40, "routing.update", "routing", actor="alice",
       after={"disagg_min_prompt_tokens": 5000}),
    ev(2, 30, "instance.draining", "prefill-0", "drained by operator", actor="bob"),
    ev(1, 5, "instance.starting", "prefill-2", "prefill pool below size (1/1)"),
]


def test_every_failure_drain_and_start_is_a_mark_beside_the_changes() -> None:
    marks = timeline.change_marks(KILLED, since=NOW - 120)
    assert list(marks["kind"]) == ["start", "drain", "change", "failed", "start"]
    assert list(marks["label"])[2:] == [
        "routing.update routing by alice: disagg_min_prompt_tokens 5000",
        "decode-1 failed: process exited with status -9 (SIGKILL)",
        "decode-3 starting (replaces decode-1)"]
    assert marks["time"].is_monotonic_increasing
    assert list(timeline.config_changes(marks)["kind"]) == ["change"]


def test_a_failure_stays_in_the_strip_after_its_replacement_is_ready() -> None:
    found = timeline.instance_incidents(KILLED, since=NOW - 120)
    assert [(i.subject, i.severity) for i in found] == [("decode-1", "error")]
    text = found[0].text
    assert "**decode-1 failed**" in text and "status -9 (SIGKILL)" in text
    assert "replaced by decode-3, ready at" in text
    waiting = timeline.instance_incidents(KILLED[1:], since=NOW - 120)
    assert "replacement decode-3 starting" in waiting[0].text  # not ready yet
    assert timeline.instance_incidents(KILLED, since=NOW - 20) == []  # before the window


def test_a_restart_in_place_is_a_warning_and_a_mark_not_a_failure() -> None:
    restarted = [ev(7, 70, "instance.restarted", "prefill-1",
                    "the engine at http://h:1 restarted behind the same address (its process "
                    "start time moved from 1 to 2 (unix s)); 3 KV handle(s) it gave out are "
                    "void and its prefix cache is empty", actor="fleet")]
    [found] = timeline.instance_incidents(restarted, since=NOW - 120)
    assert (found.subject, found.severity) == ("prefill-1", "warning")
    assert "**prefill-1 restarted in place**" in found.text and "3 KV handle(s)" in found.text
    marks = timeline.change_marks(restarted, since=NOW - 120)
    assert list(marks["label"])[0].startswith("prefill-1 restarted in place: the engine at")


def test_the_part_that_grew_most_is_named_and_noise_is_not() -> None:
    before = stats()
    grown = before.model_copy(update={"components_ms": before.components_ms.model_copy(
        update={"transfer": before.components_ms.transfer.model_copy(update={"mean": 9.0})})})
    g = timeline.grew_most(grown, before)
    assert g is not None and g.part == "transfer" and g.grew_ms == 8.0
    assert "**KV transfer grew most**: mean 9.0 ms against 1.0 ms" in \
        timeline.growth_incident(g, 300, NOW).text
    assert timeline.grew_most(before, before) is None  # nothing grew
    assert timeline.grew_most(grown, stats(requests=0)) is None  # nothing to compare with


def test_prometheus_alerts_read_with_their_value_and_since_when() -> None:
    (a,) = timeline.alert_incidents([{"labels": {"alertname": "PdctlTtftP95AboveTarget",
                                                 "severity": "page"},
                                      "activeAt": NOW - 30, "value": "2.5e+00"}])
    assert a.severity == "error" and a.subject == "PdctlTtftP95AboveTarget"
    assert "(value 2.5), severity page" in a.text and "firing since" in a.text
