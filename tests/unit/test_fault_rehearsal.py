"""``pdctl fault``'s judgement (``controller.faults.outcome``) and its client's reading of
answers (``controller.cli.fault``): each check fails on what it guards against."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from controller.faults import inject
from controller.faults.load import completion_outcome, fault_prompts, http_error, stream_outcome
from controller.faults.outcome import (
    HUNG,
    REFUSED,
    ClientOutcome,
    Report,
    full_disk_told,
    nothing_held,
    recorded,
    render_report,
    same_answers,
    served,
    told,
)


def ok(k: int, text: str = "abc") -> ClientOutcome:
    return ClientOutcome(f"r{k}", k, 0.1, text=text)


def failed(k: int, error: str, answered: bool = True) -> ClientOutcome:
    return ClientOutcome(f"r{k}", k, 0.1, error=error, answered=answered)


def test_clear_errors_pass_and_a_hang_or_reset_fails() -> None:
    fine = [ok(0), failed(1, "http 502: prefill-1 unreachable"),
            failed(2, "stream error event: {'message': 'x'}")]
    check = served(fine)
    assert check.ok and "1 of 3 completed" in check.detail and "1 http 502" in check.detail
    for lost in (failed(3, HUNG, answered=False),
                 failed(3, "connection: ReadError: reset", answered=False),
                 failed(3, "unclear answer 500: b'Internal Server Error'"),
                 failed(3, "stream ended without [DONE]")):
        check = served([*fine, lost])
        assert not check.ok and "LOST" in check.detail, lost
    assert not served([failed(0, "http 503: no ready decode instance")]).ok  # nothing served


def test_a_refused_connection_is_clear_only_while_the_controller_restarts() -> None:
    refused = failed(1, f"{REFUSED}: [Errno 111] Connection refused", answered=False)
    assert not served([ok(0), refused]).ok  # a fleet that stops listening loses requests
    check = served([ok(0), refused], refusals_ok=True)
    assert check.ok and f"1 {REFUSED}" in check.detail
    assert not served([ok(0), refused, failed(2, HUNG, answered=False)], refusals_ok=True).ok


def test_an_answer_that_differs_from_its_reference_fails() -> None:
    reference = {0: "abc", 1: "xyz"}
    assert same_answers([ok(0), ok(1, "xyz"), failed(2, "http 502: x")], reference).ok
    check = same_answers([ok(0), ok(1, "abc")], reference)
    assert not check.ok and "r1" in check.detail
    blind = same_answers([ok(0), ok(1)], {0: "abc", 1: "abc"})
    assert not blind.ok and "cannot tell answers apart" in blind.detail


def test_a_request_missing_from_the_records_fails() -> None:
    outcomes = [ok(0), ok(1), failed(2, HUNG, answered=False)]
    check = recorded(outcomes, [], {"disaggregated": 1, "colocated": 1})
    assert check.ok and check.detail.startswith("2 of 2 found (1 colocated, 1 disaggregated")
    assert not recorded(outcomes, ["r1"], {"colocated": 1}).ok


def test_anything_held_fails_and_the_fault_must_be_told() -> None:
    assert nothing_held({}).ok
    assert not nothing_held({"prefill-1": "2 KV handles out"}).ok
    assert told(["instance.ready", "instance.failed"], ("instance.failed",), "p-1").ok
    check = told(["instance.ready"], ("instance.failed",), "p-1")
    assert not check.ok and "seen: instance.ready" in check.detail


def test_the_report_fails_when_any_check_does() -> None:
    report = Report("kill-prefill", "prefill-1", "SIGKILL", 0.0)
    report.checks.append(served([ok(0)]))
    assert report.ok and render_report(report).endswith("result: passed")
    report.checks.append(nothing_held({"prefill-1": "KV cache use 3.0%"}))
    assert not report.ok and "FAIL  nothing held" in render_report(report)


def done(text: str | None = None, error: str | None = None, answered: bool = True
         ) -> ClientOutcome:
    return ClientOutcome("r", 0, 0.0, text, error, answered)


def test_answers_are_read_as_clients_read_them() -> None:
    assert completion_outcome(b'{"choices": [{"text": "hi"}]}', done).text == "hi"
    assert completion_outcome(b'{"error": {"message": "x"}}', done).error.startswith("unclear 200")
    assert http_error(503, b'{"error": {"message": "no ready decode"}}') == \
        "http 503: no ready decode"
    assert http_error(500, b"Internal Server Error").startswith("unclear answer 500")

    def events(lines: list[str]) -> ClientOutcome:
        return stream_outcome(iter(lines), done)
    assert events(['data: {"choices": [{"text": "a"}]}', "",
                   'data: {"choices": [{"text": "b"}]}', "data: [DONE]"]).text == "ab"
    assert events(['data: {"choices": [{"text": "a"}]}', 'data: {"error": {"m": 1}}']
                  ).error.startswith("stream error event")
    assert events(['data: {"choices": [{"text": "a"}]}']).error == \
        "stream ended without [DONE]"


def test_prompts_are_distinct_and_over_the_threshold() -> None:
    asked = fault_prompts(6, 128, "t")
    assert len(set(asked)) == 6
    assert all(len(p.split()) > 128 for p in asked)
    assert len({p.split(":")[0] for p in asked}) == 6  # no shared cached prefix


def test_a_victim_is_ready_local_and_the_lowest_id() -> None:
    me = os.getpid()
    insts = [{"id": "prefill-2", "role": "prefill", "state": "ready", "pid": me},
             {"id": "prefill-1", "role": "prefill", "state": "starting", "pid": me},
             {"id": "prefill-3", "role": "prefill", "state": "ready", "pid": me},
             {"id": "decode-1", "role": "decode", "state": "ready", "pid": None}]
    assert inject.victim(insts, "prefill")["id"] == "prefill-2"
    with pytest.raises(inject.FaultRefused, match="no local process id"):
        inject.victim(insts, "decode")
    with pytest.raises(inject.FaultRefused, match="no ready"):
        inject.victim([], "decode")
    with pytest.raises(inject.FaultRefused, match="not on this host"):
        inject.victim([{"id": "d", "role": "decode", "state": "ready", "pid": 2**22 + 7}],
                      "decode")


def state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().split()[2]


def test_a_stall_continues_the_engine_however_its_wait_ends() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            start_new_session=True)
    try:
        def interrupted(_: float) -> None:
            deadline = time.monotonic() + 10  # a signal is delivered, not applied at once
            while state(proc.pid) != "T" and time.monotonic() < deadline:
                time.sleep(0.01)
            assert state(proc.pid) == "T"  # stopped
            raise KeyboardInterrupt
        with pytest.raises(KeyboardInterrupt):
            inject.stall({"pid": proc.pid}, 5, sleep=interrupted)
        deadline = time.monotonic() + 10
        while state(proc.pid) == "T" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert state(proc.pid) in ("S", "R")  # continued
        inject.kill({"pid": proc.pid})
        assert proc.wait(timeout=10) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_full_disk_must_refuse_a_change_say_why_and_take_it_after() -> None:
    assert full_disk_told("503: state cannot be written", "disk full", None).ok
    assert not full_disk_told(None, "disk full", None).ok  # taken while full
    assert not full_disk_told("503: x", None, None).ok  # /cluster did not say
    assert not full_disk_told("503: x", "disk full", "503: still full").ok  # not after
    assert not full_disk_told("500: x", "disk full", None).ok


def test_a_disk_over_the_limit_is_never_filled(tmp_path: Path) -> None:
    with pytest.raises(inject.FaultRefused, match="over the 1 MiB"):
        inject.fill_filesystem(tmp_path, 2**20)
    assert not (tmp_path / inject.BALLAST).exists()
