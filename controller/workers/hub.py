"""The brain's end of the router workers' channels (``controller.workers``).

It tells every worker the live routing settings, the service targets, each pool's ready
instances and the instances written off, and every ``LOAD_S`` the load of the rest of the
fleet's router processes. It takes from each worker, in order, what the worker's requests
did -- admissions, decode hops, records, unreachable engines -- and hands those to the
same consumers as the brain's own requests (request log, silent-fallback watch, hand-off
rates, fleet); and the worker's load and metric samples, which the brain's table, admission
and ``/metrics`` add to its own.

A worker whose channel ends with requests admitted and not recorded died with them: each
gets a record with status ``error`` saying so (``lost``), so the fleet's records stay
complete; its metric samples are kept, so counters never go back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controller.metrics import Samples
from controller.models import Instance, RequestPath, RequestRecord, Role
from controller.workers.channel import (
    ChannelClosed,
    frame,
    instance_wire,
    read_message,
    record_from,
)

log = logging.getLogger("pdctl.workers")

LOAD_S = 0.05  # how often the fleet's load is exchanged
MEMBERS_REFRESH_S = 1.0  # how often the members (their live counters) and targets are resent
SYNC_S = 1.0  # the longest a control-API request waits for the workers (``sync``)
# A worker sends something at least every second; one silent this long is not waited for
# (the pool kills it once silent for its ``HUNG_S``).
SILENT_S = 3.0


@dataclass(slots=True)
class Admitted:
    """A worker's request admitted and not yet recorded; where its last decode hop went."""

    rid: str
    started_at: float
    endpoint: str
    stream: bool
    prompt_tokens: int
    decode: str | None = None
    prefill: str | None = None


@dataclass
class Link:
    """One connected worker."""

    index: int
    pid: int
    writer: asyncio.StreamWriter
    inflight: dict[str, int] = field(default_factory=dict)
    tokens: dict[str, int] = field(default_factory=dict)
    handles: dict[str, int] = field(default_factory=dict)
    requests: int = 0  # admitted client requests in flight
    arrived: int = 0
    arrived_tokens: int = 0
    refused: int = 0
    prefill_waiting: int = 0
    seen: int = 0  # the members version it has applied
    heard: float = field(default_factory=time.monotonic)  # its last message, at least 1/s
    samples: Samples = field(default_factory=dict)
    # Admitted, not yet recorded, by request id (a client may send one id twice).
    open: dict[str, list[Admitted]] = field(default_factory=dict)

    @property
    def unfinished(self) -> int:
        return sum(len(v) for v in self.open.values())

    def finished(self, rid: str) -> None:
        entries = self.open.get(rid)
        if entries:
            entries.pop(0)
            if not entries:
                del self.open[rid]

    def send(self, msg: dict[str, Any]) -> None:
        if not self.writer.is_closing():
            self.writer.write(frame(msg))


