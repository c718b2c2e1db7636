"""``python -m bench soak --quick`` as CI runs it: a real controller and simulated engines
under open-loop traffic while the planner applies and every fault of the rotation is injected
once (engines SIGKILLed, a prefill stalled past the KV lease, a TP change): no request is lost
(each succeeds or gets a clear error), nothing is held once the lease has passed, no process is
left. The 30-minute run's figures are in BENCHMARKS.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.scenarios.soak.model import FAULTS

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


def test_a_quick_soak_loses_no_request_and_leaves_nothing(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    run = subprocess.run([sys.executable, "-m", "bench", "soak", "--quick", "--json", str(out)],
                         cwd=REPO, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    res = json.loads(out.read_text())
    assert res["lost"] == {} and res["ok"] > 0.8 * res["requests"] > 0, res
    assert [f["kind"] for f in res["faults"]] == list(FAULTS), res["faults"]
    assert not any("skipped" in f["detail"] for f in res["faults"]), res["faults"]
    assert res["kv_handles_left"] == {} and res["processes_left"] == 0
    assert "0 requests lost" in run.stdout
