"""The controller process itself, on the wire (issue 16, findings 9, 10 and 12): its
listener's timeouts and connection cap, its audit log across a SIGKILL and a restart, and
which configuration layer wins in ``pdctl lab``."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httptools
import httpx
import pytest
import yaml

from bench.fleet import free_port
from tests.integration.harness import DATA_WORKERS, ControllerProc, start_controller


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControllerProc]:
    c = start_controller(tmp_path_factory.mktemp("listener"), {
        "controller": {"header_timeout_s": 1.0, "keep_alive_s": 1.0, "max_connections": 12,
                       "max_body_bytes": 4096},
        "pools": {"prefill": {"size": 0, "tp": 2}, "decode": {"size": 1, "tp": 2}}})
    yield c
    c.stop()


def connect(ctl: ControllerProc) -> socket.socket:
    host, port = ctl.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def closed_after(s: socket.socket, within_s: float) -> tuple[float, bytes]:
    """Seconds until the server closed ``s``, and what it sent before closing."""
    t0, got = time.monotonic(), b""
    s.settimeout(within_s)
    while True:
        chunk = s.recv(65536)
        if not chunk:
            return time.monotonic() - t0, got
        got += chunk


def test_connections_that_send_nothing_are_closed(edge: ControllerProc) -> None:
    socks = [connect(edge) for _ in range(10)]
    try:
        for s in socks:
            took, got = closed_after(s, 5)
            assert took < 3 and got.startswith(b"HTTP/1.1 408"), (took, got)
    finally:
        for s in socks:
            s.close()
    assert httpx.get(f"{edge.url}/healthz", timeout=5).status_code == 200


def test_slow_headers_are_cut_off(edge: ControllerProc) -> None:
    with connect(edge) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n")  # and never the blank line
        t0 = time.monotonic()
        for _ in range(4):  # trickling headers does not extend the deadline
            time.sleep(0.3)
            s.sendall(b"x-slow: 1\r\n")
        took, got = closed_after(s, 5)
        assert got.startswith(b"HTTP/1.1 408") and time.monotonic() - t0 < 3


def test_idle_keep_alive_connections_are_closed(edge: ControllerProc) -> None:
    with connect(edge) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        first = s.recv(65536)
        assert first.startswith(b"HTTP/1.1 200")
        took, _ = closed_after(s, 5)
        assert 0.5 < took < 3


def test_a_long_request_is_not_cut_by_the_header_timeout(edge: ControllerProc) -> None:
    r = httpx.post(f"{edge.url}/v1/completions", timeout=30, json={
        "model": "llama-3-70b", "prompt": "hello", "max_tokens": 40, "ignore_eos": True,
        "stream": True})
    assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]")


def test_connections_over_the_cap_get_503(edge: ControllerProc) -> None:
    # With router workers each process takes its share of the cap, and the kernel spreads
    # the connections at random: enough that every process is over its share.
    socks = [connect(edge) for _ in range(12 if DATA_WORKERS == 1 else 24 * DATA_WORKERS)]
    try:
        time.sleep(0.1)
        r = httpx.get(f"{edge.url}/healthz", timeout=5)
        assert r.status_code == 503
    finally:
        for s in socks:
            s.close()
    edge.wait(lambda: httpx.get(f"{edge.url}/healthz", timeout=5).status_code == 200, 5,
              "the listener to accept again")


# ---- the inference routes on the wire (``data.WireLane``: no ASGI app in between) ----


class Answers:
    """The HTTP answers read from one connection, in order (httptools' response parser)."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.done: list[dict[str, Any]] = []
        self._cur: dict[str, Any] = {}

    def on_message_begin(self) -> None:
        self._cur = {"headers": {}, "body": b""}

    def on_header(self, name: bytes, value: bytes) -> None:
        self._cur["headers"][name.decode().lower()] = value.decode()

    def on_headers_complete(self) -> None:
        self._cur["status"] = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self._cur["body"] += body

    def on_message_complete(self) -> None:
        self.done.append(self._cur)

    def read(self, s: socket.socket, n: int) -> list[dict[str, Any]]:
        s.settimeout(20)
        while len(self.done) < n:
            chunk = s.recv(65536)
            assert chunk, f"the connection closed after {len(self.done)} of {n} answers"
            self.parser.feed_data(chunk)
        return self.done


def completion(rid: str, stream: bool, headers: bytes = b"") -> tuple[bytes, bytes]:
    body = json.dumps({"model": "llama-3-70b", "prompt": f"hello {rid}", "max_tokens": 3,
                       "stream": stream}).encode()
    head = (b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"x-request-id: %b\r\ncontent-length: %d\r\n%b\r\n" % (rid.encode(), len(body),
                                                                   headers))
    return head, body


def check_answer(a: dict[str, Any], rid: str, stream: bool) -> None:
    assert a["status"] == 200 and a["headers"]["x-request-id"] == rid, a
    if stream:
        assert a["headers"]["transfer-encoding"] == "chunked", a["headers"]
        assert a["body"].rstrip().endswith(b"data: [DONE]"), a["body"]
    else:
        assert int(a["headers"]["content-length"]) == len(a["body"]), a["headers"]
        assert json.loads(a["body"])["choices"][0]["text"], a["body"]


def test_inference_requests_in_pieces_pipelined_and_after_100_continue(
        edge: ControllerProc) -> None:
    answers = Answers()
    with connect(edge) as s:
        # The body in three reads, the last after a pause: read whole before it is routed.
        head, body = completion("pieces", False)
        s.sendall(head)
        time.sleep(0.2)
        s.sendall(body[:10])
        time.sleep(0.2)
        s.sendall(body[10:])
        check_answer(answers.read(s, 1)[0], "pieces", False)
        # Three requests in one write: answered in order on the same connection.
        sent = [("p1", True), ("p2", False), ("p3", True)]
        s.sendall(b"".join(b"".join(completion(rid, stream)) for rid, stream in sent))
        for a, (rid, stream) in zip(answers.read(s, 4)[1:], sent, strict=True):
            check_answer(a, rid, stream)
        # Expect: 100-continue, then the body once the server said to go on.
        head, body = completion("ask-first", True, b"expect: 100-continue\r\n")
        s.sendall(head)
        s.settimeout(10)
        assert s.recv(65536) == b"HTTP/1.1 100 Continue\r\n\r\n"
        s.sendall(body)
        check_answer(answers.read(s, 5)[4], "ask-first", True)
        # The client says it closes: so does the server, after the answer.
        s.sendall(b"".join(completion("last", False, b"connection: close\r\n")))
        last = answers.read(s, 6)[5]
        check_answer(last, "last", False)
        assert last["headers"]["connection"] == "close"
        took, rest = closed_after(s, 5)
        assert rest == b"" and took < 2
    status = {r["id"]: r["status"] for r in edge.get("/requests", limit=10_000)}
    for rid in ("pieces", "p1", "p2", "p3", "ask-first", "last"):
        assert status.get(rid) == "ok", (rid, status.get(rid))


def test_a_body_over_the_limit_in_one_read_is_413_and_the_connection_closed(
        edge: ControllerProc) -> None:
    body = json.dumps({"model": "llama-3-70b", "prompt": "x" * 5000, "max_tokens": 1}).encode()
    with connect(edge) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json"
                  b"\r\nx-request-id: too-big\r\ncontent-length: %d\r\n\r\n%b"
                  % (len(body), body))
        a = Answers().read(s, 1)[0]
        assert a["status"] == 413 and a["headers"]["connection"] == "close", a
        assert "max_body_bytes" in json.loads(a["body"])["error"]["message"]
        assert closed_after(s, 5)[1] == b""
    assert [r["status"] for r in edge.get("/requests", limit=10_000)
            if r["id"] == "too-big"] == ["rejected"]


