"""Live routing settings take effect for the next request, on the wire: a real controller
process with simulated engine processes."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from tests.integration.harness import SHORT_PROMPT, ControllerProc, start_controller


@pytest.fixture(scope="module")
def ctl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControllerProc]:
    # Real-time simulation: a 400-token answer takes seconds on the decode engine.
    c = start_controller(tmp_path_factory.mktemp("live"), {
        "sim": {"time_scale": 1.0, "startup_delay_s": 0.3},
        "pools": {"prefill": {"size": 0, "tp": 4}, "decode": {"size": 1, "tp": 4}}})
    yield c
    c.stop()


def complete(ctl: ControllerProc, max_tokens: int) -> tuple[httpx.Response, float]:
    model = httpx.get(f"{ctl.url}/v1/models").json()["data"][0]["id"]
    t0 = time.monotonic()
    r = httpx.post(f"{ctl.url}/v1/completions", timeout=60, json={
        "model": model, "prompt": SHORT_PROMPT, "max_tokens": max_tokens,
        "ignore_eos": True})
    return r, time.monotonic() - t0


def test_patched_request_timeout_applies_to_the_next_request(ctl: ControllerProc) -> None:
    slow, took = complete(ctl, 400)
    assert slow.status_code == 200, slow.text
    assert took > 1.5, f"the engine answered in {took:.2f} s: too fast to test a timeout"

    r = ctl.api("PATCH", "/routing", {"request_timeout_s": 0.3})
    assert r.status_code == 200 and r.json()["request_timeout_s"] == 0.3
    failed, took_short = complete(ctl, 400)
    assert failed.status_code == 502, failed.text
    assert "within 0.3 s" in failed.json()["error"]["message"]
    assert took_short < took / 2  # gave up at the new timeout, not the start-up one

    assert ctl.api("PATCH", "/routing", {"request_timeout_s": 60}).status_code == 200
    again, _ = complete(ctl, 400)
    assert again.status_code == 200, again.text
    events = ctl.get("/events?kind=routing.update")
    assert [e["after"]["request_timeout_s"] for e in events[:2]] == [60.0, 0.3]
