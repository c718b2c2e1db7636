"""The fleet loop against a fake launcher and fake engines (httpx.MockTransport):
lifecycle transitions, replacement with backoff, validation and the audit log."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from controller.config import load_settings
from controller.errors import InvalidChange
from controller.fleet import Fleet, build_fleet
from controller.fleet.guard import quarantine_s
from controller.fleet.observer import EngineLoad, Probe, count_failures, restart_reason
from controller.launchers.base import Launched, Launcher, LaunchSpec
from controller.models import Instance, InstanceState, Role
from controller.store import Store


class FakeLauncher(Launcher):
    name = "fake"

    def __init__(self) -> None:
        self.started: list[LaunchSpec] = []
        self.stopped: list[str] = []
        self.exited: dict[str, int] = {}
        self.healthy: set[str] = set()

    async def start(self, spec: LaunchSpec) -> Launched:
        self.started.append(spec)
        return Launched(url=f"http://{spec.instance_id}", handle=spec.instance_id)

    async def stop(self, launched: Launched, grace_s: float = 5.0) -> None:
        self.stopped.append(launched.handle)

    def exit_code(self, launched: Launched) -> int | None:
        return self.exited.get(launched.handle)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


Env = tuple[Fleet, FakeLauncher, Clock, Store]


def _get(fleet: Fleet, instance_id: str) -> Instance:
    inst = fleet.registry.get(instance_id)
    assert inst is not None
    return inst


@pytest.fixture
def env(tmp_path: Path) -> Env:
    launcher = FakeLauncher()

    def handler(request: httpx.Request) -> httpx.Response:
        host = request.url.host
        if request.url.path == "/health":
            return httpx.Response(200 if host in launcher.healthy else 503)
        return httpx.Response(200, text=f'vllm:num_requests_running{{m="x"}} {len(host)}\n')

    settings = load_settings(None, controller={"state_dir": tmp_path})
    store = Store(tmp_path / "state.db")
    clock = Clock()
    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return build_fleet(settings, store, launcher, client, clock)[0], launcher, clock, store


async def test_instances_start_then_become_ready(env: Env
                                                 ) -> None:
    fleet, launcher, clock, store = env
    await fleet.tick()
    assert sorted(s.role.value for s in launcher.started) == ["decode", "prefill"]
    assert all(i.state is InstanceState.STARTING for i in fleet.registry)
    assert fleet.ready(Role.DECODE) == []
    launcher.healthy = {s.instance_id for s in launcher.started}
    clock.t += 1
    await fleet.tick()
    assert [i.id for i in fleet.ready(Role.DECODE)] == ["decode-2"]
    assert fleet.pool_view(Role.DECODE)["converged"] is True
    assert {e["kind"] for e in store.events()} >= {"instance.starting", "instance.ready"}
    assert _get(fleet, "prefill-1").accelerators == (0, 1, 2, 3)
    assert _get(fleet, "decode-2").accelerators == (4, 5)


async def _ready_pools(env: Env) -> None:
    fleet, _, _, _ = env
    await fleet.tick()
    await _all_healthy(env)


async def _all_healthy(env: Env) -> None:
    """Every instance started so far answers its health check; a tick a second later."""
    fleet, launcher, clock, _ = env
    launcher.healthy = {s.instance_id for s in launcher.started}
    clock.t += 1
    await fleet.tick()


async def _crash_the_decode(env: Env, status: int) -> Instance:
    """The one ready decode instance exits with ``status``, and a tick observes it."""
    fleet, launcher, _, _ = env
    [d] = fleet.ready(Role.DECODE)
    launcher.exited[d.id] = status
    await fleet.tick()
    return d


async def test_exited_instance_fails_and_is_replaced_after_backoff(
        env: Env) -> None:
    fleet, launcher, clock, store = env
    await _ready_pools(env)
    launcher.exited["prefill-1"] = -9
    await fleet.tick()
    assert _get(fleet, "prefill-1").state is InstanceState.FAILED
    assert fleet.ready(Role.PREFILL) == []
    assert len(launcher.started) == 2  # backoff holds the replacement back
    clock.t += 1.5
    await fleet.tick()
    assert launcher.started[-1].role is Role.PREFILL and len(launcher.started) == 3
    assert "exited with status -9" in (_get(fleet, "prefill-1").last_error or "")


async def test_start_timeout_fails_the_instance(env: Env
                                                ) -> None:
    fleet, launcher, clock, _ = env
    await fleet.tick()
    clock.t += fleet.settings.controller.start_timeout_s + 1
    await fleet.tick()
    assert all(i.state is InstanceState.FAILED for i in fleet.registry)
    assert "not ready after" in (_get(fleet, "decode-2").last_error or "")


async def test_failed_health_checks_fail_a_ready_instance(
        env: Env) -> None:
    fleet, launcher, clock, _ = env
    await _ready_pools(env)
    launcher.healthy.discard("decode-2")
    for _ in range(fleet.settings.controller.unhealthy_after):
        clock.t += fleet.settings.controller.health_interval_s
        await fleet.tick()
    assert _get(fleet, "decode-2").state is InstanceState.FAILED
    await asyncio.sleep(0.01)  # the stop runs as a task
    assert "decode-2" in launcher.stopped


async def test_a_burst_of_router_reports_is_one_early_check_not_a_failure(
        env: Env) -> None:
    """Requests that failed together on one dead engine each report it: one early health
    check, then the usual interval, so its process's exit can be seen first."""
    fleet, launcher, clock, _ = env
    await _ready_pools(env)
    inst = _get(fleet, "decode-2")
    launcher.healthy.discard("decode-2")
    for _ in range(fleet.settings.controller.unhealthy_after + 2):
        fleet.unreachable(inst, "connection reset")
        await fleet.tick()
    assert inst.state is InstanceState.READY and inst.health_failures == 1
    for _ in range(fleet.settings.controller.unhealthy_after - 1):
        clock.t += fleet.settings.controller.health_interval_s
        await fleet.tick()
    assert inst.state is InstanceState.FAILED