# ---- finding 10: a SIGKILLed controller's instances are accounted for at the next start ----


def test_instances_left_by_a_killed_controller_are_recorded_at_restart(tmp_path: Path) -> None:
    cfg = {"pools": {"prefill": {"size": 1, "tp": 2}, "decode": {"size": 1, "tp": 2}}}
    first = start_controller(tmp_path, cfg)
    try:
        old = {i["id"]: i for i in first.get("/instances")}
        assert len(old) == 2 and all(i["state"] == "ready" for i in old.values())
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(10)
    finally:
        first.stop()
    second = start_controller(tmp_path, cfg)
    try:
        events = second.get("/events", kind="instance.failed", limit=100)
        by_target = {e["target"]: e for e in events}
        assert set(old) <= set(by_target), events
        for iid in old:
            e = by_target[iid]
            assert e["before"] == "ready" and e["after"] == "failed"
            assert "previous controller run ended without stopping it" in e["detail"]
        for inst in old.values():  # the engines did not outlive the killed controller
            pid = inst["pid"]
            assert not Path(f"/proc/{pid}").exists() or b"zombie" in Path(
                f"/proc/{pid}/status").read_bytes().lower()
        # The new run's own instances are not among them; a clean stop leaves none behind.
        assert not {i["id"] for i in second.get("/instances")} & set(old)
    finally:
        second.stop()
    third = start_controller(tmp_path, cfg)
    try:
        assert len(third.get("/events", kind="instance.failed", limit=100)) == len(events)
    finally:
        third.stop()


