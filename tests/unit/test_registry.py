"""The instance registry: the one writer of instances. Every transition is recorded and tells
the routing table the pool's ready members; slots stay held while an instance stops."""

from __future__ import annotations

from pathlib import Path

from controller.fleet.registry import RETAIN_TERMINAL_S, Registry
from controller.models import Instance, InstanceState, Role
from controller.store import Store


class Clock:
    t = 100.0

    def __call__(self) -> float:
        return self.t


def make(tmp_path: Path) -> tuple[Registry, Clock, list[tuple[Role, list[str]]]]:
    told: list[tuple[Role, list[str]]] = []
    clock = Clock()
    reg = Registry(Store(tmp_path / "s.db"), clock,
                   lambda role, members: told.append((role, [i.id for i in members])))
    return reg, clock, told


def inst(iid: str, role: Role = Role.DECODE, slots: tuple[int, ...] = (0,)) -> Instance:
    return Instance(iid, role, 1, f"http://{iid}", created_at=90.0, slots=slots,
                    accelerators=slots)


def test_lifecycle_is_recorded_and_members_follow_it(tmp_path: Path) -> None:
    reg, clock, told = make(tmp_path)
    d1, d2 = inst("decode-1"), inst("decode-2", slots=(1,))
    reg.add(d1, "pool below size")
    reg.add(d2, "pool below size")
    reg.mark_ready(d2)
    reg.mark_ready(d1)
    assert [i.id for i in reg.ready(Role.DECODE)] == ["decode-1", "decode-2"]
    assert told[-1] == (Role.DECODE, ["decode-1", "decode-2"])  # sorted by id
    reg.drain(d1, "scale down", "operator")
    assert told[-1] == (Role.DECODE, ["decode-2"]) and d1.drain_started_at == clock.t
    assert reg.fail(d2, "process exited with status -9") is True  # it was serving
    assert told[-1] == (Role.DECODE, []) and d2.last_error and d2.ended_at == clock.t
    kinds = [(e["kind"], e["target"], e["before"], e["after"])
             for e in reversed(reg.store.events())]
    assert kinds == [
        ("instance.starting", "decode-1", None, kinds[0][3]),
        ("instance.starting", "decode-2", None, kinds[1][3]),
        ("instance.ready", "decode-2", "starting", "ready"),
        ("instance.ready", "decode-1", "starting", "ready"),
        ("instance.draining", "decode-1", "ready", "draining"),
        ("instance.failed", "decode-2", "ready", "failed")]
    assert reg.store.events()[0]["actor"] == "controller"


def test_a_stopping_instance_holds_its_slots_until_stopped(tmp_path: Path) -> None:
    reg, clock, _ = make(tmp_path)
    d1 = inst("decode-1", slots=(2, 3))
    reg.add(d1, "x")
    reg.mark_ready(d1)
    assert reg.used_slots() == {2, 3} and reg.live() == [d1]
    reg.begin_stop(d1)
    assert reg.used_slots() == {2, 3} and reg.live() == []  # not planned, still placed
    reg.end_stop(d1, InstanceState.STOPPED, "drained")
    assert reg.used_slots() == frozenset() and d1.state is InstanceState.STOPPED


def test_terminal_instances_are_purged_after_the_retention(tmp_path: Path) -> None:
    reg, clock, _ = make(tmp_path)
    d1 = inst("decode-1")
    reg.add(d1, "x")
    reg.fail(d1, "not ready after 600 s")
    assert reg.purge() == [] and reg.get("decode-1") is d1
    clock.t += RETAIN_TERMINAL_S + 1
    assert reg.purge() == ["decode-1"] and reg.get("decode-1") is None


def test_health_counts_and_unreachable_reports(tmp_path: Path) -> None:
    reg, _, _ = make(tmp_path)
    d1 = inst("decode-1")
    reg.add(d1, "x")
    assert reg.unhealthy(d1) == 1 and reg.unhealthy(d1) == 2
    reg.healthy(d1)
    assert d1.health_failures == 0
    reg.unreachable(d1, "refused")
    assert d1.last_error == "refused"
    reg.fail(d1, "process exited with status 1")
    reg.unreachable(d1, "refused again")
    assert d1.last_error == "process exited with status 1"  # why it failed is kept