async def test_invalid_change_changes_and_records_nothing(
        env: Env) -> None:
    fleet, _, _, store = env
    before = (dict(fleet.targets), len(store.events(1000)), store.get("desired"))
    with pytest.raises(InvalidChange):
        fleet.set_pool(Role.DECODE, 99, None, "test")
    assert (dict(fleet.targets), len(store.events(1000)), store.get("desired")) == before


async def test_drain_then_stop_when_idle(env: Env
                                         ) -> None:
    fleet, launcher, clock, store = env
    await _ready_pools(env)
    inst = fleet.registry.get("decode-2")
    assert inst is not None
    lease = fleet.table.lease(inst)  # a request in flight
    fleet.drain("decode-2", "operator")
    assert fleet.ready(Role.DECODE) == [] and inst.state is InstanceState.DRAINING
    await fleet.tick()
    assert "decode-2" not in launcher.stopped  # still serving its request
    assert launcher.started[-1].role is Role.DECODE  # a replacement is on its way
    lease.release()
    await fleet.tick()
    await fleet.shutdown()
    assert "decode-2" in launcher.stopped
    ev = [e for e in store.events(100) if e["target"] == "decode-2"]
    assert [e["kind"] for e in reversed(ev)][:4] == [
        "instance.starting", "instance.launched", "instance.ready", "instance.draining"]


async def test_a_draining_prefill_stays_while_a_kv_handle_it_gave_out_is_unread(
        env: Env) -> None:
    """Drain respects the lease: a prefill instance with no request in flight but a KV
    handle out (its decode hop has not ended) stays until the request ends, or until the
    handle's lease runs out."""
    fleet, launcher, clock, _ = env
    await _ready_pools(env)
    lease_s = fleet.settings.kv.lease_s
    fleet.table.handle_out("prefill-1", "r1", lease_s)
    fleet.table.handle_out("prefill-1", "r2", lease_s)
    fleet.drain("prefill-1", "operator")
    await fleet.tick()
    assert "prefill-1" not in launcher.stopped and fleet.table.handles_out("prefill-1") == 2
    fleet.table.handle_done("prefill-1", "r1")  # r1's request ended
    await fleet.tick()
    assert "prefill-1" not in launcher.stopped  # r2 may still be read
    clock.t += lease_s  # r2's lease ran out: the engine freed the blocks
    await fleet.tick()
    await fleet.shutdown()
    assert "prefill-1" in launcher.stopped


