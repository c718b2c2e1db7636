"""``pdctl lab --backend sim`` with Prometheus: started with the lab, its URL in the banner and
given to the console, scraping the controller and both engines, stopped with the lab."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from controller.obs import prometheus
from tests.integration.harness import free_port
from tests.integration.test_lab_and_external import Output

pytestmark = pytest.mark.slow


def processes_mentioning(needle: str) -> dict[int, tuple[list[str], dict[str, str]]]:
    """Live processes whose command line contains ``needle``: argv and environment."""
    found = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().decode(errors="replace").split("\0")
            if needle not in " ".join(argv) or (d / "stat").read_text().split()[2] == "Z":
                continue
            env = dict(kv.split("=", 1) for kv in
                       (d / "environ").read_bytes().decode(errors="replace").split("\0")
                       if "=" in kv)
        except OSError:
            continue
        found[int(d.name)] = (argv, env)
    return found


def test_lab_runs_prometheus_and_stops_it(tmp_path: Path, prometheus_bin: str) -> None:
    port, console_port = free_port(), free_port()
    state = tmp_path / "state"
    proc = subprocess.Popen(
        [sys.executable, "-m", "controller.cli", "lab", "--backend", "sim", "--port", str(port),
         "--state-dir", str(state), "--time-scale", "0.2", "--dashboard-port",
         str(console_port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    output = Output(proc)
    try:
        out = output.wait_for("pools ready", 60)
        m = re.search(r"^  prometheus   (http://127\.0\.0\.1:\d+) .*every 10 s", out, re.M)
        assert m, out
        url = m.group(1)
        assert str(state.resolve() / "prometheus" / "prometheus.yml") in out
        assert httpx.get(f"{url}/-/ready", timeout=5).status_code == 200

        def scraped() -> set[str]:
            data = httpx.get(f"{url}/api/v1/targets", timeout=5).json()["data"]
            return {f"{t['labels']['job']}/{t['labels']['instance']}"
                    for t in data["activeTargets"] if t["health"] == "up"}

        want = {f"pdctl-controller/127.0.0.1:{port}", "pdctl-engines/prefill-1",
                "pdctl-engines/decode-2"}
        deadline = time.monotonic() + 20
        while scraped() != want:
            assert time.monotonic() < deadline, scraped()
            time.sleep(0.5)
        consoles = [p for p in processes_mentioning(str(state)).values()
                    if "streamlit" in " ".join(p[0])]
        assert consoles, "the console is not running"
        argv, env = consoles[0]
        assert env["PDCTL_PROMETHEUS_URL"] == url
        assert argv[argv.index("--prometheus") + 1] == url
        assert (state / "prometheus" / "data").is_dir()

        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{url}/-/ready", timeout=2)
        assert processes_mentioning(str(state)) == {}  # Prometheus, console, engines: gone
        assert prometheus.targets_path(state).read_text().strip() == "[]"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
