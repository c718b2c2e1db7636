"""Cache-aware routing on a simulated fleet, end to end through real processes: simulated
engines that publish vLLM's KV events, the controller's subscribers and index, and
``pdctl replay`` of a slice of the Mooncake conversation trace (multi-turn: later turns
share their conversation's earlier blocks). Every request ok; the router's predictions are
what the engines report; the index is healthy on every instance."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.harness import ControllerProc, start_controller
from tests.integration.test_cockpit_browser import browser, open_page, shoot
from tests.integration.test_console_browser import console_at
from tests.unit.test_replay_trace import MOONCAKE, needs_traces

pytestmark = [needs_traces, pytest.mark.timeout(600)]

FLEET = {
    "model": {"name": "llama-3.1-70b"},
    "hardware": {"accelerator": "h100-sxm", "nodes": 2},
    "pools": {"prefill": {"size": 2, "tp": 4}, "decode": {"size": 2, "tp": 4}},
    "routing": {"prefill_policy": "cache_aware", "decode_policy": "cache_aware"},
    "sim": {"time_scale": 0.05, "processes": 1},
}


@pytest.fixture(scope="module")
def ctl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControllerProc]:
    c = start_controller(tmp_path_factory.mktemp("cache"), FLEET)
    yield c
    c.stop()


def replay(ctl: ControllerProc, out: Path, limit: int) -> None:
    """``pdctl replay`` of the trace's first ``limit`` requests; every one ok."""
    run = subprocess.run(
        [sys.executable, "-m", "controller.cli", "replay", str(MOONCAKE), "--controller",
         ctl.url, "--json", str(out), "--limit", str(limit), "--time-scale", "0.05"],
        capture_output=True, text=True, timeout=300)
    print(run.stderr[-2000:], run.stdout)
    assert run.returncode == 0, run.stderr
    total = json.loads(out.read_text())["summary"]["all"]
    assert (total["requests"], total["ok"], total["failed"]) == (limit, limit, 0)


def test_a_trace_slice_is_routed_by_cache_with_predictions_the_engines_confirm(
        ctl: ControllerProc, tmp_path: Path) -> None:
    replay(ctl, tmp_path / "r.json", 80)
    records = ctl.get("/requests", limit=80)
    assert all(r["cached_tokens_predicted"] is not None and r["cached_tokens"] is not None
               for r in records)
    cache = ctl.get("/cache", window_s=600)
    assert cache["warnings"] == [], cache["warnings"]
    # Later turns hit their conversations' prefixes: at least 90 % of what one cache holding
    # every block would give (the slice is the trace's start, so mostly first turns).
    bound = upper_bound(80)
    assert bound > 0.03 and cache["hit_rate"] >= 0.9 * bound, (bound, cache)
    assert abs(cache["drift"]) < 0.05, cache
    assert all(i["kv_index"]["healthy"] for i in cache["instances"]), cache["instances"]


@pytest.mark.slow
def test_the_console_shows_the_replays_hit_rate_drift_and_index(
        ctl: ControllerProc, tmp_path: Path) -> None:
    """In a real browser, after a replay: the Pools page's prefix-cache cards give the hit
    rate and the drift the controller computed, and every instance's index is healthy."""
    from playwright.sync_api import expect

    replay(ctl, tmp_path / "r.json", 40)
    cache = ctl.get("/cache", window_s=300)
    with console_at(ctl, tmp_path) as url, browser(tmp_path) as page:
        open_page(page, url, "pools")
        section = page.get_by_text("Prefix cache hit rate", exact=True)
        expect(section).to_be_visible(timeout=30_000)
        hit = page.locator('[data-testid="stMetric"]').filter(has_text="Prefix cache hit rate")
        expect(hit).to_contain_text(f"{cache['hit_rate']:.1%}", timeout=30_000)
        drift = page.locator('[data-testid="stMetric"]').filter(has_text="Prediction drift")
        expect(drift).to_contain_text("%")
        expect(page.get_by_text("routed by load")).to_have_count(0)
        shoot(page, "prefix-cache")


def upper_bound(n: int) -> float:
    """The hit rate of one cache that never evicts, over the trace's first ``n`` requests:
    each prompt's leading 512-token blocks seen before (never its last token)."""
    seen: set[int] = set()
    hit = total = 0
    with MOONCAKE.open() as f:
        for line, _ in zip(f, range(n), strict=False):
            r = json.loads(line)
            held = 0
            for h in r["hash_ids"]:
                if h not in seen:
                    break
                held += 1
            hit += min(held * 512, r["input_length"] - 1)
            total += r["input_length"]
            seen.update(r["hash_ids"])
    return hit / total