async def test_pick_avoids_an_instance_just_reported_unreachable(
        env: Env) -> None:
    fleet, _, _, _ = env
    await _ready_pools(env)
    fleet.set_pool(Role.DECODE, 2, None, "test")
    await fleet.tick()
    for i in fleet.registry:
        fleet.registry.transition(i, InstanceState.READY, "test", "forced")
    table = fleet.table
    first = table.ready(Role.DECODE)[0]
    table.report_unreachable(first, "refused")
    picks = {getattr(table.pick(Role.DECODE, set()), "id", None) for _ in range(4)}
    assert picks == {"decode-3"}
    assert table.pick(Role.DECODE, {"decode-3"}) is first  # the only one left
    assert first.last_error == "refused"  # recorded by the registry


async def test_load_is_polled_from_engine_metrics(
        env: Env) -> None:
    fleet, _, _, _ = env
    await _ready_pools(env)
    await fleet.poll_load()
    assert _get(fleet, "decode-2").running == len("decode-2")


async def test_an_engine_restarted_in_place_is_recorded_and_its_handles_voided(
        env: Env) -> None:
    fleet, _, _, store = env
    await _ready_pools(env)
    started = {"prefill-1": 100.0}

    def metrics(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text="process_start_time_seconds "
                              f"{started.get(request.url.host, 50.0)}\n")

    fleet.observer.client = httpx.AsyncClient(transport=httpx.MockTransport(metrics))
    await fleet.poll_load()
    fleet.table.handle_out("prefill-1", "r1", 30.0)
    await fleet.poll_load()
    assert not store.events(kind="instance.restarted")  # the same process
    started["prefill-1"] = 160.0  # a new process answers at the same URL
    await fleet.poll_load()
    [event] = store.events(kind="instance.restarted")
    assert event["target"] == "prefill-1" and "1 KV handle(s) it gave out are void" in \
        event["detail"] and "moved from 100 to 160" in event["detail"]
    inst = _get(fleet, "prefill-1")
    assert inst.incarnation == 1 and inst.state is InstanceState.READY
    assert fleet.table.handles_out("prefill-1") == 0
    await fleet.poll_load()
    assert len(store.events(kind="instance.restarted")) == 1  # told once


async def test_stored_desired_state_wins_on_restart(tmp_path: Path) -> None:
    settings = load_settings(None, controller={"state_dir": tmp_path})
    store = Store(tmp_path / "state.db")
    c1, _ = build_fleet(settings, store, FakeLauncher(), httpx.AsyncClient())
    c1.set_pool(Role.DECODE, 3, None, "test")
    c2, _ = build_fleet(settings, store, FakeLauncher(), httpx.AsyncClient())
    assert c2.targets[Role.DECODE].size == 3


def test_a_sweep_where_most_ready_instances_time_out_counts_no_timeout() -> None:
    ok, down, slow = Probe.OK, Probe.DOWN, Probe.TIMEOUT
    # One engine hangs: it counts.
    assert count_failures([(False, ok), (False, slow), (False, ok)]).failed == (
        False, True, False)
    # Everyone times out at once: the controller is starved; nothing counts, a refusal does.
    v = count_failures([(False, slow), (False, slow), (False, down), (True, slow)])
    assert v.failed == (False, False, True, False) and v.overloaded and v.uncounted == 2
    # A single ready instance timing out is not "most of the fleet".
    assert count_failures([(False, slow)]).failed == (True,)
    # Starting instances never count.
    assert count_failures([(True, down), (True, slow)]).failed == (False, False)


