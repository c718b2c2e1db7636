"""Simulated engines hosted by shared processes (``sim.processes``): each instance still has
its own port, API, metrics and log; the controller scales, drains and replaces them as it does
process-per-engine instances, with no failed request; nothing outlives the controller."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import httpx
import psutil
import pytest

from tests.integration.harness import ControllerProc, Load, start_controller

pytestmark = pytest.mark.slow


def commands(ctl: ControllerProc) -> dict[int, str]:
    """pid -> command line of every live process the controller started (its descendants:
    other tests' or benchmarks' engines on this machine are not counted)."""
    out = {}
    for proc in psutil.Process(ctl.proc.pid).children(recursive=True):
        try:
            out[proc.pid] = " ".join(proc.cmdline())
        except psutil.Error:
            continue
    return out


def hosts(ctl: ControllerProc) -> dict[int, str]:
    """The controller's sim host processes."""
    return {pid: cmd for pid, cmd in commands(ctl).items()
            if "controller.engines.sim.host" in cmd}


def engine_processes(ctl: ControllerProc) -> int:
    """The controller's engine processes of their own (``python -m controller.engines.sim``)."""
    return sum(cmd.split(" -m ", 1)[-1].split(" ", 1)[0] == "controller.engines.sim"
               for cmd in commands(ctl).values())


@pytest.fixture
def ctl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControllerProc]:
    c = start_controller(tmp_path_factory.mktemp("simhost"), {
        "sim": {"processes": 2}, "pools": {"prefill": {"size": 1}, "decode": {"size": 2}}})
    started: set[int] = set()
    try:
        yield c
        started = set(hosts(c))
    finally:
        c.stop()
    assert not [p for p in started if psutil.pid_exists(p)
                and psutil.Process(p).status() != psutil.STATUS_ZOMBIE], \
        "a sim host process outlived its controller"


def ready(ctl: ControllerProc, role: str) -> list[dict[str, object]]:
    return [i for i in ctl.get(f"/instances?role={role}") if i["state"] == "ready"]


def test_hosted_engines_serve_scale_and_stop_with_no_failed_request(ctl: ControllerProc
                                                                   ) -> None:
    mine = hosts(ctl)
    assert len(mine) == 2, mine  # three instances on two shared processes
    assert engine_processes(ctl) == 0, "no instance runs as a process of its own"
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
    assert len(hosts(ctl)) == 2 and len(ready(ctl, "decode")) == 1
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
    [victim] = [pid for pid, _ in hosts(ctl).items()][:1]
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
    assert victim not in hosts(ctl) and len(hosts(ctl)) == 2  # a fresh host took its place
