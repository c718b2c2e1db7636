"""Request traces over OTLP/HTTP (``controller.otlp_traces_endpoint``): a real controller and
simulated engines export to an OTLP receiver in this test (the protobuf body the collector
would get, decoded with OpenTelemetry's own proto classes). A disaggregated request with a
client ``traceparent`` gives one server span, a child of the client's span, with the TTFT
parts as its children laid end to end; both engine hops carry the router's span as their
parent. (Without an endpoint the client's context goes to the engines unchanged:
``tests/integration/test_handoff_sim.py``.)"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.harness import LONG_PROMPT, free_port, start_controller

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is part of `make test`")
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (  # noqa: E402
    ExportTraceServiceRequest,
)

pytestmark = pytest.mark.slow

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"


class Receiver:
    """An OTLP/HTTP traces endpoint: every exported span, decoded."""

    def __init__(self) -> None:
        self.spans: list[Any] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                req = ExportTraceServiceRequest()
                req.ParseFromString(body)
                with receiver.lock:
                    for rs in req.resource_spans:
                        for ss in rs.scope_spans:
                            receiver.spans.extend(ss.spans)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.port = free_port()
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/traces"

    def wait(self, check: Any, timeout_s: float = 30.0) -> list[Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self.lock:
                spans = list(self.spans)
            if check(spans):
                return spans
            time.sleep(0.2)
        raise AssertionError(f"spans never complete: {[s.name for s in self.spans]}")


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.server.shutdown()
    r.server.server_close()


def test_a_request_span_with_its_ttft_parts_parented_on_the_client(
        tmp_path: Path, receiver: Receiver) -> None:
    ctl = start_controller(tmp_path, {
        "controller": {"otlp_traces_endpoint": receiver.url},
        "pools": {"prefill": {"size": 1, "tp": 4}, "decode": {"size": 1, "tp": 2}}})
    try:
        r = httpx.post(f"{ctl.url}/v1/completions", timeout=60,
                       headers={"traceparent": TRACEPARENT, "tracestate": "vendor=1"},
                       json={"model": "llama-3-70b", "prompt": LONG_PROMPT,
                             "max_tokens": 4, "stream": True})
        assert r.status_code == 200
        rid = r.headers["x-request-id"]
        spans = receiver.wait(lambda s: any(x.name == "POST /v1/completions" for x in s)
                              and len(s) >= 4)
        [req] = [s for s in spans if s.name == "POST /v1/completions"]
        [rec] = ctl.get("/requests", limit=1)  # recorded before its span was ended
        assert rec["id"] == rid and rec["path"] == "disaggregated"
        assert req.trace_id.hex() == CLIENT_TRACE and req.parent_span_id.hex() == CLIENT_SPAN
        attrs = {a.key: a.value for a in req.attributes}
        assert attrs["pdctl.request_id"].string_value == rid
        assert attrs["pdctl.path"].string_value == "disaggregated"
        assert attrs["gen_ai.usage.output_tokens"].int_value == rec["output_tokens"]
        parts = sorted((s for s in spans if s.parent_span_id == req.span_id),
                       key=lambda s: s.start_time_unix_nano)
        assert [s.name for s in parts] == [
            n for n, f in (("queue", "queue_ms"), ("prefill", "prefill_ms"),
                           ("kv_transfer", "transfer_ms"), ("decode_scheduling",
                                                            "decode_sched_ms")) if rec[f] > 0]
        assert {"prefill", "kv_transfer"} <= {s.name for s in parts}
        assert parts[0].start_time_unix_nano == req.start_time_unix_nano
        for a, b in zip(parts, parts[1:], strict=False):
            assert a.end_time_unix_nano == b.start_time_unix_nano  # end to end
        assert parts[-1].end_time_unix_nano <= req.end_time_unix_nano
        ttft_ns = parts[-1].end_time_unix_nano - req.start_time_unix_nano
        assert ttft_ns == pytest.approx(
            (rec["ttft_ms"] - rec["overhead_ms"]) * 1e6, abs=len(parts) * 1e3)
        # Both hops carried the router's span, in the client's trace.
        for inst in ctl.get("/instances"):
            got = httpx.get(f"{inst['url']}/sim/traces", timeout=10).json()["traces"]
            [tp] = [t["traceparent"] for t in got if t["request_id"] == rid]
            assert tp.split("-")[1:3] == [CLIENT_TRACE, req.span_id.hex()], inst["role"]
    finally:
        ctl.stop()
