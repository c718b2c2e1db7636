"""The console scenario's SYNTHETIC controller: the controller app built in-process, its
request log, fleet registry and audit log filled with generated records, instances and
events, served by uvicorn in a thread."""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import uvicorn

from bench.scenarios.console.model import SYNTHETIC_DECODE, SYNTHETIC_PREFILL
from controller.api.app import create_app
from controller.api.state import AppState
from controller.config import Settings
from controller.models import Instance, RequestPath, RequestRecord, Role
from pdctl_api import profiles


def synthetic_records(n: int, span_s: float, rng: random.Random) -> Iterator[RequestRecord]:
    m = profiles.model("llama-3-70b")
    now = time.time()
    for k in range(n):
        prompt = int(rng.lognormvariate(7.0, 1.0)) + 1
        disagg = prompt >= 512
        parts = {"queue_ms": rng.expovariate(1 / 3), "prefill_ms": 0.05 * prompt + 5,
                 "transfer_ms": (0.0066 * prompt + 10) if disagg else 0.0,
                 "decode_sched_ms": rng.uniform(5, 15) if disagg else 0.0,
                 "overhead_ms": rng.uniform(1, 6)}
        yield RequestRecord(
            id=f"synthetic-{k}", started_at=now - span_s + span_s * k / n,
            endpoint="/v1/completions",
            path=RequestPath.DISAGGREGATED if disagg else RequestPath.COLOCATED,
            status="ok" if k % 200 else "error", stream=bool(k % 2), prompt_tokens=prompt,
            output_tokens=rng.randint(16, 512),
            prefill_instance=f"prefill-{k % SYNTHETIC_PREFILL + 1}" if disagg else None,
            decode_instance=f"decode-{SYNTHETIC_PREFILL + k % SYNTHETIC_DECODE + 1}",
            ttft_ms=sum(parts.values()), itl_ms=rng.uniform(20, 40), e2e_ms=2000.0,
            kv_bytes=profiles.kv_bytes(m, prompt, 16) if disagg else 0,
            queue_ms=parts["queue_ms"], prefill_ms=parts["prefill_ms"],
            transfer_ms=parts["transfer_ms"], decode_sched_ms=parts["decode_sched_ms"],
            overhead_ms=parts["overhead_ms"])


def fill(st: AppState, records: int, rng: random.Random) -> None:
    for rec in synthetic_records(records, 600.0, rng):
        st.requests.add(rec)
    registry = st.fleet.registry
    n = 0
    for role, count, tp in ((Role.PREFILL, SYNTHETIC_PREFILL, 4),
                            (Role.DECODE, SYNTHETIC_DECODE, 2)):
        for _ in range(count):
            n += 1
            inst = Instance(id=f"{role.value}-{n}", role=role, tp=tp,
                            url=f"http://10.0.{n // 8}.{n % 8}:8000",
                            created_at=time.monotonic(), running=float(rng.randint(0, 64)),
                            waiting=float(rng.randint(0, 6)), kv_usage=rng.random())
            registry.add(inst, "synthetic", actor="bench")
            registry.mark_ready(inst)
    for k in range(500):
        st.store.record("bench", "instance.ready", f"decode-{k}", "starting", "ready",
                        "synthetic event")


@contextlib.contextmanager
def serve_synthetic_controller(state_dir: Path, records: int
                               ) -> Iterator[tuple[str, AppState]]:
    """The filled app on a free port: its URL and state, until the block ends. The app runs
    without its lifespan: no reconcile loop, so its launcher never starts an engine."""
    settings = Settings.model_validate({
        "backend": "sim", "hardware": {"nodes": 64},
        "pools": {"prefill": {"size": SYNTHETIC_PREFILL, "tp": 4},
                  "decode": {"size": SYNTHETIC_DECODE, "tp": 2}},
        "controller": {"state_dir": str(state_dir), "request_buffer": max(100, records)}})
    app = create_app(settings)
    st: AppState = app.state.pdctl
    fill(st, records, random.Random(4))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="off",
                                           log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", st
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        st.store.close()
