"""``pdctl lab --backend sim`` end to end, and the ``external`` backend in front of engines
started outside the controller."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.integration.harness import (
    LONG_PROMPT,
    free_port,
    sim_engine,
    start_controller,
    wait_healthy,
)


class Output:
    """Collects a process's stdout lines in a thread, so a test can wait for a line."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        with proc.stdout:
            for line in proc.stdout:
                self.lines.append(line)

    def wait_for(self, needle: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while not any(needle in line for line in self.lines):
            if time.monotonic() > deadline:
                raise AssertionError(f"no {needle!r} in output:\n{''.join(self.lines)}")
            time.sleep(0.1)
        return "".join(self.lines)


def test_lab_sim_starts_prints_and_stops_everything(tmp_path: Path) -> None:
    port, console_port = free_port(), free_port()
    state = tmp_path / "state"
    proc = subprocess.Popen(
        [sys.executable, "-m", "controller.cli", "lab", "--backend", "sim", "--prefill", "2",
         "--decode", "3", "--port", str(port), "--state-dir", str(state), "--time-scale",
         "0.2", "--dashboard-port", str(console_port)], stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    output = Output(proc)
    try:
        out = output.wait_for("pools ready", 60)
        assert f"http://127.0.0.1:{port}/v1" in out and f"http://127.0.0.1:{port}/api/v1" in out
        assert str((state / "token").resolve()) in out
        assert "prefill 2 x TP4, decode 3 x TP4" in out
        console = f"http://127.0.0.1:{console_port}"
        assert console in out
        wait_healthy(console, 60, "/_stcore/health")  # the console, once Streamlit is up
        token = (state / "token").read_text().strip()
        assert oct((state / "token").stat().st_mode & 0o777) == "0o600"
        cluster = httpx.get(f"http://127.0.0.1:{port}/api/v1/cluster",
                            headers={"Authorization": f"Bearer {token}"}).json()
        urls = [i["url"] for i in cluster["instances"]]
        assert len(urls) == 5 and cluster["hardware"]["total_accelerators"] == 32
        r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=30,
                       json={"model": "llama-3-70b", "prompt": LONG_PROMPT, "max_tokens": 4})
        assert r.status_code == 200
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        for url in [*urls, console]:
            with pytest.raises(httpx.ConnectError):
                httpx.get(f"{url}/health", timeout=2)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()



def test_external_backend_routes_to_given_urls(tmp_path: Path) -> None:
    pp, dp = free_port(), free_port()
    engines = [sim_engine(pp, "prefill"), sim_engine(dp, "decode")]
    ctl = None
    try:
        ctl = start_controller(tmp_path, {"backend": "external", "pools": {
            "prefill": {"urls": [f"http://127.0.0.1:{pp}"], "tp": 2},
            "decode": {"urls": [f"http://127.0.0.1:{dp}"], "tp": 2}}})
        r = httpx.post(f"{ctl.url}/v1/completions", timeout=30,
                       json={"model": "llama-3-70b", "prompt": LONG_PROMPT, "max_tokens": 3})
        assert r.status_code == 200
        rec = ctl.get("/requests?limit=1")[0]
        assert rec["path"] == "disaggregated"
        assert {i["url"] for i in ctl.get("/instances")} == {f"http://127.0.0.1:{pp}",
                                                             f"http://127.0.0.1:{dp}"}
        refused = ctl.api("PATCH", "/pools/decode", {"size": 2})
        assert refused.status_code == 422 and "external" in refused.json()["detail"]
        assert ctl.stop() == 0
        # External engines are not the controller's to stop.
        assert httpx.get(f"http://127.0.0.1:{dp}/health", timeout=5).status_code == 200
    finally:
        if ctl is not None:
            ctl.stop()
        for e in engines:
            e.terminate()
            e.wait(timeout=30)


def test_external_backend_serves_the_engines_own_model(tmp_path: Path) -> None:
    """The README's example as written (no model named) in front of engines serving a model
    pdctl has no profile for: their name is served, their context told, and KV bytes are
    unknown rather than a default model's; engines that disagree are refused at start."""
    pp, dp, other = free_port(), free_port(), free_port()
    name = "acme/chat-8b"
    engines = [sim_engine(pp, "prefill", name), sim_engine(dp, "decode", name),
               sim_engine(other, "decode", "acme/other")]
    ctl = None
    try:
        for port in (pp, dp, other):
            wait_healthy(f"http://127.0.0.1:{port}")
        refused = subprocess.run(
            [sys.executable, "-m", "controller.cli", "controller", "--config",
             write_yaml(tmp_path / "two.yaml", external_config(
                 tmp_path / "refused", pp, [dp, other])), "--port", str(free_port())],
            capture_output=True, text=True, timeout=120)
        assert refused.returncode == 2, refused.stderr
        assert (f"http://127.0.0.1:{dp} serves '{name}'" in refused.stderr
                and f"http://127.0.0.1:{other} serves 'acme/other'" in refused.stderr)
        ctl = start_controller(tmp_path, {"backend": "external", "pools": {
            "prefill": {"urls": [f"http://127.0.0.1:{pp}"]},
            "decode": {"urls": [f"http://127.0.0.1:{dp}"]}}})
        models = httpx.get(f"{ctl.url}/v1/models", timeout=10).json()["data"]
        engine_ctx = httpx.get(f"http://127.0.0.1:{dp}/v1/models").json()["data"][0]
        assert [(m["id"], m["max_model_len"]) for m in models] == [
            (name, engine_ctx["max_model_len"])]
        r = httpx.post(f"{ctl.url}/v1/completions", timeout=30,
                       json={"model": name, "prompt": LONG_PROMPT, "max_tokens": 3})
        assert r.status_code == 200 and r.json()["model"] == name
        wrong = httpx.post(f"{ctl.url}/v1/completions", timeout=30,
                           json={"model": "llama-3-70b", "prompt": "hi", "max_tokens": 1})
        assert wrong.status_code == 404
        rec = ctl.get("/requests?limit=2")
        assert [x["path"] for x in rec if x["status"] == "ok"] == ["disaggregated"]
        assert ctl.get("/cluster")["model"]["kv_bytes_per_token"] is None
        assert ctl.get("/cache")["decode_kv_bytes_moved"] is None
        assert ctl.api("GET", "/advisor").status_code == 409
    finally:
        if ctl is not None:
            ctl.stop()
        for e in engines:
            e.terminate()
            e.wait(timeout=30)


def external_config(state: Path, prefill: int, decode: list[int]) -> dict[str, object]:
    return {"backend": "external", "controller": {"state_dir": str(state)}, "pools": {
        "prefill": {"urls": [f"http://127.0.0.1:{prefill}"]},
        "decode": {"urls": [f"http://127.0.0.1:{p}" for p in decode]}}}


def write_yaml(path: Path, cfg: dict[str, object]) -> str:
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


