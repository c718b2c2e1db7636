"""The SLA planner in apply mode on a real controller with simulated engines (Llama-3-70B on
H100, prefill TP4, decode TP2, the shipped profiles), under an open-loop load that steps
low -> high -> low: both pools grow and shrink again, every request completes, and no pool
changes direction more than once (no oscillation)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from bench import loadgen
from tests.integration.harness import ControllerProc, start_controller

pytestmark = pytest.mark.slow

PROMPT = [7] * 2997  # token ids: 3,000 prompt tokens exactly (below), disaggregated
OUTPUT = 60
STEPS = ((1.0, 20.0), (8.0, 45.0), (1.0, 55.0))  # (requests/s, seconds)


@pytest.fixture
def ctl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControllerProc]:
    c = start_controller(tmp_path_factory.mktemp("planner"), {
        "sim": {"time_scale": 1.0, "startup_delay_s": 0.3},
        "planner": {"mode": "apply", "interval_s": 4.0, "ttft_ms": 1500.0, "itl_ms": 60.0,
                    "min_requests": 3},
        "routing": {"prefill_policy": "least_loaded"},  # docs/planner.md: routing
        "controller": {"drain_timeout_s": 60}})
    yield c
    c.stop()


def stepped_load(url: str, out: list[loadgen.OpenLoop]) -> None:
    """The steps back to back: each phase starts when the one before stops sending (its
    stragglers finish meanwhile)."""
    def request(k: int, i: int) -> tuple[str, bytes, int]:
        # A prompt of its own (its first block differs): the engines' prefix caches must
        # not turn the load the planner sizes for into cache hits.
        prompt = [10 + k, 10 + i // 500, 10 + i % 500, *PROMPT]
        return (f"{url}/v1/completions", orjson.dumps(
            {"model": "llama-3-70b", "prompt": prompt, "max_tokens": OUTPUT, "stream": True}),
            OUTPUT)

    starts = []
    offset = 0.0
    for k, (rate, seconds) in enumerate(STEPS):
        out.append(loadgen.OpenLoop(lambda i, s, k=k: request(k, i),
                                    rate=rate, duration=seconds, poisson=False,
                                    stream_share=1.0, timeout_s=120.0, seed=k))
        starts.append(offset)
        offset += seconds

    async def after(delay: float, phase: loadgen.OpenLoop) -> None:
        await asyncio.sleep(delay)
        await phase.run()

    async def main() -> None:
        await asyncio.gather(*(after(d, p) for d, p in zip(starts, out, strict=True)))

    loadgen.run(main())


def sizes_over_time(events: list[dict[str, Any]], role: str) -> list[int]:
    ups = [e for e in events if e["kind"] == "pool.update" and e["target"] == role]
    ups.sort(key=lambda e: e["id"])
    return [ups[0]["before"]["size"], *(e["after"]["size"] for e in ups)] if ups else []


def direction_changes(sizes: list[int]) -> int:
    signs = [b > a for a, b in zip(sizes, sizes[1:], strict=False) if b != a]
    return sum(1 for a, b in zip(signs, signs[1:], strict=False) if a != b)


def test_apply_mode_grows_and_shrinks_both_pools_under_a_stepped_load(
        ctl: ControllerProc) -> None:
    phases: list[loadgen.OpenLoop] = []
    t = threading.Thread(target=stepped_load, args=(ctl.url, phases), daemon=True)
    t.start()
    t.join(timeout=sum(s for _, s in STEPS) + 180)
    assert not t.is_alive(), "the load did not finish"
    arrivals = [a for p in phases for a in p.arrivals]
    failed = [a.error for a in arrivals if a.error is not None]
    assert len(arrivals) >= 0.9 * sum(r * s for r, s in STEPS)
    assert failed == [], (len(failed), sorted(set(failed))[:5],
                          {k: v for p in phases for k, v in p.error_samples.items()})
    assert all(p.unfinished == 0 for p in phases)

    events = ctl.get("/events", limit=500)
    mine = [e for e in events if e["kind"] == "pool.update"]
    assert mine and {e["actor"] for e in mine} == {"planner"}, mine
    assert all(e["detail"] for e in mine)  # every change carries its reasons
    for role in ("prefill", "decode"):
        sizes = sizes_over_time(events, role)
        assert sizes and max(sizes) > 1, (role, sizes)  # grew under the high step
        assert sizes[-1] == 1, (role, sizes)  # and came back after it
        assert direction_changes(sizes) == 1, (role, sizes)  # up, then down: once
    plan = ctl.get("/planner", history=200)
    assert plan["mode"] == "apply"
    applied = [p for p in plan["history"] if p["applied"]]
    assert len(applied) >= 2
    # Streamed answers carry their inter-token gaps, and the router exports them.
    recent = ctl.get("/requests", limit=20)
    assert all(r["gap_max_ms"] >= r["gap_p99_ms"] > 0 for r in recent if r["status"] == "ok")
    assert "pdctl_itl_gap_seconds_bucket" in ctl.metrics_text()
