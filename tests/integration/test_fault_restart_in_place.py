"""Fault scenario: a prefill engine restarted on the same address under load (issue 31).

The controller attaches external engines by URL, as on a cluster where a pod restarts in
place: the new engine answers at the old address with a new NIXL identity, and the KV handles
the old one gave out name blocks of a process that is gone. From the client's side: every
request completes or gets a clear error, none hangs; the controller says what happened (an
``instance.restarted`` event, a warning on the Overview) and voids the old engine's handles
(none stays counted as out, a decode hop holding one is served colocated); the restarted
engine serves disaggregated requests again; nothing is left held on either engine.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx
import pytest

from tests.integration.harness import (
    LONG_PROMPT,
    Load,
    engine_metric,
    free_port,
    sim_engine,
    start_controller,
    wait_healthy,
)

pytestmark = pytest.mark.slow


def test_prefill_restarted_on_its_address_voids_its_handles_and_is_told(tmp_path: Path
                                                                        ) -> None:
    pp, dp = free_port(), free_port()
    p_url, d_url = f"http://127.0.0.1:{pp}", f"http://127.0.0.1:{dp}"
    engines = {"prefill": sim_engine(pp, "prefill"), "decode": sim_engine(dp, "decode")}
    ctl = None
    try:
        wait_healthy(p_url)
        wait_healthy(d_url)
        # Health checks every 2 s, failed after 3: a restart of about a second is not seen
        # as a failure, only by what the engine's /metrics says.
        ctl = start_controller(tmp_path, {"backend": "external", "kv": {"lease_s": 10},
                                          "controller": {"health_interval_s": 2.0},
                                          "pools": {"prefill": {"urls": [p_url], "tp": 2},
                                                    "decode": {"urls": [d_url], "tp": 2}}})
        [prefill] = ctl.get("/instances?role=prefill")
        with Load(ctl.url, workers=6, long_only=True, timeout_s=60) as load:
            ctl.wait(lambda: load.result.ok >= 20, 60, "traffic before the restart")
            os.killpg(engines["prefill"].pid, signal.SIGKILL)
            engines["prefill"].wait(timeout=10)
            engines["prefill"] = sim_engine(pp, "prefill")  # same address, new engine
            wait_healthy(p_url)
            ctl.wait(lambda: bool(ctl.get("/events?kind=instance.restarted&limit=5")), 30,
                     "the controller to see the restart")
            served = load.result.ok
            ctl.wait(lambda: load.result.ok >= served + 20, 60, "traffic after the restart")
            res = load.stop()
        # The client's side: nothing lost or hung; a failure is an error it was told.
        unclear = [f for f in res.failures if not f[:3].isdigit()]
        assert unclear == [], unclear[:5]
        assert len(res.failures) <= 12, res.failures  # only hops caught by the kill itself
        [event] = ctl.get("/events?kind=instance.restarted&limit=5")
        assert event["target"] == prefill["id"] and "process start time" in event["detail"], event
        assert "void" in event["detail"]
        # The same instance, not failed and replaced: its address never stopped serving.
        [after] = ctl.get("/instances?role=prefill")
        assert after["id"] == prefill["id"] and after["state"] == "ready", after
        assert after["load"]["kv_handles_out"] == 0
        assert not ctl.get("/events?kind=instance.failed&limit=5")
        # The new engine serves disaggregated requests.
        r = httpx.post(f"{ctl.url}/v1/completions", timeout=30, json={
            "model": "llama-3-70b", "prompt": f"after {LONG_PROMPT}", "max_tokens": 4})
        assert r.status_code == 200, r.text
        assert ctl.get("/requests?limit=1")[0]["path"] == "disaggregated"
        assert engine_metric(p_url, "vllm:prompt_tokens_total") > 0
        # Nothing held on either engine, no read of blocks an engine had freed.
        ctl.wait(lambda: engine_metric(p_url, "vllm:kv_cache_usage_perc") == 0
                 and engine_metric(d_url, "vllm:kv_cache_usage_perc") == 0, 20,
                 "KV use back to idle on both engines")
        assert engine_metric(p_url, "vllm:nixl_num_notifications_after_expiry_total") == 0
    finally:
        if ctl is not None:
            ctl.stop()
        for proc in engines.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=30)