class WorkerHub:
    def __init__(self, st: Any) -> None:
        """``st``: the brain's ``AppState``."""
        self.st = st
        self.links: dict[int, Link] = {}
        self.retired: Samples = {}  # the samples of workers gone, kept so counters go on
        self.version = 0  # of the members; a worker reports the one it applied
        self.lost = 0  # requests in flight on workers that died
        self.last_lost: dict[int, int] = {}  # by worker index, for its exit's audit event
        self._syncs = 0
        self._waiting: dict[tuple[int, int], asyncio.Future[None]] = {}
        self._server: asyncio.AbstractServer | None = None
        self._tasks: list[asyncio.Task[None]] = []
        table = st.table
        table.on_change = self._changed
        cut: Callable[[Instance, str], None] | None = table.on_failed

        def failed(inst: Instance, why: str) -> None:
            if cut is not None:
                cut(inst, why)
            self._broadcast({"t": "failed", "id": inst.id, "url": inst.url, "why": why})
        table.on_failed = failed

    # ---- lifecycle --------------------------------------------------------------------

    async def start(self, path: Path) -> None:
        self._server = await asyncio.start_unix_server(self._serve, path=str(path))
        path.chmod(0o600)
        self._tasks = [asyncio.create_task(self._exchange())]

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            self._server.close()
        for link in list(self.links.values()):
            link.writer.close()

    # ---- to the workers ---------------------------------------------------------------

    def _routing(self) -> dict[str, Any]:
        ttft, gap = self.st.proxy.targets()
        return {"t": "routing", "settings": self.st.table.settings.model_dump(mode="json"),
                "targets": [ttft, gap]}

    def _members(self, role: Role) -> dict[str, Any]:
        return {"t": "members", "role": role.value, "version": self.version,
                "instances": [instance_wire(i) for i in self.st.table.ready(role)]}

    def _changed(self, what: str) -> None:
        if what == "routing":
            self._broadcast(self._routing())
            return
        self.version += 1
        self._broadcast(self._members(Role(what)))

    def _broadcast(self, msg: dict[str, Any]) -> None:
        if self.links:
            for link in self.links.values():
                link.send(msg)

    def _snapshot(self, link: Link) -> None:
        link.send(self._routing())
        for role in Role:
            link.send(self._members(role))

    async def _exchange(self) -> None:
        """Every ``LOAD_S``, each worker is told the others' load (the brain's own and the
        other workers'); every ``MEMBERS_REFRESH_S`` the members and targets anew."""
        refreshed = time.monotonic()
        while True:
            await asyncio.sleep(LOAD_S)
            if not self.links:
                continue
            self._push_others()
            if time.monotonic() - refreshed >= MEMBERS_REFRESH_S:
                refreshed = time.monotonic()
                self._broadcast(self._routing())
                for role in Role:
                    self._broadcast(self._members(role))

    def _push_others(self) -> None:
        """Each worker is told the rest of the fleet's load: the brain's own and the other
        workers' (as they last reported it)."""
        own = self.st.table.own_load()
        mine = [own[0], own[1], own[2], self.st.proxy.inflight]
        for link in list(self.links.values()):
            parts = [mine] + [[o.inflight, o.tokens, o.handles, o.requests]
                              for o in self.links.values() if o is not link]
            link.send({"t": "others", "inflight": _sum([p[0] for p in parts]),
                       "tokens": _sum([p[1] for p in parts]),
                       "handles": _sum([p[2] for p in parts]),
                       "requests": sum(p[3] for p in parts)})

    async def sync(self, timeout_s: float = SYNC_S) -> None:
        """Until every worker has sent what it did so far and applied what it was told
        (its answer follows both on the ordered channel), and then has applied the fleet's
        load as of that moment: the control API reads and changes one fleet, and what it
        answered holds in every process for the client's next request (a request seen in
        flight counts against the caps wherever the next one lands). A worker that does not
        answer within ``timeout_s`` is not waited for."""
        if not self.links:
            return
        deadline = time.monotonic() + timeout_s
        await self._round(timeout_s)
        self._push_others()
        await self._round(max(0.0, deadline - time.monotonic()))

    async def _round(self, timeout_s: float) -> None:
        """One ``sync`` message to every worker, and its answers (until ``timeout_s``)."""
        self._syncs += 1
        n = self._syncs
        loop = asyncio.get_running_loop()
        now = time.monotonic()  # one silent this long is likely hung: not waited for
        live = [link for link in self.links.values() if now - link.heard < SILENT_S]
        keys = [(link.index, n) for link in live]
        if not keys:
            return
        for link in live:
            self._waiting[(link.index, n)] = loop.create_future()
            link.send({"t": "sync", "n": n})
        try:
            await asyncio.wait([self._waiting[k] for k in keys], timeout=timeout_s)
        finally:
            for k in keys:
                self._waiting.pop(k, None)

    # ---- from the workers -------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link: Link | None = None
        try:
            hello = await read_message(reader)
            link = Link(int(hello["index"]), int(hello["pid"]), writer)
            old = self.links.get(link.index)
            if old is not None:
                self._lost(old, "replaced")
            self.links[link.index] = link
            self._snapshot(link)
            log.info("router worker %d (pid %d) connected", link.index, link.pid)
            while True:
                self._take(link, await read_message(reader))
        except ChannelClosed:
            pass
        except Exception:
            log.exception("router worker channel failed")
        finally:
            writer.close()
            if link is not None and self.links.get(link.index) is link:
                del self.links[link.index]
                self._lost(link, "its channel ended")
            self._recompute()

    def _take(self, link: Link, msg: dict[str, Any]) -> None:
        link.heard = time.monotonic()
        kind = msg.get("t")
        if kind == "events":
            for ev in msg["e"]:
                self._event(link, ev)
        elif kind == "load":
            link.inflight, link.tokens, link.handles = msg["inflight"], msg["tokens"], \
                msg["handles"]
            link.requests, link.arrived, link.arrived_tokens = msg["requests"], \
                msg["arrived"], msg["arrived_tokens"]
            link.refused, link.prefill_waiting = msg["refused"], msg["prefill_waiting"]
            link.seen = msg["seen"]
            self._recompute()
        elif kind == "metrics":
            link.samples = msg["samples"]
        elif kind == "synced":
            fut = self._waiting.pop((link.index, int(msg["n"])), None)
            if fut is not None and not fut.done():
                fut.set_result(None)

    def _event(self, link: Link, ev: list[Any]) -> None:
        st = self.st
        kind = ev[0]
        if kind == "a":  # admitted: rid, started_at, endpoint, stream, prompt tokens
            link.open.setdefault(ev[1], []).append(Admitted(*ev[1:]))
        elif kind == "r":
            rec = record_from(ev[1])
            link.finished(rec.id)
            self._intake(rec)
        elif kind == "s":  # a decode hop: rid, decode, prefill, prompt tokens, uncached
            entries = link.open.get(ev[1])
            if entries:  # where it went last, for its record should the worker die
                entries[-1].decode, entries[-1].prefill = ev[2], ev[3]
            if st.fallback is not None:
                st.fallback.sent(*ev[1:])
        elif kind == "u":  # unreachable: instance id, error
            inst = next((i for r in Role for i in st.table.ready(r) if i.id == ev[1]), None)
            if inst is not None:
                st.table.report_unreachable(inst, ev[2])

    def _intake(self, rec: RequestRecord) -> None:
        """A worker's finished request, to the consumers the brain's own requests reach
        (its metrics are the worker's samples)."""
        st = self.st
        st.requests.add(rec)
        if st.fallback is not None:
            st.fallback.ended(rec)
        st.proxy.rates.observe(rec)

    def _lost(self, link: Link, why: str) -> None:
        """``link``'s worker is gone: its requests admitted and not recorded failed with it."""
        for name, samples in link.samples.items():
            self.retired.setdefault(name, []).extend(samples)
        link.samples = {}
        unfinished = [e for entries in link.open.values() for e in entries]
        for a in unfinished:
            rec = RequestRecord(  # its path and instances as of its last decode hop
                id=a.rid, started_at=a.started_at, endpoint=a.endpoint,
                path=RequestPath.DISAGGREGATED if a.prefill else RequestPath.COLOCATED,
                status="error", stream=a.stream, prompt_tokens=a.prompt_tokens,
                output_tokens=0, prefill_instance=a.prefill, decode_instance=a.decode,
                e2e_ms=(time.time() - a.started_at) * 1e3,
                error=f"router worker {link.index} (pid {link.pid}) ended while serving it "
                      f"({why}); its client's connection was closed")
            self._intake(rec)
            self.st.metrics.observe(rec)
            self.lost += 1
        self.last_lost[link.index] = len(unfinished)
        if unfinished:
            log.warning("router worker %d (pid %d): %d request(s) in flight lost (%s)",
                        link.index, link.pid, len(unfinished), why)
        link.open = {}

    def _recompute(self) -> None:
        """The workers' load, summed into the brain's table and admission. An instance that
        left a pool counts as busy on a worker that has not yet applied its leaving: a
        drain must not stop an instance a worker may just have given a request."""
        links = list(self.links.values())
        others = self.st.table.others
        others.inflight = _sum([o.inflight for o in links])
        others.tokens = _sum([o.tokens for o in links])
        others.handles = _sum([o.handles for o in links])
        if any(o.seen < self.version for o in links):
            members = {i.id for r in Role for i in self.st.table.ready(r)}
            for inst in self.st.fleet.registry.live():
                if inst.id not in members:
                    others.inflight[inst.id] = max(others.inflight.get(inst.id, 0), 1)
        proxy = self.st.proxy  # the brain's views add these to its own
        proxy.others_inflight = sum(o.requests for o in links)
        proxy.others_waiting = sum(o.prefill_waiting for o in links)
        proxy.others_refused = sum(o.refused for o in links)
        proxy.others_arrived = (sum(o.arrived for o in links),
                                sum(o.arrived_tokens for o in links))

    def samples(self) -> Samples:
        """Every worker's metric samples, the retired ones included, by family."""
        out: Samples = {k: list(v) for k, v in self.retired.items()}
        for link in self.links.values():
            for name, samples in link.samples.items():
                out.setdefault(name, []).extend(samples)
        return out

    def public(self) -> list[dict[str, Any]]:
        return [{"index": o.index, "pid": o.pid, "inflight": o.requests,
                 "arrived": o.arrived} for o in sorted(self.links.values(),
                                                        key=lambda o: o.index)]


def _sum(parts: list[dict[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in parts:
        for k, n in p.items():
            if n:
                out[k] = out.get(k, 0) + n
    return out

