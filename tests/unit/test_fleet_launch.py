"""The fleet's side of launchers that take time or find engines of a previous run (Ray):
background launches, a stop during a launch, launch failures, and adoption at start."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from controller.config import load_settings
from controller.errors import InvalidChange, LaunchError
from controller.fleet import Fleet, build_fleet
from controller.launchers.base import Launched, Launcher, LaunchSpec
from controller.models import InstanceState, Role
from controller.store import Store


class SlowLauncher(Launcher):
    """Each start waits for its release (a Ray placement), or fails with ``fail``."""

    name = "slow"
    stop_after_exit = True

    def __init__(self) -> None:
        self.release: dict[str, asyncio.Event] = {}
        self.fail: dict[str, str] = {}
        self.cancelled: list[str] = []
        self.stopped: list[str] = []
        self.found: dict[str, Launched] = {}
        self.healthy: set[str] = set()
        self.ended: dict[str, str] = {}

    async def start(self, spec: LaunchSpec) -> Launched:
        gate = self.release.setdefault(spec.instance_id, asyncio.Event())
        try:
            await gate.wait()
        except asyncio.CancelledError:
            self.cancelled.append(spec.instance_id)
            raise
        if spec.instance_id in self.fail:
            raise LaunchError(self.fail[spec.instance_id])
        return Launched(f"http://{spec.instance_id}", spec.instance_id, node="10.0.0.9")

    async def stop(self, launched: Launched, grace_s: float = 5.0) -> None:
        self.stopped.append(launched.handle)

    def exit_reason(self, launched: Launched) -> str | None:
        return self.ended.get(launched.handle)

    async def reattach(self) -> dict[str, Launched]:
        return self.found


@pytest.fixture
def env(tmp_path: Path) -> tuple[Fleet, SlowLauncher, Store]:
    launcher = SlowLauncher()

    def handler(request: httpx.Request) -> httpx.Response:
        ok = request.url.host in launcher.healthy
        return httpx.Response(200 if ok else 503, text="")

    settings = load_settings(None, controller={"state_dir": tmp_path},
                             pools={"prefill": {"size": 1, "tp": 1},
                                    "decode": {"size": 2, "tp": 1}},
                             model={"name": "llama-3-8b"})
    store = Store(tmp_path / "state.db")
    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return build_fleet(settings, store, launcher, client)[0], launcher, store


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_slow_launch_does_not_hold_the_loop_and_its_instance_holds_its_slots(
        env: tuple[Fleet, SlowLauncher, Store]) -> None:
    fleet, launcher, store = env
    await fleet.tick()
    insts = list(fleet.registry)
    assert sorted(i.id for i in insts) == ["decode-2", "decode-3", "prefill-1"]
    assert all(i.state is InstanceState.STARTING and i.url == "" for i in insts)
    await fleet.tick()  # nothing launched yet: no second round of starts
    assert len(list(fleet.registry)) == 3
    launcher.release["decode-2"].set()
    await settle()
    d2 = fleet.registry.get("decode-2")
    assert d2 is not None and d2.url == "http://decode-2" and d2.node == "10.0.0.9"
    ev = [e for e in store.events(50) if e["kind"] == "instance.launched"]
    assert [e["target"] for e in ev] == ["decode-2"]
    assert ev[0]["after"]["node"] == "10.0.0.9"
    await fleet.shutdown()


async def test_a_launch_failure_fails_its_instance_with_the_reason(
        env: tuple[Fleet, SlowLauncher, Store]) -> None:
    fleet, launcher, store = env
    await fleet.tick()
    launcher.fail["prefill-1"] = "no Ray node could take 1 GPU within 120 s"
    launcher.release["prefill-1"].set()
    await settle()
    p1 = fleet.registry.get("prefill-1")
    assert p1 is not None and p1.state is InstanceState.FAILED
    assert p1.last_error == "launch failed: no Ray node could take 1 GPU within 120 s"
    assert Role.PREFILL in fleet.guard.backoff_until  # its replacement backs off
    await fleet.shutdown()


async def test_stopping_an_instance_still_being_placed_cancels_its_launch(
        env: tuple[Fleet, SlowLauncher, Store]) -> None:
    fleet, launcher, store = env
    await fleet.tick()
    fleet.set_pool(Role.DECODE, 1, None, "op")
    await fleet.tick()  # decode-3 is surplus while still launching: stopped
    await settle()
    await asyncio.gather(*fleet._tasks)
    assert "decode-3" in launcher.cancelled and "decode-3" not in launcher.stopped
    d3 = fleet.registry.get("decode-3")
    assert d3 is not None and d3.state is InstanceState.STOPPED
    await fleet.shutdown()
    assert sorted(launcher.cancelled) == ["decode-2", "decode-3", "prefill-1"]


async def test_recover_adopts_healthy_wanted_engines_and_stops_the_rest(
        env: tuple[Fleet, SlowLauncher, Store]) -> None:
    fleet, launcher, store = env
    store.put("live_instances", [
        {"id": "prefill-1", "role": "prefill", "tp": 1, "state": "ready"},
        {"id": "decode-2", "role": "decode", "tp": 1, "state": "ready"},
        {"id": "decode-3", "role": "decode", "tp": 1, "state": "ready"},
        {"id": "decode-4", "role": "decode", "tp": 1, "state": "ready"},
        {"id": "decode-5", "role": "decode", "tp": 4, "state": "ready"},
        {"id": "decode-6", "role": "decode", "tp": 1, "state": "ready", "node": "10.0.0.9"},
        {"id": "decode-7", "role": "decode", "tp": 1, "state": "starting"},
    ])
    launcher.found = {i: Launched(f"http://{i}", i, node="10.0.0.9") for i in (
        "prefill-1", "decode-2", "decode-3", "decode-4", "decode-5", "decode-9")}
    launcher.healthy = {"prefill-1", "decode-2", "decode-4", "decode-5", "decode-9"}
    launcher.ended["decode-3"] = "process exited with status 1"
    events = await fleet.recover()
    adopted = sorted(i.id for i in fleet.registry)
    assert adopted == ["decode-2", "decode-4", "prefill-1"]  # decode is 2 at TP 1
    assert all(i.state is InstanceState.READY and i.node == "10.0.0.9" for i in fleet.registry)
    assert [i.id for i in fleet.ready(Role.DECODE)] == ["decode-2", "decode-4"]
    assert sorted(launcher.stopped) == ["decode-3", "decode-5", "decode-9"]
    by = {e["target"]: e for e in events}
    assert "had ended: process exited with status 1" in by["decode-3"]["detail"]
    assert "not wanted: the decode pool is 2 at TP 1" in by["decode-5"]["detail"]
    assert by["decode-9"]["kind"] == "instance.stopped"  # not this state's instance
    assert "no instance of that id" in by["decode-9"]["detail"]
    assert "its Ray actor was gone" in by["decode-6"]["detail"]  # nothing found for it
    assert "no local process" in by["decode-7"]["detail"]  # not launched before the crash
    assert [e["kind"] for e in store.events(50)].count("instance.adopted") == 3
    # Adopted instances hold their slots: the pools are full, nothing more starts.
    await fleet.tick()
    assert len(list(fleet.registry)) == 3
    await fleet.shutdown()


def test_stored_pools_survive_a_start_on_a_cluster_whose_workers_have_not_joined(
        tmp_path: Path) -> None:
    """Live capacity (a Ray cluster's) with no accelerator node yet: the stored pools are
    kept (checked against the configured node size only), while a change is still checked
    against what the cluster has now."""
    class EmptyCluster(SlowLauncher):
        def capacity(self) -> tuple[int, int] | None:
            return (1, 0)

    settings = load_settings(None, controller={"state_dir": tmp_path},
                             model={"name": "llama-3-8b"})
    store = Store(tmp_path / "state.db")
    store.put("desired", {"prefill": {"size": 2, "tp": 2}, "decode": {"size": 4, "tp": 1}})
    fleet, _ = build_fleet(settings, store, EmptyCluster(), httpx.AsyncClient())
    assert fleet.targets[Role.DECODE].size == 4 and fleet.targets[Role.PREFILL].tp == 2
    assert not [e for e in store.events(10) if e["kind"] == "desired.reset"]
    with pytest.raises(InvalidChange):
        fleet.set_pool(Role.DECODE, 5, None, "op")
