"""``pdctl lab --launcher ray``: a Ray head started for the lab, engines as its actors, and
after Ctrl-C (SIGINT to the lab's whole process group, as a terminal sends it) no actor,
placement group, engine or Ray process left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from bench.fleet import free_port, healthy
from tests.integration.harness import LONG_PROMPT
from tests.ray.conftest import engine_processes, ray_processes

pytestmark = pytest.mark.timeout(300)


def test_the_lab_on_a_ray_head_of_its_own_serves_and_leaves_nothing(tmp_path: Path) -> None:
    port = free_port()
    state = tmp_path / "state"
    log = (tmp_path / "lab.log").open("wb")
    lab = subprocess.Popen(
        [sys.executable, "-m", "controller.cli", "lab", "--backend", "sim", "--launcher", "ray",
         "--no-dashboard", "--no-prometheus", "--port", str(port), "--state-dir", str(state),
         "--time-scale", "0.2"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while not (healthy(url, "/healthz") and
                   httpx.get(f"{url}/healthz").json()["ready"] == {"prefill": 1, "decode": 1}):
            assert lab.poll() is None, (tmp_path / "lab.log").read_text()
            assert time.monotonic() < deadline, (tmp_path / "lab.log").read_text()
            time.sleep(0.5)
        out = (tmp_path / "lab.log").read_text()
        assert "engines      Ray actors on a Ray head started for this lab" in out
        r = httpx.post(f"{url}/v1/completions", timeout=30, json={
            "model": "llama-3-70b", "prompt": LONG_PROMPT, "max_tokens": 4})
        assert r.status_code == 200, r.text
        token = (state / "token").read_text().strip()
        insts = httpx.get(f"{url}/api/v1/instances", timeout=10,
                          headers={"Authorization": f"Bearer {token}"}).json()
        assert {i["node"] for i in insts} == {"127.0.0.1"}
        assert len(engine_processes()) == 2 and ray_processes()
    finally:
        try:
            if lab.poll() is None:
                os.killpg(lab.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
            code = lab.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(lab.pid, signal.SIGKILL)
            raise
        finally:
            log.close()
    assert code == 0, (tmp_path / "lab.log").read_text()[-3000:]
    text = (tmp_path / "lab.log").read_text()
    assert "ready -> stopped (controller shutdown)" in text  # stopped by the controller
    deadline = time.monotonic() + 20
    while (engine_processes() or ray_processes()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert engine_processes() == [] and ray_processes() == []
