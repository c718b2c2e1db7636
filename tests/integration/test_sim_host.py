"""Simulated engines hosted by shared processes (``sim.processes``): each instance still has
its own port, API, metrics and log; the controller scales, drains and replaces them as it does
process-per-engine instances, with no failed request; nothing outlives the controller."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.harness import ControllerProc, Load, start_controller

pytestmark = pytest.mark.slow


def hosts() -> dict[int, str]:
    """pid -> command line of every sim host process on this machine."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "controller.engines.sim.host" in cmd:
            out[int(pid)] = cmd
    return out


def engine_processes() -> int:
    n = 0
    for pid in os.listdir("/proc"):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        n += b"controller.engines.sim" in cmd
    return n


@pytest.fixture
def ctl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControllerProc]:
    before = set(hosts())
    c = start_controller(tmp_path_factory.mktemp("simhost"), {
        "sim": {"processes": 2}, "pools": {"prefill": {"size": 1}, "decode": {"size": 2}}})
    yield c
    c.stop()
    assert set(hosts()) <= before, "a sim host process outlived its controller"


def ready(ctl: ControllerProc, role: str) -> list[dict[str, object]]:
    return [i for i in ctl.get(f"/instances?role={role}") if i["state"] == "ready"]


def test_hosted_engines_serve_scale_and_stop_with_no_failed_request(ctl: ControllerProc
                                                                   ) -> None:
    mine = hosts()
    assert len(mine) == 2, mine  # three instances on two shared processes
    assert engine_processes() == 0, "no instance runs as a process of its own"
    urls = {str(i["url"]) for r in ("prefill", "decode") for i in ready(ctl, r)}
    assert len(urls) == 3  # each on its own port
    with Load(ctl.url, workers=6, long_only=True) as load:
        time.sleep(1.5)
        ctl.api("PATCH", "/pools/decode", {"size": 4}).raise_for_status()
        ctl.wait_converged()
        time.sleep(1.5)
        ctl.api("PATCH", "/pools/decode", {"size": 1}).raise_for_status()
        ctl.wait_converged()
        time.sleep(1.0)
        res = load.stop()
    assert res.failures == [], res.failures[:5]
    assert res.ok >= 20, res
    paths = [r["path"] for r in ctl.get("/requests?limit=200")]
    assert paths.count("disaggregated") >= 20, paths
    assert len(hosts()) == 2 and len(ready(ctl, "decode")) == 1
    # Each engine's own metrics: the decode engine counts the KV it pulled from the prefill
    # engine of (maybe) the same process, the prefill counts the prompts it computed.
    [p] = ready(ctl, "prefill")
    text = httpx.get(f"{p['url']}/metrics", timeout=5).text
    assert 'source="local_compute"' in text and "vllm:prompt_tokens_total" in text
    xfers = sum(i["nixl"]["transfers"] for i in ctl.get("/instances?role=decode"))
    assert xfers >= 20, xfers
    log = ctl.get(f"/instances/{p['id']}/log")["log"]
    assert "serving on" in log and "in sim host pid" in log, log


def test_a_host_that_dies_fails_its_instances_and_they_are_replaced(ctl: ControllerProc
                                                                   ) -> None:
    [victim] = [pid for pid, _ in hosts().items()][:1]
    doomed = {str(i["id"]) for r in ("prefill", "decode") for i in ready(ctl, r)
              if i["pid"] is None}
    os.kill(victim, signal.SIGKILL)
    ctl.wait(lambda: any(e["kind"] == "instance.failed"
                         for e in ctl.get("/events?limit=50")), 30, "an instance.failed event")
    failed = [e for e in ctl.get("/events?limit=50") if e["kind"] == "instance.failed"]
    assert failed and all(e["target"] in doomed for e in failed), failed
    assert all(f"pid {victim}" in str(e["detail"]) and "SIGKILL" in str(e["detail"])
               for e in failed), failed
    ctl.wait_converged()
    assert len(ready(ctl, "prefill")) == 1 and len(ready(ctl, "decode")) == 2
    assert victim not in hosts() and len(hosts()) == 2  # a fresh host took its place
