"""Fault scenario: the path between the controller and one engine is cut (issue 31).

A TCP relay stands between the controller and one decode engine (attached as an external
engine); cutting it is a network partition: nothing passes either way, open connections stay
open, new ones are accepted and never answered -- the engine itself is fine. From the
client's side: every request completes or gets a clear error, none waits out its timeout
(the router's read timeout is 600 s; once the controller fails the instance it ends the
connections to it); the controller records why it failed the instance and, once the path is
mended, serves through the engine again; every request is in its records.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from tests.integration.harness import Load, free_port, sim_engine, start_controller, wait_healthy

pytestmark = pytest.mark.slow


class CutPath:
    """A TCP relay to ``127.0.0.1:target``; ``cut`` holds everything either way (connections
    open, bytes undelivered, new connections accepted and not relayed) until ``mend``."""

    def __init__(self, target: int) -> None:
        self.target, self.port = target, free_port()
        self.open = threading.Event()
        self.open.set()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._ready.wait(10)

    def cut(self) -> None:
        self.open.clear()

    def mend(self) -> None:
        self.open.set()

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        loop = self._loop
        asyncio.set_event_loop(loop)
        server = loop.run_until_complete(
            asyncio.start_server(self._relay, "127.0.0.1", self.port))
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            server.close()
            tasks = asyncio.all_tasks(loop)
            for task in tasks:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.run_until_complete(server.wait_closed())
            loop.close()

    async def _passable(self) -> None:
        while not self.open.is_set():
            await asyncio.sleep(0.05)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._passable()
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.close()
            return
        try:
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer),
                                 return_exceptions=True)
        finally:
            for w in (writer, up_writer):
                w.transport.abort()

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                await self._passable()
                dst.write(data)
                await dst.drain()
        finally:
            dst.close()


def test_a_cut_path_fails_its_instance_ends_its_requests_and_heals(tmp_path: Path) -> None:
    pp, d1, d2 = free_port(), free_port(), free_port()
    engines = [sim_engine(pp, "prefill"), sim_engine(d1, "decode"), sim_engine(d2, "decode")]
    path = CutPath(d1)
    cut_url = f"http://127.0.0.1:{path.port}"
    ctl = None
    try:
        for port in (pp, d1, d2):
            wait_healthy(f"http://127.0.0.1:{port}")
        ctl = start_controller(tmp_path, {"backend": "external", "controller": {
            "health_timeout_s": 1.0, "unhealthy_after": 3}, "pools": {
            "prefill": {"urls": [f"http://127.0.0.1:{pp}"], "tp": 2},
            "decode": {"urls": [cut_url, f"http://127.0.0.1:{d2}"], "tp": 2}}})
        [behind] = [i for i in ctl.get("/instances?role=decode") if i["url"] == cut_url]
        with Load(ctl.url, workers=6, max_tokens=48, timeout_s=60) as load:
            ctl.wait(lambda: load.result.ok >= 20, 60, "traffic before the cut")
            path.cut()
            cut_at = time.monotonic()
            # Requests go on being sent to the engine until the controller fails it: some
            # wait on it (else the test would prove nothing).
            ctl.wait(lambda: load.oldest_s() >= 2.0, 10, "a request to wait on the cut path")
            ctl.wait(lambda: bool(ctl.get("/events?kind=instance.failed&limit=5")), 30,
                     "the controller to fail the instance it cannot reach")
            failed_after = time.monotonic() - cut_at
            # Still cut: the requests that were waiting on the engine end now, not when the
            # path comes back (or the 600 s read timeout runs out).
            ctl.wait(lambda: load.oldest_s() < 4.0, 10, "the requests caught by the cut to end")
            path.mend()
            ctl.wait(lambda: any(i["url"] == cut_url and i["state"] == "ready"
                                 for i in ctl.get("/instances?role=decode")), 60,
                     "the instance behind the mended path to serve again")
            served = load.result.ok
            ctl.wait(lambda: load.result.ok >= served + 30, 60, "traffic after the mend")
            res = load.stop()
        # The client's side: an HTTP error or an error event, never a wait to its timeout.
        unclear = [f for f in res.failures
                   if not f[:3].isdigit() and not f.startswith("error event")]
        assert unclear == [], unclear[:5]
        assert len(res.failures) <= 12, res.failures
        [failed] = ctl.get("/events?kind=instance.failed&limit=5")
        assert failed["target"] == behind["id"] and "failed health checks" in failed["detail"]
        assert failed_after < 15, failed_after
        # Served through it again after the mend, under a new instance id.
        [again] = [i for i in ctl.get("/instances?role=decode")
                   if i["url"] == cut_url and i["state"] == "ready"]
        assert again["id"] != behind["id"]
        records = ctl.get("/requests?limit=5000")
        assert any(r["decode_instance"] == again["id"] for r in records)
        # Every request the clients sent is in the controller's records.
        assert len(records) == res.ok + len(res.failures), (len(records), res.ok,
                                                            len(res.failures))
    finally:
        path.mend()
        if ctl is not None:
            ctl.stop()
        path.close()
        for proc in engines:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=30)
