"""Router workers' pure parts: values on the channel, the merged ``/metrics``, the routing
table's view of the other processes' load, and the hub's bookkeeping of a worker's
requests (recorded when it reports them; failed when it dies first)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from prometheus_client import Counter, Histogram, generate_latest

from controller.config import RoutingSettings
from controller.metrics import Merged, Metrics, samples_of
from controller.models import Instance, InstanceState, RequestPath, RequestRecord, Role
from controller.requests_log import RequestLog
from controller.router.table import RoutingTable
from controller.store import Store
from controller.workers.channel import (
    frame,
    instance_from,
    instance_wire,
    read_message,
    record_from,
    record_wire,
)
from controller.workers.hub import Link, WorkerHub


def inst(i: str, role: Role = Role.DECODE) -> Instance:
    return Instance(i, role, 1, f"http://127.0.0.1:{9000 + len(i)}", InstanceState.READY,
                    accelerators=(0, 1), slots=(0,), kv_peer={"engine_id": "e"})


def test_an_instance_and_a_record_cross_the_channel_unchanged() -> None:
    a = inst("decode-1")
    a.handle = SimpleNamespace(kv_events=("tcp://127.0.0.1:1", "tcp://127.0.0.1:2"))
    msg = asyncio.run(_roundtrip({"t": "members", "i": [instance_wire(a)]}))
    back, events = instance_from(msg["i"][0])
    a.handle = None
    assert back == a and events == ("tcp://127.0.0.1:1", "tcp://127.0.0.1:2")
    rec = RequestRecord("r1", 1.5, "/v1/completions", RequestPath.DISAGGREGATED, "ok", True,
                        10, 4, "prefill-1", "decode-1", ttft_ms=3.0, cached_tokens=None)
    got = asyncio.run(_roundtrip({"t": "events", "e": [["r", record_wire(rec)]]}))
    assert record_from(got["e"][0][1]) == rec


async def _roundtrip(msg: dict[str, Any]) -> dict[str, Any]:
    reader = asyncio.StreamReader()
    reader.feed_data(frame(msg))
    return await read_message(reader)


def test_metrics_add_up_over_the_processes() -> None:
    brain, worker = Metrics("m"), Metrics("m")
    for m, n in ((brain, 2), (worker, 3)):
        for _ in range(n):
            m.requests.labels("disaggregated", "ok").inc()
            m.ttft.labels("disaggregated").observe(0.05)
    worker.requests.labels("colocated", "error").inc()  # a label set only the worker saw
    text = generate_latest(Merged(brain.registry, samples_of(worker.registry)))  # type: ignore[arg-type]
    lines = text.decode().splitlines()
    assert 'pdctl_requests_total{path="disaggregated",status="ok"} 5.0' in lines
    assert 'pdctl_requests_total{path="colocated",status="error"} 1.0' in lines
    assert 'pdctl_ttft_seconds_count{path="disaggregated"} 5.0' in lines


def test_worker_samples_leave_out_creation_times() -> None:
    m = Metrics("m")
    m.requests.labels("colocated", "ok").inc()
    names = {s[0] for rows in samples_of(m.registry).values() for s in rows}
    assert "pdctl_requests_total" in names and not any(n.endswith("_created") for n in names)
    assert isinstance(m.requests, Counter) and isinstance(m.ttft, Histogram)


def table(tmp_path: Path, **routing: Any) -> RoutingTable:
    t = RoutingTable(RoutingSettings(**routing), Store(tmp_path / "s.db"), lambda: 100.0)
    t.set_members(Role.DECODE, [inst("decode-1"), inst("decode-2")])
    return t


def test_least_loaded_weighs_the_other_processes_requests(tmp_path: Path) -> None:
    t = table(tmp_path, decode_policy="least_loaded")
    mine = t.lease(t.ready(Role.DECODE)[0])  # decode-1: 1 here
    t.others.inflight = {"decode-2": 3}  # decode-2: 3 in the other processes
    picked = t.pick(Role.DECODE, set())
    assert picked is not None and picked.id == "decode-1"
    assert t.inflight("decode-2") == 3 and t.inflight("decode-1") == 1
    mine.release()


def test_the_per_instance_cap_counts_every_process(tmp_path: Path) -> None:
    t = table(tmp_path, max_inflight_per_instance=2)
    t.others.inflight = {"decode-1": 2, "decode-2": 1}
    picked = t.pick(Role.DECODE, set())
    assert picked is not None and picked.id == "decode-2"
    t.others.inflight = {"decode-1": 2, "decode-2": 2}
    assert t.pick(Role.DECODE, set()) is None and t.full(Role.DECODE)


def test_handles_out_and_queued_tokens_count_every_process(tmp_path: Path) -> None:
    t = table(tmp_path)
    t.handle_out("prefill-1", "r1", 30.0)
    t.others.handles = {"prefill-1": 2}
    t.others.tokens = {"decode-1": 500}
    assert t.handles_out("prefill-1") == 3 and t.queued_tokens("decode-1") == 500
    assert t.own_load()[2] == {"prefill-1": 1}  # what a worker reports is its own only


def test_a_workers_table_takes_the_controllers_settings(tmp_path: Path) -> None:
    t = RoutingTable(RoutingSettings(), None, lambda: 0.0)
    t.mirror(RoutingSettings(decode_policy="least_loaded", disagg_min_prompt_tokens=9))
    assert t.settings.disagg_min_prompt_tokens == 9
    assert type(t.policy(Role.DECODE)).__name__ == "LeastLoaded"


class _Writer:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def is_closing(self) -> bool:
        return False

    def write(self, data: bytes) -> None:
        self.sent.append(data)


def hub(tmp_path: Path) -> tuple[WorkerHub, Any]:
    t = table(tmp_path)
    rates = SimpleNamespace(seen=[], observe=lambda rec: rates.seen.append(rec.id))
    st = SimpleNamespace(
        table=t, requests=RequestLog(100), metrics=Metrics("m"), fallback=None,
        proxy=SimpleNamespace(rates=rates, targets=lambda: (1.0, 2.0), inflight=0,
                              others_inflight=0),
        fleet=SimpleNamespace(registry=SimpleNamespace(live=lambda: [])))
    return WorkerHub(st), st


def test_a_workers_requests_are_recorded_or_failed_with_it(tmp_path: Path) -> None:
    h, st = hub(tmp_path)
    link = Link(1, 4242, _Writer())  # type: ignore[arg-type]
    done = RequestRecord("r1", 1.0, "/v1/completions", RequestPath.COLOCATED, "ok", False,
                         5, 2, None, "decode-1")
    for ev in (["a", "r1", 1.0, "/v1/completions", False, 5],
               ["a", "r2", 2.0, "/v1/chat/completions", True, 7],
               ["a", "r1", 3.0, "/v1/completions", False, 6],  # a client's id, sent twice
               ["s", "r2", "decode-2", "prefill-1", 7, 7],  # its decode hop, with KV
               ["r", record_wire(done)]):
        h._event(link, ev)
    assert [r.id for r in st.requests.recent(10)] == ["r1"] and st.proxy.rates.seen == ["r1"]
    assert link.unfinished == 2
    h._lost(link, "killed")
    lost = {r.prompt_tokens: r for r in st.requests.recent(10) if r.status == "error"}
    assert sorted(lost) == [6, 7] and lost[7].id == "r2" and lost[6].id == "r1"
    assert lost[7].stream and "pid 4242" in str(lost[7].error)
    # Where each went, as far as the worker told: r2 had its decode hop, the second r1 not.
    assert (lost[7].path, lost[7].prefill_instance, lost[7].decode_instance) == (
        RequestPath.DISAGGREGATED, "prefill-1", "decode-2")
    assert (lost[6].path, lost[6].prefill_instance, lost[6].decode_instance) == (
        RequestPath.COLOCATED, None, None)
    assert h.last_lost[1] == 2 and h.lost == 2 and link.unfinished == 0


def test_the_brain_counts_a_workers_load_and_a_member_leaving_as_busy(tmp_path: Path
                                                                        ) -> None:
    h, st = hub(tmp_path)
    link = Link(1, 1, _Writer())  # type: ignore[arg-type]
    h.links[1] = link
    h._take(link, {"t": "load", "inflight": {"decode-1": 2}, "tokens": {}, "handles": {},
                   "requests": 2, "arrived": 9, "arrived_tokens": 90, "refused": 1,
                   "prefill_waiting": 0, "seen": h.version})
    assert st.table.inflight("decode-1") == 2 and st.proxy.others_inflight == 2
    # decode-2 leaves the pool (a drain): until the worker says it applied that, the
    # brain counts decode-2 busy on it, so the drain cannot stop it under a new request.
    gone = st.table.ready(Role.DECODE)[1]
    st.fleet.registry.live = lambda: [*st.table.ready(Role.DECODE), gone]
    st.table.set_members(Role.DECODE, [st.table.ready(Role.DECODE)[0]])
    h._recompute()
    assert st.table.inflight("decode-2") == 1
    h._take(link, {"t": "load", "inflight": {"decode-1": 2}, "tokens": {}, "handles": {},
                   "requests": 2, "arrived": 9, "arrived_tokens": 90, "refused": 1,
                   "prefill_waiting": 0, "seen": h.version})
    assert st.table.inflight("decode-2") == 0