# ---- finding 12: defaults < config file < environment < flags given ----------------------


def run_lab(tmp: Path, config: dict[str, object], *flags: str,
            env: dict[str, str] | None = None) -> tuple[dict[str, object], str]:
    """Start ``pdctl lab`` (no console, no Prometheus) on ``config``; its cluster view."""
    cfg = tmp / "lab.yaml"
    cfg.write_text(yaml.safe_dump(config))
    port = free_port()
    argv = [sys.executable, "-m", "controller.cli", "lab", "--config", str(cfg),
            "--no-dashboard", "--no-prometheus", "--state-dir", str(tmp / "state"), *flags]
    if "--port" not in flags:
        argv += ["--port", str(port)]
    else:
        port = int(flags[flags.index("--port") + 1])
    log = open(tmp / "lab.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, **(env or {})}, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        assert proc.poll() is None, (tmp / "lab.log").read_text()
        token = (tmp / "state" / "token").read_text().strip()
        cluster = httpx.get(f"{url}/api/v1/cluster", timeout=10,
                            headers={"authorization": f"Bearer {token}"}).json()
        return cluster, (tmp / "lab.log").read_text()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def test_lab_takes_the_backend_from_its_config_file(tmp_path: Path) -> None:
    cluster, _ = run_lab(tmp_path, {
        "backend": "sim", "sim": {"time_scale": 0.2, "startup_delay_s": 0.2},
        "routing": {"disagg_min_prompt_tokens": 55},
        "pools": {"prefill": {"size": 1, "tp": 2}, "decode": {"size": 1, "tp": 2}}})
    assert cluster["backend"] == "sim"
    assert cluster["routing"]["disagg_min_prompt_tokens"] == 55


def test_environment_beats_the_file_and_flags_beat_both(tmp_path: Path) -> None:
    port = free_port()
    cluster, _ = run_lab(tmp_path, {
        "backend": "sim", "sim": {"time_scale": 0.2, "startup_delay_s": 0.2},
        "routing": {"disagg_min_prompt_tokens": 55, "max_attempts": 2},
        "controller": {"port": 1},  # the flag below wins
        "pools": {"prefill": {"size": 1, "tp": 2}, "decode": {"size": 1, "tp": 2}}},
        "--port", str(port), "--decode", "2",
        env={"PDCTL_ROUTING__DISAGG_MIN_PROMPT_TOKENS": "77"})
    assert cluster["routing"]["disagg_min_prompt_tokens"] == 77  # env over file
    assert cluster["routing"]["max_attempts"] == 2  # file, untouched by env
    assert cluster["pools"]["decode"]["desired"]["size"] == 2  # flag over file