def test_a_new_process_behind_the_same_address_reads_as_a_restart() -> None:
    served = EngineLoad.parse("process_start_time_seconds 1000.5\n"
                              'vllm:prompt_tokens_total{model_name="m"} 900\n'
                              'vllm:generation_tokens_total{model_name="m"} 40\n')
    assert served.started == 1000.5 and served.prompt_tokens == 900
    later = EngineLoad(started=1000.5, prompt_tokens=1200, generation_tokens=50)
    assert restart_reason(served, later) is None  # the same process, counting on
    again = EngineLoad(started=1090.0, prompt_tokens=1500, generation_tokens=60)
    why = restart_reason(served, again)  # counters grew past, but another process
    assert why is not None and "process start time moved from 1000 to 1090" in why
    # No start time exported (vLLM with several API servers): a counter going back tells.
    why = restart_reason(EngineLoad(prompt_tokens=900, nixl_xfers=5),
                         EngineLoad(prompt_tokens=950, nixl_xfers=2))
    assert why == "its vllm:nixl_xfer_time_seconds_count went back from 5 to 2"
    assert restart_reason(EngineLoad(prompt_tokens=900), EngineLoad(prompt_tokens=900)) is None


async def test_timeouts_across_the_fleet_do_not_fail_it(
        env: Env) -> None:
    fleet, launcher, clock, store = env
    await fleet.tick()
    launcher.healthy = {s.instance_id for s in launcher.started}
    clock.t += 1
    await fleet.tick()
    ready = {i.id for i in fleet.registry if i.state is InstanceState.READY}
    assert len(ready) == 2

    def hang(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("starved", request=request)

    fleet.observer.client = httpx.AsyncClient(transport=httpx.MockTransport(hang))
    for _ in range(fleet.settings.controller.unhealthy_after + 2):
        clock.t += fleet.settings.controller.health_interval_s
        await fleet.tick()
    assert {i.id for i in fleet.registry if i.state is InstanceState.READY} == ready


@pytest.mark.parametrize(("crashes", "wait"), [(1, None), (2, None), (3, 30.0), (4, 60.0),
                                               (9, 600.0)])
def test_quarantine_grows_with_crashes_in_the_window(crashes: int, wait: float | None) -> None:
    assert quarantine_s(crashes, after=3) == wait


async def test_a_decode_pool_that_keeps_crashing_in_service_is_quarantined(
        env: Env) -> None:
    """Like the AMX crash: each replacement becomes ready, then dies on its first
    disaggregated request. Readiness must not reset the count; the third crash stops the
    restarts for 30 s, visibly."""
    fleet, launcher, clock, store = env
    await _ready_pools(env)
    for n in range(3):
        d = await _crash_the_decode(env, -4)
        assert d.last_error == "process exited with status -4 (SIGILL)"
        if n == 2:
            break
        assert fleet.pool_view(Role.DECODE)["quarantine"] is None
        clock.t += 20  # past the start backoff: a replacement starts and becomes ready
        await fleet.tick()
        await _all_healthy(env)
    view = fleet.pool_view(Role.DECODE)["quarantine"]
    assert view is not None and view["crashes"] == 3 and 0 < view["remaining_s"] <= 30
    assert "SIGILL" in view["last_error"]
    [event] = [e for e in store.events() if e["kind"] == "pool.quarantined"]
    assert event["target"] == "decode" and "3 crashes" in event["detail"]
    starts = len(launcher.started)
    clock.t += 20
    await fleet.tick()
    assert len(launcher.started) == starts  # quarantined: no restart yet
    clock.t += 15
    await fleet.tick()
    assert len(launcher.started) == starts + 1
    assert fleet.pool_view(Role.DECODE)["quarantine"] is None


async def test_crashes_outside_the_window_are_forgotten(
        env: Env) -> None:
    fleet, _, clock, _ = env
    await _ready_pools(env)
    for _ in range(3):
        await _crash_the_decode(env, -9)
        clock.t += fleet.settings.controller.crash_window_s / 2 + 1
        await fleet.tick()
        await _all_healthy(env)
    assert fleet.guard.quarantine[Role.DECODE] is None
