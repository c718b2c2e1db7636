"""Router workers (``controller.data_workers: 2``): a real controller process and its worker
process share the listening address; the kernel spreads the client connections over both.
Every request is recorded in the one controller, whichever process served it; the control
API answers the same from either; a routing change reaches both before it is answered; a
worker killed mid-answer is replaced, its clients' connections close (none hangs) and its
requests in flight are recorded as failed; stopping the controller stops its worker."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.integration.harness import LONG_PROMPT, SHORT_PROMPT, ControllerProc, start_controller

MODEL = "llama-3-70b"


@pytest.fixture(scope="module")
def ctl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControllerProc]:
    c = start_controller(tmp_path_factory.mktemp("workers"), {
        "controller": {"data_workers": 2}})
    try:
        c.wait(lambda: len(workers(c)) == 1, 30, "the router worker to connect")
        yield c
    finally:
        c.stop()


def workers(ctl: ControllerProc) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = ctl.get("/cluster")["router_workers"]
    return out


def body(i: int, stream: bool, long: bool = True, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": f"{i} {LONG_PROMPT if long else SHORT_PROMPT}",
            "max_tokens": 8, "stream": stream, **extra}


async def _one(url: str, payload: dict[str, Any], rid: str, timeout_s: float
               ) -> tuple[int | None, str]:
    """One request on a connection of its own: (status, body), or (None, the error)."""
    async with httpx.AsyncClient(timeout=timeout_s) as c:
        try:
            r = await c.post(f"{url}/v1/completions", json=payload,
                             headers={"x-request-id": rid})
            return r.status_code, r.text
        except httpx.TimeoutException:
            raise
        except httpx.HTTPError as exc:
            return None, f"{type(exc).__name__}: {exc}"


def send_all(url: str, payloads: list[dict[str, Any]], timeout_s: float = 60.0
             ) -> list[tuple[str, int | None, str]]:
    """Every payload at once, each on a connection of its own: (request id, status, body)."""
    rids = [f"w-{uuid.uuid4().hex[:12]}" for _ in payloads]

    async def main() -> list[tuple[int | None, str]]:
        return await asyncio.gather(*(_one(url, p, r, timeout_s)
                                      for p, r in zip(payloads, rids, strict=True)))
    return [(r, *res) for r, res in zip(rids, asyncio.run(main()), strict=True)]


def metric_sum(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))


def test_both_processes_serve_and_the_controller_records_every_request(
        ctl: ControllerProc) -> None:
    [worker] = workers(ctl)
    before = ctl.get("/stats", window_s=3600)["requests"]
    arrived0 = worker["arrived"]
    total0 = metric_sum(ctl.metrics_text(), "pdctl_requests_total")
    payloads = [body(i, stream=i % 2 == 0, long=i % 3 != 0) for i in range(60)]
    sent = send_all(ctl.url, payloads)
    assert all(status == 200 for _, status, _ in sent), [s for s in sent if s[1] != 200][:3]
    # The worker took some of the connections, the controller's own process the rest.
    [worker] = workers(ctl)
    by_worker = worker["arrived"] - arrived0
    assert 0 < by_worker < 60, by_worker
    # Read at once: every record is there, whichever process served it.
    for rid, _, _ in sent:
        rec = ctl.get(f"/requests/{rid}")
        assert rec["status"] == "ok", rec
    assert ctl.get("/stats", window_s=3600)["requests"] == before + 60
    assert metric_sum(ctl.metrics_text(), "pdctl_requests_total") == total0 + 60


def test_the_control_api_answers_alike_on_every_connection(ctl: ControllerProc) -> None:
    """Same status and same framing from either process: a relayed answer keeps the
    controller's Content-Length (a client reading by length must not meet chunking)."""
    def framing(r: httpx.Response) -> tuple[int, bool]:
        length = r.headers.get("content-length")
        return r.status_code, (length == str(len(r.content))
                               and "transfer-encoding" not in r.headers)

    async def main() -> list[tuple[tuple[int, bool], ...]]:
        async def one() -> tuple[tuple[int, bool], ...]:
            async with httpx.AsyncClient(timeout=30) as c:  # a connection of its own
                ok = await c.get(f"{ctl.url}/api/v1/cluster",
                                 headers={"Authorization": f"Bearer {ctl.token}"})
                refused = await c.get(f"{ctl.url}/api/v1/cluster")
                models = await c.get(f"{ctl.url}/v1/models")
                return framing(ok), framing(refused), framing(models)
        return await asyncio.gather(*(one() for _ in range(30)))
    assert set(asyncio.run(main())) == {((200, True), (401, True), (200, True))}


