"""A scriptable ``Upstream`` for router tests: per-instance behaviour, every delivered request
recorded with its body, and the proxy wired to a routing table of ready fake instances."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from controller.config import load_settings
from controller.metrics import Metrics
from controller.models import Instance, InstanceState, RequestRecord, Role
from controller.requests_log import RequestLog
from controller.router.answer import Buffered
from controller.router.proxy import Proxy
from controller.router.request import Ctx
from controller.router.table import RoutingTable
from controller.router.upstream import UpstreamError, UpstreamReply
from controller.store import Store
from controller.tokens import EstimatingCounter

KV = {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": "p-engine",
      "remote_request_id": "handle-1", "remote_block_ids": [[1, 2]],
      "remote_host": "127.0.0.1", "remote_port": 5600, "tp_size": 1}


class Answer(Buffered):
    """A ``Stream`` over a fixed JSON body: the router's own whole-answer ``Stream``."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(status, "application/json", json.dumps(body).encode())


@dataclass
class Call:
    host: str  # the instance id (fake URLs are http://<id>)
    path: str
    body: dict[str, Any]
    resend: bool

    @property
    def kv(self) -> dict[str, Any] | None:
        kv = self.body.get("kv_transfer_params")
        return kv if isinstance(kv, dict) else None

    @property
    def is_release(self) -> bool:
        return self.body.get("max_tokens") == -1


Behaviour = Callable[[Call], Awaitable[Answer]]


async def prefill_ok(call: Call) -> Answer:
    return Answer(200, {"choices": [{"text": "x"}], "kv_transfer_params": KV,
                        "usage": {"prompt_tokens": 10, "completion_tokens": 1}})


async def decode_ok(call: Call) -> Answer:
    if call.is_release:
        return Answer(400, {"error": {"message": "max_tokens must be at least 1"}})
    return Answer(200, {"choices": [{"text": "ok"}],
                        "usage": {"prompt_tokens": 10, "completion_tokens": 2}})


async def died(call: Call) -> Answer:
    raise UpstreamError("connection closed before the response was complete", sent=True)


async def refused(call: Call) -> Answer:
    raise UpstreamError("connect to x failed: Connection refused", sent=False)


async def answers_503(call: Call) -> Answer:
    return Answer(503, {"error": {"message": "engine dead"}})


@dataclass
class FakeEngines:
    """``Upstream`` whose instances behave as scripted; ``calls`` are the requests that
    reached an engine (a refused connection is not one)."""

    behaviour: dict[str, Behaviour] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    attempts: list[Call] = field(default_factory=list)
    # Per instance: connecting to it waits for the event (nothing is written before it is set).
    connecting: dict[str, asyncio.Event] = field(default_factory=dict)
    closed: str | None = None  # Upstream.closed: never shutting down here

    def _call(self, url: str, payload: bytes, resend: bool) -> Call:
        u = httpx.URL(url)
        return Call(u.host, u.path, json.loads(payload), resend)

    async def _run(self, url: str, payload: bytes, resend: bool,
                   on_sent: Callable[[], None] | None = None) -> Answer:
        call = self._call(url, payload, resend)
        self.attempts.append(call)
        if call.host in self.connecting:
            await self.connecting[call.host].wait()
        if on_sent is not None:
            on_sent()
        how = self.behaviour.get(call.host) or (
            prefill_ok if call.host.startswith("prefill") else decode_ok)
        try:
            answer = await how(call)
        except UpstreamError as exc:
            if exc.sent:
                self.calls.append(call)
            raise
        self.calls.append(call)
        return answer

    async def post(self, url: str, payload: bytes, headers: Mapping[str, str],
                   resend: bool = True) -> UpstreamReply:
        a = await self._run(url, payload, resend)
        return UpstreamReply(a.status, await a.read())

    async def open(self, url: str, payload: bytes, headers: Mapping[str, str],
                   resend: bool = True, on_sent: Callable[[], None] | None = None) -> Answer:
        return await self._run(url, payload, resend, on_sent)

    async def close(self) -> None:
        pass

    def kv_deliveries(self) -> list[Call]:
        """Decode-side requests that carried the prefill's handle, releases included."""
        return [c for c in self.calls
                if c.host.startswith("decode") and c.kv and c.kv.get("do_remote_prefill")]


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def make_table(tmp_path: Path, prefill: int = 1, decode: int = 2, clock: Clock | None = None,
               **settings: Any) -> tuple[Any, RoutingTable]:
    """Settings and a routing table whose pools are ``prefill``/``decode`` ready instances
    (``prefill-1``..., ``decode-1``...) at ``http://<id>``."""
    routing = {"disagg_min_prompt_tokens": 4, "decode_policy": "round_robin",
               **settings.pop("routing", {})}
    s = load_settings(None, controller={"state_dir": tmp_path}, routing=routing, **settings)
    table = RoutingTable(s.routing, Store(tmp_path / "s.db"), clock or Clock())
    for role, n in ((Role.PREFILL, prefill), (Role.DECODE, decode)):
        table.set_members(role, [Instance(f"{role.value}-{k}", role, 1,
                                          f"http://{role.value}-{k}", state=InstanceState.READY)
                                 for k in range(1, n + 1)])
    return s, table


def make_proxy(tmp_path: Path, engines: Any, prefill: int = 1, decode: int = 2,
               clock: Clock | None = None, **settings: Any) -> tuple[Proxy, RoutingTable]:
    clock = clock or Clock()
    s, table = make_table(tmp_path, prefill, decode, clock, **settings)
    proxy = Proxy(s, table, engines, EstimatingCounter(), RequestLog(100), Metrics(),
                  clock=clock)
    return proxy, table


def idle(table: RoutingTable) -> bool:
    """No instance counts a request in flight."""
    return all(table.inflight(i.id) == 0 for r in Role for i in table.ready(r))


@dataclass
class Served:
    """One request served through ``Proxy.serve`` as the data plane would: what the client
    got, and the record."""

    status: int
    body: bytes
    ctx: Ctx
    record: RequestRecord


async def serve(proxy: Proxy, raw: bytes, endpoint: str = "/v1/completions") -> Served:
    ctx = proxy.new_ctx(endpoint, raw, None)
    out: list[bytes] = []

    async def write(chunk: bytes, more: bool) -> None:
        out.append(chunk)

    async with proxy.serve(ctx) as answer:
        if answer.body is not None:
            out.append(answer.body)
        else:
            await answer.relay(write)
    [rec] = proxy.requests.recent(1)
    assert rec.id == ctx.rid
    return Served(answer.status, b"".join(out), ctx, rec)


async def settle(proxy: Proxy) -> None:
    """Let the proxy's background releases finish."""
    for _ in range(50):
        if not proxy._background:
            return
        await asyncio.sleep(0.01)
