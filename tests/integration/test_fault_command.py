"""``pdctl fault``: the scenarios rehearsed one after another against one simulated fleet of
engine processes, as an operator runs them, with the reference comparison on; each report
passes every check and says what happened."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.harness import ControllerProc, free_port, start_controller
from tests.integration.harness import pdctl_fault as fault

FLEET = {"model": {"name": "llama-3-8b"},
         "pools": {"prefill": {"size": 2, "tp": 1}, "decode": {"size": 2, "tp": 1}},
         "kv": {"lease_s": 6}, "sim": {"processes": 0}}


@pytest.fixture(scope="module")
def ctl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControllerProc]:
    c = start_controller(tmp_path_factory.mktemp("fault"), FLEET)
    try:
        yield c
    finally:
        c.stop()


@pytest.mark.parametrize(("scenario", "role", "event"), [
    ("kill-prefill", "prefill", "instance.failed"),
    ("stall-prefill", "prefill", "instance.failed"),
    ("kill-decode", "decode", "instance.failed"),
    ("tp-change", "prefill", "pool.update"),
])
def test_each_scenario_rehearsed_passes_every_check(ctl: ControllerProc, scenario: str,
                                                     role: str, event: str) -> None:
    rc, report, err = fault(ctl.url, ctl.state_dir, scenario, "--reference",
                            "--requests", "12")
    failed = [f"{c['name']}: {c['detail']}" for c in report.get("checks", []) if not c["ok"]]
    assert rc == 0, "\n".join(failed) or f"{report}\n{err}"
    checks = {c["name"].split(" ")[0] + " " + c["name"].split(" ")[1]: c
              for c in report["checks"]}
    assert len(checks) == 6 and all(c["ok"] for c in checks.values()), checks
    assert report["target"].startswith(role), report
    assert f"{event} on {report['target']}" in checks["the fault"]["detail"]
    completed, sent = checks["every request"]["detail"].split(" completed")[0].split(" of ")
    assert int(sent) >= 12, checks
    assert checks["every answer"]["detail"].startswith(
        f"{completed} of {completed} equal (12 distinct references)")
    assert "disaggregated" in checks["every answered"]["detail"]  # the load hit the fault's path
    if scenario != "tp-change":  # the victim is failed; the controller said so
        [failed] = ctl.get("/events?kind=instance.failed&limit=1")
        assert failed["target"] == report["target"]


def test_refused_when_it_cannot_be_injected(ctl: ControllerProc, tmp_path: Path) -> None:
    rc, _, err = fault(f"http://127.0.0.1:{free_port()}", ctl.state_dir, "kill-decode")
    assert rc == 2 and "cannot reach the controller" in err, err
    rc, _, err = fault(ctl.url, tmp_path, "kill-decode")  # no token there
    assert rc == 2 and "no API token" in err, err
    out = subprocess.run([sys.executable, "-m", "controller.cli", "fault", "--help"],
                         capture_output=True, text=True, timeout=60)
    assert "stall-prefill" in out.stdout and "exit status" in out.stdout


def test_restart_controller_runs_the_operators_command_under_load(tmp_path: Path) -> None:
    """The operator's restart command run under load: requests in flight are served or told
    (503), new ones are refused while no controller listens, the same clients are served
    after, and the new run's records and audit log say so."""
    ctl = start_controller(tmp_path, {**FLEET, "controller": {"port": free_port()}})
    pidfile = tmp_path / "controller.pid"
    pidfile.write_text(str(ctl.proc.pid))
    restart = (f"{sys.executable} -m tests.integration.restart_controller {pidfile} "
               f"{tmp_path / 'restarted.log'}")
    try:
        rc, report, err = fault(ctl.url, ctl.state_dir, "restart-controller",
                                "--restart-cmd", restart, "--requests", "12")
        assert rc == 0, (report, err)
        checks = {c["name"].split(" ")[1]: c for c in report["checks"]}
        assert all(c["ok"] for c in checks.values()) and len(checks) == 5, checks
        assert "the controller answered again" in report["detail"], report
        assert "controller.start on controller" in checks["fault"]["detail"]
        assert int(pidfile.read_text()) != ctl.proc.pid and ctl.proc.poll() == 0
        rc, _, err = fault(ctl.url, ctl.state_dir, "restart-controller")
        assert rc == 2 and "needs --restart-cmd" in err, err
    finally:
        ctl.stop()
        new = int(pidfile.read_text())
        if new != ctl.proc.pid:
            os.kill(new, signal.SIGTERM)
            deadline = time.monotonic() + 60
            while Path(f"/proc/{new}").exists() and time.monotonic() < deadline:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(new, os.WNOHANG)
                time.sleep(0.1)
            with contextlib.suppress(ProcessLookupError):
                os.kill(new, signal.SIGKILL)  # it did not stop: none is left running
