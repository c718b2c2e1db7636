"""``pdctl replay`` end to end: a slice of the Mooncake trace (read from ``../shared/traces``)
against a controller with simulated engines; every request ok, and what the command reports is
what the controller recorded."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.harness import ControllerProc, start_controller
from tests.unit.test_replay_trace import MOONCAKE, needs_traces

pytestmark = needs_traces


@pytest.fixture(scope="module")
def ctl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControllerProc]:
    c = start_controller(tmp_path_factory.mktemp("replay"), {"sim": {"time_scale": 0.05}})
    yield c
    c.stop()


def _replay(ctl: ControllerProc, out: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "controller.cli", "replay", str(MOONCAKE), "--controller",
         ctl.url, "--json", str(out), *flags], capture_output=True, text=True, timeout=120)


def test_a_mooncake_slice_replays_with_no_failure(ctl: ControllerProc, tmp_path: Path) -> None:
    before = {r["id"] for r in ctl.get("/requests", limit=1000)}
    run = _replay(ctl, tmp_path / "r.json", "--limit", "40", "--time-scale", "0.1")
    print(run.stderr, run.stdout)
    assert run.returncode == 0, run.stderr
    result = json.loads((tmp_path / "r.json").read_text())
    rows, total = result["requests"], result["summary"]["all"]
    assert (total["requests"], total["ok"], total["failed"]) == (40, 40, 0)
    assert len(rows) == 40 and result["not_sent"] == 0
    assert "replay:" in run.stderr and "sent 40/40" in run.stderr  # progress
    assert "all         40    40      0" in run.stdout
    # Prompts longer than the model's 8,192 tokens were cut to fit_context, and said so.
    clamped = [r for r in rows if r["clamped"]]
    assert clamped and all(r["prompt_tokens"] + r["max_tokens"] <= 8192 for r in rows)
    assert f"warning: {len(clamped)} of 40 requests cut to fit" in run.stderr
    assert all(r["prompt_tokens"] == r["input_length"] for r in rows if not r["clamped"])
    # The controller recorded exactly these requests, with the prompt lengths sent.
    records = {r["id"]: r for r in ctl.get("/requests", limit=1000) if r["id"] not in before}
    assert len(records) == 40
    for row in rows:
        rec = records[row["request_id"]]
        assert rec["status"] == "ok"
        assert (rec["prompt_tokens"], rec["output_tokens"]) == (row["prompt_tokens"],
                                                                row["max_tokens"])
        assert row["output_chunks"] == row["completion_tokens"] == row["max_tokens"]


def test_without_clamping_long_prompts_fail_with_the_controllers_reason(
        ctl: ControllerProc, tmp_path: Path) -> None:
    run = _replay(ctl, tmp_path / "r.json", "--limit", "10", "--time-scale", "0.05",
                  "--no-clamp")
    assert run.returncode == 1
    result = json.loads((tmp_path / "r.json").read_text())
    total = result["summary"]["all"]
    assert (total["requests"], total["ok"], total["failed"]) == (10, 6, 4)
    reason = next(iter(total["failed_by_reason"]))
    assert reason.startswith("http 400: This model's maximum context length is N tokens")
    assert "4 requests exceed the model's 8192 tokens" in run.stderr
    assert "failed: 4 x http 400" in run.stdout
