"""A router worker process: ``python -m controller.workers.worker`` (started by the
controller's ``WorkerPool``, never by hand).

It listens on the controller's address beside it (``SO_REUSEPORT``) and serves the OpenAI
inference routes with the same ``DataPlane`` and ``Proxy`` as the controller, on a routing
table the controller feeds (``BrainLink``); every other path is relayed to the controller
(``relay``). It ends -- after its requests in flight, as the controller does -- on SIGTERM
or when the controller's channel closes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from controller.api.data import DataPlane, WireLane
from controller.api.listener import (
    ControllerServer,
    end_requests,
    event_loop_factory,
    raise_fd_limit,
    server_config,
)
from controller.config import RoutingSettings, Settings
from controller.kvevents.hub import KvEventsHub
from controller.metrics import Metrics, samples_of
from controller.models import Instance, RequestRecord, Role
from controller.obs.logs import setup_logging
from controller.router.h1 import H1Upstream
from controller.router.proxy import Proxy
from controller.router.request import Ctx
from controller.router.table import RoutingTable
from controller.router.tracing import RequestTracer
from controller.signals import clean_stop_signals
from controller.tokens import make_counter
from controller.workers.channel import (
    ChannelClosed,
    frame,
    instance_from,
    read_message,
    record_wire,
)
from controller.workers.relay import Relay
from controller.workers.sockets import listen_socket

log = logging.getLogger("pdctl.workers")

FLUSH_S = 0.02  # how long events wait to go to the controller in one batch
METRICS_S = 1.0  # also its heartbeat: silent for the pool's HUNG_S, it is killed
SETTINGS_ENV = "PDCTL_WORKER_SETTINGS"


class BrainLink:
    """The worker's end of the channel: what its requests did goes to the controller in
    batches (a ``RecordSink`` and ``HopWatch`` for the proxy); what the controller says is
    applied to the worker's table, proxy and upstream."""

    proxy: Proxy  # set once the proxy is built with this link as its sinks

    def __init__(self, index: int, table: RoutingTable, upstream: H1Upstream,
                 metrics: Metrics, kv: KvEventsHub | None) -> None:
        self.index = index
        self.table, self.upstream = table, upstream
        self.metrics, self.kv = metrics, kv
        self.events: list[list[Any]] = []
        self.seen = 0
        self.ready = asyncio.Event()  # routing settings and both pools received
        self._roles: set[str] = set()
        self._writer: asyncio.StreamWriter | None = None
        self._last_load: Any = None
        self.closed = asyncio.Event()

    # ---- the proxy's sinks ----------------------------------------------------------

    def admit(self, ctx: Ctx) -> None:
        self.events.append(["a", ctx.rid, ctx.started_at, ctx.endpoint, ctx.stream,
                            ctx.prompt_tokens])

    def add(self, record: RequestRecord) -> None:
        self.events.append(["r", record_wire(record)])

    def sent(self, rid: str, decode: str, prefill: str | None, prompt_tokens: int,
             uncached: int) -> None:
        self.events.append(["s", rid, decode, prefill, prompt_tokens, uncached])

    def ended(self, rec: RequestRecord) -> None:
        """Told by ``add``'s record (the controller's watch ends it there)."""

    def unreachable(self, inst: Instance, error: str) -> None:
        self.events.append(["u", inst.id, error])

    # ---- the channel ------------------------------------------------------------------

    async def connect(self, path: Path) -> asyncio.StreamReader:
        reader, self._writer = await asyncio.open_unix_connection(str(path))
        self._send({"t": "hello", "index": self.index, "pid": os.getpid()})
        return reader

    def _send(self, msg: dict[str, Any]) -> None:
        if self._writer is not None and not self._writer.is_closing():
            self._writer.write(frame(msg))

    def flush(self) -> None:
        if self.events:
            batch, self.events = self.events, []
            self._send({"t": "events", "e": batch})
        table, proxy = self.table, self.proxy
        inflight, tokens, handles = table.own_load()
        load = {"t": "load", "inflight": inflight, "tokens": tokens, "handles": handles,
                "requests": proxy.inflight, "arrived": proxy.arrived,
                "arrived_tokens": proxy.arrived_prompt_tokens, "refused": proxy.refused_total,
                "prefill_waiting": table.prefill_waiting, "seen": self.seen}
        if load != self._last_load:
            self._last_load = load
            self._send(load)

    async def drain(self) -> None:
        self.flush()
        if self._writer is not None:
            with contextlib.suppress(ConnectionError):
                await self._writer.drain()

    async def send_loop(self) -> None:
        tick = 0
        while True:
            await asyncio.sleep(FLUSH_S)
            self.flush()
            tick += 1
            if tick * FLUSH_S >= METRICS_S:
                tick = 0
                self._send({"t": "metrics", "samples": samples_of(self.metrics.registry)})
            if self._writer is not None:
                with contextlib.suppress(ConnectionError):
                    await self._writer.drain()

    async def receive_loop(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                self.apply(await read_message(reader))
        except ChannelClosed as exc:
            log.warning("router worker %d: the controller's channel closed (%s)",
                        self.index, exc)
        finally:
            self.closed.set()

    def apply(self, msg: dict[str, Any]) -> None:
        kind = msg.get("t")
        if kind == "others":
            others = self.table.others
            others.inflight, others.tokens, others.handles = (
                msg["inflight"], msg["tokens"], msg["handles"])
            self.proxy.others_inflight = msg["requests"]
        elif kind == "members":
            self._members(Role(msg["role"]), msg["instances"])
            self.seen = max(self.seen, int(msg["version"]))
            self._roles.add(msg["role"])
        elif kind == "routing":
            new = RoutingSettings.model_validate(msg["settings"])
            if new != self.table.settings:
                self.table.mirror(new)
            ttft, gap = msg["targets"]
            self.proxy.targets = lambda: (ttft, gap)
            self._roles.add("routing")
        elif kind == "sync":  # after everything sent before it, and the answer last
            self.flush()
            self._send({"t": "metrics", "samples": samples_of(self.metrics.registry)})
            self._send({"t": "synced", "n": msg["n"]})
        elif kind == "failed":
            n = self.upstream.cut(msg["url"], f"{msg['id']} failed: {msg['why']}")
            if msg["url"] and n:
                log.warning("%s failed (%s): its %d open connection(s) ended", msg["id"],
                            msg["why"], n)
        if len(self._roles) == 3:
            self.ready.set()

    def _members(self, role: Role, wire: list[dict[str, Any]]) -> None:
        members: list[Instance] = []
        for d in wire:
            inst, events = instance_from(d)
            members.append(inst)
            if self.kv is not None and events and not self.kv.watched(inst.id):
                self.kv.watch(inst.id, events)
        self.table.set_members(role, members)
        if self.kv is not None:
            ids = {i.id for r in Role for i in self.table.ready(r)}
            for gone in [i for i in self.kv.index.instances() if i not in ids]:
                self.kv.unwatch(gone)


def build(settings: Settings, index: int) -> tuple[Proxy, BrainLink, H1Upstream]:
    table = RoutingTable(settings.routing, None, time.monotonic)
    kv = KvEventsHub(settings.kv_block_size)
    table.index = kv.index
    upstream = H1Upstream(lambda: table.settings.request_timeout_s)
    metrics = Metrics(settings.model.public_name)
    link = BrainLink(index, table, upstream, metrics, kv)
    proxy = link.proxy = Proxy(settings, table, upstream,
                               make_counter(settings.model.path, settings.backend), link,
                               metrics)
    proxy.fallback = link
    proxy.on_admit = link.admit
    table.on_unreachable = link.unreachable
    if settings.controller.otlp_traces_endpoint:
        proxy.tracer = RequestTracer(settings.controller.otlp_traces_endpoint)
    return proxy, link, upstream


async def serve(settings: Settings, index: int, rundir: Path, port: int) -> None:
    proxy, link, upstream = build(settings, index)
    reader = await link.connect(rundir / "workers.sock")
    receiving = asyncio.create_task(link.receive_loop(reader))
    await asyncio.wait([asyncio.create_task(link.ready.wait()), receiving],
                       return_when=asyncio.FIRST_COMPLETED)
    if not link.ready.is_set():
        raise SystemExit(f"router worker {index}: the controller closed the channel")
    cs = settings.controller
    relay = Relay(rundir / "control.sock")
    app = DataPlane(relay, proxy, cs)
    config = server_config(app, cs, WireLane(proxy, cs))
    config.lifespan = "off"
    server = ControllerServer(config, lambda: end_requests(upstream))
    sending = asyncio.create_task(link.send_loop())

    async def stop_with_brain() -> None:
        await link.closed.wait()
        server.should_exit = True
    watching = asyncio.create_task(stop_with_brain())
    sock = listen_socket(cs.host, port)
    try:
        await server.serve(sockets=[sock])
    finally:
        await proxy.close()
        await upstream.close()
        await link.drain()
        for t in (sending, watching, receiving):
            t.cancel()
        await relay.close()
        if link.kv is not None:
            await link.kv.close()
        if proxy.tracer is not None:
            await asyncio.to_thread(proxy.tracer.close)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="controller.workers.worker", description=__doc__)
    p.add_argument("--index", type=int, required=True)
    p.add_argument("--rundir", type=Path, required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--log-level", default="info")
    p.add_argument("--log-format", default="text", choices=("text", "json"))
    args = p.parse_args(argv)
    setup_logging(args.log_level, args.log_format)
    settings = Settings.model_validate(orjson.loads(os.environ[SETTINGS_ENV]))
    raise_fd_limit()
    with clean_stop_signals(), asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        runner.run(serve(settings, args.index, args.rundir, args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