def test_a_routing_change_reaches_every_process_before_its_answer(ctl: ControllerProc
                                                                  ) -> None:
    r = ctl.api("PATCH", "/routing", {"disagg_min_prompt_tokens": 100_000})
    assert r.status_code == 200, r.text
    try:
        sent = send_all(ctl.url, [body(i, stream=False) for i in range(24)])
        paths = {ctl.get(f"/requests/{rid}")["path"] for rid, _, _ in sent}
        assert paths == {"colocated"}
    finally:
        r = ctl.api("PATCH", "/routing", {"disagg_min_prompt_tokens": 256})
        assert r.status_code == 200, r.text
    sent = send_all(ctl.url, [body(i, stream=False) for i in range(24)])
    assert {ctl.get(f"/requests/{rid}")["path"] for rid, _, _ in sent} == {"disaggregated"}


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "hung"])
def test_a_dead_or_hung_worker_is_replaced_and_its_requests_end_cleanly(
        ctl: ControllerProc, how: signal.Signals) -> None:
    """Killed, or stopped (hung: its event loop stuck) until the controller, hearing nothing
    from it for ``pool.HUNG_S``, kills it."""
    [worker] = workers(ctl)
    payloads = [body(i, stream=i % 2 == 0, max_tokens=400, ignore_eos=True)
                for i in range(24)]

    async def main() -> list[tuple[str, int | None, str]]:
        rids = [f"k-{uuid.uuid4().hex[:12]}" for _ in payloads]
        tasks = [asyncio.create_task(_one(ctl.url, p, rid, 60.0))
                 for p, rid in zip(payloads, rids, strict=True)]
        # Kill the worker once it has requests in flight (the controller has its count).
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            w = await asyncio.to_thread(workers, ctl)
            if w and w[0]["inflight"] >= 2:
                break
        os.kill(worker["pid"], how)
        done = await asyncio.gather(*tasks)  # a hang would raise the client's timeout
        return [(rid, *res) for rid, res in zip(rids, done, strict=True)]

    sent = asyncio.run(main())
    ctl.wait(lambda: [w["pid"] for w in workers(ctl)] not in ([], [worker["pid"]]), 30,
             "the worker to be replaced")
    [event] = [e for e in ctl.get("/events", kind="worker.exit", limit=100)
               if e["after"]["pid"] == worker["pid"]]
    lost = event["after"]["requests_in_flight"]
    assert lost >= 1, event
    if how is signal.SIGSTOP:
        assert "(hung): killed" in event["after"]["reason"], event
    # Each request the controller took is recorded: served, or failed with the worker.
    records = {}
    for rid, status, _ in sent:
        r = ctl.api("GET", f"/requests/{rid}")
        if r.status_code == 200:
            records[rid] = r.json()
        else:  # never read by any process: it was in the dead worker's accept queue
            assert status is None, (rid, status)
    failed = [r for r in records.values() if r["status"] == "error"]
    assert len(failed) == lost, failed
    assert all(f"pid {worker['pid']}) ended" in str(r["error"]) for r in failed), failed
    for rid, status, text in sent:
        complete = status == 200 and (text.rstrip().endswith("data: [DONE]")
                                      or '"usage"' in text)
        if records.get(rid, {}).get("status") == "ok":
            assert complete, text[-200:]
        else:  # lost with the worker: the client saw its connection close, never a hang
            assert not complete, (rid, status, text[-200:])
    # The replacement serves.
    again = send_all(ctl.url, [body(i, stream=False) for i in range(20)])
    assert all(status == 200 for _, status, _ in again), again


def test_stopping_the_controller_stops_its_worker(tmp_path: Path) -> None:
    c = start_controller(tmp_path, {"controller": {"data_workers": 2}})
    try:
        c.wait(lambda: len(workers(c)) == 1, 30, "the router worker to connect")
        [worker] = workers(c)
        assert psutil.pid_exists(worker["pid"])
    finally:
        assert c.stop() == 0
    assert not psutil.pid_exists(worker["pid"]) or psutil.Process(worker["pid"]).status() \
        == psutil.STATUS_ZOMBIE
