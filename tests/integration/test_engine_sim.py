"""``python -m controller.engines.sim`` as real processes on real sockets.

Two-hop P/D by hand, the openai SDK, a reused handle, failure policies with a killed
prefill, the KV lease (expiry, late reads, releases of rejected requests, the log lines), and
a streaming client that disconnects. Every process started here is stopped in a ``finally``.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from controller.launchers.process import free_port
from tests.integration.harness import wait_healthy

REPO = Path(__file__).resolve().parents[2]
MODEL = "llama-3-8b"
SERVED = "sim-llama"
BODY: dict[str, Any] = {"model": SERVED, "prompt": "the KV cache travels " * 60, "max_tokens": 8}
HOP_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
              "remote_block_ids": None, "remote_host": None, "remote_port": None}


@dataclass
class Engine:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path


def launch(tmp: Path, name: str, role: str, *extra: str) -> Engine:
    port = free_port()
    log = tmp / f"{name}.log"
    argv = [sys.executable, "-m", "controller.engines.sim", "--port", str(port),
            "--role", role, "--model", MODEL, "--served-model-name", SERVED,
            "--time-scale", "0.05", "--engine-id", name, *extra]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    return Engine(f"http://127.0.0.1:{port}", proc, log)


def wait_started(engines: list[Engine], timeout_s: float = 20.0) -> None:
    """Every engine healthy within ``timeout_s`` in all."""
    deadline = time.monotonic() + timeout_s
    for e in engines:
        wait_healthy(e.url, deadline - time.monotonic(), proc=e.proc, log=e.log)


def stop(e: Engine) -> None:
    if e.proc.poll() is None:
        e.proc.send_signal(signal.SIGTERM)
        try:
            e.proc.wait(5.0)
        except subprocess.TimeoutExpired:
            e.proc.kill()
    e.proc.wait()


@contextlib.contextmanager
def engines(tmp: Path, *specs: tuple[str, str, list[str]]) -> Iterator[list[Engine]]:
    started: list[Engine] = []
    try:
        for name, role, extra in specs:
            started.append(launch(tmp, name, role, *extra))
        wait_started(started)
        yield started
    finally:
        for e in started:
            stop(e)


@dataclass
class Fleet:
    prefill: Engine
    decode: Engine  # kv_load_failure_policy fail
    decode_recompute: Engine


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("engine-sim")
    with engines(tmp, ("P", "prefill", []), ("D", "decode", []),
                 ("DR", "decode", ["--kv-load-failure-policy", "recompute"])) as (p, d, dr):
        yield Fleet(p, d, dr)


def metric(url: str, name: str, **labels: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    want = {"model_name": SERVED, **labels}
    for line in text.splitlines():
        m = re.match(r"^([^{ ]+)(?:\{(.*)\})? (\S+)$", line)
        if m and m.group(1) == name and dict(re.findall(r'(\w+)="([^"]*)"',
                                                        m.group(2) or "")) == want:
            return float(m.group(3))
    raise AssertionError(f"{name}{want} not exposed by {url}")


def prefill_hop(url: str) -> dict[str, Any]:
    r = httpx.post(f"{url}/v1/completions", json={**BODY, "kv_transfer_params": HOP_PARAMS})
    assert r.status_code == 200, r.text
    params: dict[str, Any] = r.json()["kv_transfer_params"]
    return params


def decode_hop(url: str, params: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", json={**BODY, "kv_transfer_params": params},
                      headers={"X-Request-Id": "hop-1"})


def colocated_text(url: str) -> str:
    text: str = httpx.post(f"{url}/v1/completions", json=BODY).json()["choices"][0]["text"]
    return text


def test_two_hop_flow_by_hand(fleet: Fleet) -> None:
    external = "vllm:prompt_tokens_by_source_total"
    before = metric(fleet.decode.url, external, source="external_kv_transfer")
    params = prefill_hop(fleet.prefill.url)
    assert params["remote_engine_id"] == "P"
    assert params["remote_port"] == int(fleet.prefill.url.rsplit(":", 1)[1])
    r = decode_hop(fleet.decode.url, params)
    assert r.status_code == 200, r.text
    assert r.headers["x-request-id"] == "hop-1"
    assert r.json()["choices"][0]["text"] == colocated_text(fleet.decode.url)
    assert r.json()["metrics"]["kv_transfer_ms"] > 0
    assert metric(fleet.decode.url, external, source="external_kv_transfer") > before
    assert metric(fleet.prefill.url, "vllm:kv_cache_usage_perc") == 0.0  # pulled and freed


def test_openai_sdk_against_one_engine(fleet: Fleet) -> None:
    client = openai.OpenAI(base_url=f"{fleet.decode.url}/v1", api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list()] == [SERVED]
    done = client.completions.create(model=SERVED, prompt="hello", max_tokens=5)
    assert done.choices[0].finish_reason == "length" and done.usage is not None
    assert done.usage.completion_tokens == 5
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=SERVED, prompt="hello", max_tokens=5, stream=True) if c.choices)
    assert streamed == done.choices[0].text
    chat = client.chat.completions.create(
        model=SERVED, messages=[{"role": "user", "content": "hi"}], max_completion_tokens=4)
    assert chat.choices[0].message.content and chat.choices[0].finish_reason == "length"
    assert (chat.model_extra or {})["metrics"]["time_to_first_token_ms"] >= 0
    chunks = list(client.chat.completions.create(
        model=SERVED, messages=[{"role": "user", "content": "hi"}], max_completion_tokens=4,
        stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == chat.choices[0].message.content
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4


def test_reused_handle_is_read_silently(fleet: Fleet) -> None:
    # vLLM 0.32: a read of blocks the prefill no longer tracks succeeds on the decode side;
    # only the prefill counts it, under either failure policy.
    after_expiry = "vllm:nixl_num_notifications_after_expiry_total"
    noticed_before = metric(fleet.prefill.url, after_expiry)
    params = prefill_hop(fleet.prefill.url)
    assert decode_hop(fleet.decode.url, params).status_code == 200
    failed_before = metric(fleet.decode.url, "vllm:nixl_num_failed_transfers_total")
    for url in (fleet.decode.url, fleet.decode_recompute.url):
        r = decode_hop(url, params)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == colocated_text(fleet.decode.url)
    assert metric(fleet.decode.url, "vllm:nixl_num_failed_transfers_total") == failed_before
    assert metric(fleet.prefill.url, after_expiry) == noticed_before + 2


def test_killed_prefill_between_hops(fleet: Fleet, tmp_path: Path) -> None:
    with engines(tmp_path, ("P2", "prefill", [])) as (p2,):
        params = prefill_hop(p2.url)
        p2.proc.send_signal(signal.SIGKILL)
        p2.proc.wait()
        r = decode_hop(fleet.decode.url, params)
        assert r.status_code == 500 and "unreachable" in r.json()["error"]["message"]
        r = decode_hop(fleet.decode_recompute.url, params)
        assert r.status_code == 200
        assert r.json()["choices"][0]["text"] == colocated_text(fleet.decode.url)
    assert httpx.get(f"{fleet.decode_recompute.url}/health").status_code == 200


def wait_for(predicate: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_kv_lease_expiry_late_read_and_rejected_release(tmp_path: Path) -> None:
    with engines(tmp_path, ("PL", "prefill", ["--kv-lease-duration", "0.5"]),
                 ("DL", "decode", [])) as (p, d):
        params = prefill_hop(p.url)
        assert metric(p.url, "vllm:kv_cache_usage_perc") > 0
        wait_for(lambda: metric(p.url, "vllm:nixl_num_kv_expired_reqs_total") == 1)
        assert metric(p.url, "vllm:kv_cache_usage_perc") == 0.0
        rid = params["remote_request_id"]
        r = decode_hop(d.url, params)  # after the lease: the read still succeeds
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == colocated_text(d.url)
        assert metric(p.url, "vllm:nixl_num_notifications_after_expiry_total") == 1
        assert metric(d.url, "vllm:nixl_num_failed_transfers_total") == 0
        # a decode hop the decode engine rejects frees the prefill's blocks at once
        params = prefill_hop(p.url)
        r = httpx.post(f"{d.url}/v1/completions",
                       json={**BODY, "max_tokens": -1, "kv_transfer_params": params})
        assert r.status_code == 400
        wait_for(lambda: metric(p.url, "vllm:kv_cache_usage_perc") == 0.0, timeout=0.4)
        assert metric(p.url, "vllm:nixl_num_kv_expired_reqs_total") == 1
    log = p.log.read_text()
    assert re.search(r"^WARNING .* Releasing expired KV blocks for request "
                     f"{re.escape(rid)} which were retrieved by 0 remote worker\\(s\\) before "
                     r"lease expired\.$", log, re.MULTILINE), log
    assert re.search(r"^ERROR .* Potentially invalid KV blocks for unrecognized request "
                     f"{re.escape(rid)} were retrieved by a decode worker\\. They may have "
                     r"expired\.$", log, re.MULTILINE), log


def test_streaming_client_disconnect_frees_the_batch(fleet: Fleet) -> None:
    url = fleet.decode.url
    success = "vllm:request_success_total"
    finished_before = metric(url, success, finished_reason="length")
    body = {**BODY, "max_tokens": 7000, "stream": True}
    with httpx.Client(timeout=10.0) as client, client.stream(
            "POST", f"{url}/v1/completions", json=body) as r:
        lines = r.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        assert json.loads(first.removeprefix("data: "))["choices"]
        assert metric(url, "vllm:num_requests_running") == 1
    deadline = time.monotonic() + 5.0
    while metric(url, "vllm:num_requests_running") != 0:
        assert time.monotonic() < deadline, "the aborted request still runs"
        time.sleep(0.05)
    assert metric(url, "vllm:kv_cache_usage_perc") == 0.0
    assert metric(url, success, finished_reason="length") == finished_before  # aborted, not done


def test_sigterm_stops_the_engine_with_exit_0(tmp_path: Path) -> None:
    e = launch(tmp_path, "T", "both")
    try:
        wait_started([e])
    finally:
        stop(e)
    assert e.proc.returncode == 0, e.log.read_text()
