"""``bench.scenarios.soak``'s pure parts: the fault rotation, how client outcomes are judged
(a clear error is allowed, a hang or a broken stream is a lost request), and what makes the
soak fail."""

from __future__ import annotations

from bench.loadgen import DROPPED, TIMEOUT, Arrival
from bench.scenarios.soak.model import (
    FAULTS,
    FaultDone,
    SoakOptions,
    SoakResult,
    SoakSample,
    fault_at,
    judge,
    problems,
)


def arrival(error: str | None) -> Arrival:
    return Arrival(due=0.0, stream=False, error=error)


def test_the_faults_rotate() -> None:
    assert [fault_at(k) for k in range(5)] == [*FAULTS, FAULTS[0]]


def test_clear_errors_are_allowed_and_hangs_or_broken_streams_are_lost() -> None:
    res = SoakResult(SoakOptions.defaults(True))
    arrivals = [arrival(None), arrival(None), arrival("http 503"),
                arrival("stream error event"), arrival(TIMEOUT), arrival("connection"),
                arrival("stream without [DONE]"), arrival(DROPPED)]
    judge(arrivals, 1, res, {"connection": ["reset by peer"]})
    assert (res.requests, res.ok) == (8, 2)
    assert res.clear_errors == {"http 503": 1, "stream error event": 1}
    assert res.lost == {"hung (client timeout)": 1, "connection": 1,
                        "stream without [DONE]": 1, "dropped by the client's cap": 1,
                        "never finished": 1}
    assert res.lost_samples == {"connection": ["reset by peer"]}
    assert any("5 requests lost" in p for p in problems(res, quick=True))


def test_a_clean_quick_run_passes_and_memory_is_judged_on_full_runs_only() -> None:
    res = SoakResult(SoakOptions.defaults(True), requests=10, ok=10,
                     faults=[FaultDone(20.0, "kill-decode", "decode-2", "SIGKILL pid 1")])
    res.samples = [SoakSample(t, 100.0 + t, 50 + int(t)) for t in range(0, 100, 5)]
    assert problems(res, quick=True) == []
    found = problems(res, quick=False)
    assert any("memory grew" in p for p in found)
    assert any("file descriptors grew" in p for p in found)
    assert any("only 1 faults" in p for p in found)
    res.kv_handles_left, res.processes_left = {"prefill-1": 2}, 1
    found = problems(res, quick=True)
    assert any("KV handles still held" in p for p in found)
    assert any("1 processes left" in p for p in found)


def test_flat_samples_are_flat() -> None:
    res = SoakResult(SoakOptions())
    res.samples = [SoakSample(float(t), 200.0 + (t % 3), 40) for t in range(100)]
    mem, fds = res.memory(), res.descriptors()
    assert 0.98 <= mem["ratio"] <= 1.02 and fds["first"] == fds["last"] == 40.0
