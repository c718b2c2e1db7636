"""The router's prefill queue (``routing.prefill_max_inflight``): requests beyond the cap wait
in the router, first come first served, for a slot on any prefill instance -- one that
becomes ready meanwhile included -- so that a backlog does not stay in one engine's queue
after the pool grows. The wait is the queue part of TTFT; a wait past the timeout is served
colocated; nothing leaks however a wait ends."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from controller.models import Instance, InstanceState, RequestPath, Role
from controller.router.table import Lease, RoutingTable
from tests.unit.fake_engines import (
    Call,
    FakeEngines,
    idle,
    make_proxy,
    make_table,
    prefill_ok,
    serve,
)

LONG = b'{"prompt": "a prompt long enough to go disaggregated", "max_tokens": 2}'


def prefill(table: RoutingTable, n: int) -> None:
    table.set_members(Role.PREFILL, [Instance(f"prefill-{k}", Role.PREFILL, 1,
                                              f"http://prefill-{k}", state=InstanceState.READY)
                                     for k in range(1, n + 1)])


async def test_beyond_the_cap_requests_wait_first_come_first_served(tmp_path: Path) -> None:
    _, table = make_table(tmp_path, routing={"prefill_max_inflight": 1})
    first = await table.prefill_slot(5)
    assert first is not None and table.inflight("prefill-1") == 1
    order: list[str] = []

    async def wait(name: str) -> Lease | None:
        lease = await table.prefill_slot(5)
        order.append(name)
        return lease
    second = asyncio.create_task(wait("second"))
    await asyncio.sleep(0)
    third = asyncio.create_task(wait("third"))
    await asyncio.sleep(0.01)
    assert table.prefill_waiting == 2 and order == []
    first.release()  # the slot goes to the one waiting longest, not to a newcomer
    await asyncio.sleep(0.01)
    assert order == ["second"] and table.inflight("prefill-1") == 1
    newcomer = asyncio.create_task(wait("newcomer"))
    await asyncio.sleep(0.01)
    granted = await second
    assert granted is not None
    granted.release()
    await asyncio.sleep(0.01)
    assert order == ["second", "third"]
    leases = [await third]
    leases[0].release()  # type: ignore[union-attr]
    leases.append(await newcomer)
    leases[1].release()  # type: ignore[union-attr]
    assert idle(table) and table.prefill_waiting == 0


async def test_a_prefill_instance_that_becomes_ready_takes_the_waiting_requests(
        tmp_path: Path) -> None:
    _, table = make_table(tmp_path, routing={"prefill_max_inflight": 2,
                                             "prefill_policy": "least_loaded"})
    held = [await table.prefill_slot(5) for _ in range(2)]
    waiting = [asyncio.create_task(table.prefill_slot(5)) for _ in range(3)]
    await asyncio.sleep(0.01)
    assert table.prefill_waiting == 3
    prefill(table, 2)  # the pool grew: prefill-2 takes two of them at once
    await asyncio.sleep(0.01)
    done = [t for t in waiting if t.done()]
    assert len(done) == 2 and {t.result().instance.id for t in done} == {"prefill-2"}  # type: ignore[union-attr]
    assert table.prefill_waiting == 1
    table.update({"prefill_max_inflight": 3}, "test")  # a higher cap frees a slot too
    await asyncio.sleep(0.01)
    assert all(t.done() for t in waiting)
    for lease in [*held, *(t.result() for t in waiting)]:
        assert lease is not None
        lease.release()
    assert idle(table)


async def test_a_wait_that_times_out_or_is_cancelled_leaves_nothing_behind(
        tmp_path: Path) -> None:
    _, table = make_table(tmp_path, routing={"prefill_max_inflight": 1})
    held = await table.prefill_slot(5)
    assert await table.prefill_slot(0.05) is None  # timed out
    assert table.prefill_waiting == 0
    gone = asyncio.create_task(table.prefill_slot(5))
    await asyncio.sleep(0.01)
    assert held is not None
    held.release()  # granted to ``gone`` ...
    gone.cancel()  # ... which is cancelled before it runs: the lease is passed on
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert idle(table) and table.prefill_waiting == 0
    _, empty = make_table(tmp_path / "none", prefill=0, routing={"prefill_max_inflight": 1})
    assert await empty.prefill_slot(5) is None  # no prefill instance: no wait at all


async def test_the_wait_is_the_queue_part_and_the_backlog_moves_to_a_new_instance(
        tmp_path: Path) -> None:
    release = asyncio.Event()

    async def slow_prefill(call: Call) -> object:
        await release.wait()
        return await prefill_ok(call)
    engines = FakeEngines(behaviour={"prefill-1": slow_prefill})  # type: ignore[dict-item]
    proxy, table = make_proxy(tmp_path, engines, routing={"prefill_max_inflight": 1})
    busy = asyncio.create_task(serve(proxy, LONG))
    await asyncio.sleep(0.01)
    queued = asyncio.create_task(serve(proxy, LONG))
    await asyncio.sleep(0.2)
    assert table.prefill_waiting == 1 and not queued.done()
    prefill(table, 2)  # a scale-up: the waiting request goes to the new instance at once
    served = await queued
    assert served.status == 200 and served.record.path is RequestPath.DISAGGREGATED
    assert served.record.prefill_instance == "prefill-2"
    assert served.record.queue_ms >= 150, served.record  # its wait in the router
    release.set()
    assert (await busy).record.prefill_instance == "prefill-1"
    assert idle(table)


async def test_a_request_that_waits_too_long_is_served_colocated(tmp_path: Path) -> None:
    release = asyncio.Event()

    async def stuck(call: Call) -> object:
        await release.wait()
        return await prefill_ok(call)
    engines = FakeEngines(behaviour={"prefill-1": stuck})  # type: ignore[dict-item]
    proxy, table = make_proxy(tmp_path, engines, routing={"prefill_max_inflight": 1,
                                                          "prefill_queue_timeout_s": 0.1})
    busy = asyncio.create_task(serve(proxy, LONG))
    await asyncio.sleep(0.01)
    served = await serve(proxy, LONG)
    assert served.status == 200 and served.record.path is RequestPath.COLOCATED
    assert served.record.queue_ms >= 100
    assert [c.host for c in engines.attempts if c.host.startswith("prefill")] == ["prefill-1"]
    release.set()
    await busy
    assert idle(table)
