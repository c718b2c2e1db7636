"""``--log-format json``: every line the controller writes is one JSON object with a dated
UTC timestamp; a line about a client request carries its request id and the client's trace
id. (Text, the default, is dated too: ``tests/unit/test_logs.py``.)"""

from __future__ import annotations

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from bench import fleet
from tests.integration.harness import LONG_PROMPT, base_config, free_port

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def test_json_lines_with_the_request_and_trace_ids(tmp_path: Path) -> None:
    # One prefill slot, held by a long prefill, and a 1 ms queue: the requests sent while it
    # is held give up waiting and are served colocated, which the router logs about each one.
    cfg = base_config(tmp_path / "state", free_port(), sim={"time_scale": 1.0}, routing={
        "disagg_min_prompt_tokens": 16, "prefill_max_inflight": 1,
        "prefill_queue_timeout_s": 0.001})
    ctl = fleet.start_controller(tmp_path, cfg, config_file="pdctl.yaml", wait="converged",
                                 args=["--log-format", "json"])

    def send(k: int, prompt: str = LONG_PROMPT) -> int:
        return httpx.post(f"{ctl.url}/v1/completions", timeout=60, headers={
            "x-request-id": f"req-json-{k}", "traceparent": f"00-{TRACE}-00f067aa0ba902b{k}-01"},
            json={"model": "llama-3-70b", "prompt": f"{k} {prompt}",
                  "max_tokens": 2}).status_code

    def slot_held() -> bool:
        return any(i["load"]["inflight"] for i in ctl.get("/instances", role="prefill"))

    try:
        with ThreadPoolExecutor(4) as pool:
            holder = pool.submit(send, 9, LONG_PROMPT * 10)  # ~6,600 tokens to prefill
            # Polled closely: the slot is held for about 0.5 s.
            ctl.wait(slot_held, 30, "the long prefill to hold the slot", interval=0.005)
            assert list(pool.map(send, range(3))) == [200] * 3
            assert holder.result() == 200
        time.sleep(0.5)
    finally:
        ctl.stop()
    lines = [x for x in ctl.log_path.read_text().splitlines() if x.strip()]
    objs = [json.loads(x) for x in lines]  # every line is JSON
    for o in objs:
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", o["ts"]), o
        assert {"level", "logger", "message"} <= o.keys()
    about = [o for o in objs if "no prefill slot" in o["message"]]
    assert about, objs[-5:]
    for o in about:
        assert o["request_id"].startswith("req-json-") and o["request_id"] in o["message"]
        assert o["trace_id"] == TRACE
