"""The planner as a table: desired pools + observed instances -> actions."""

from __future__ import annotations

from controller.fleet.reconcile import (
    Capacity,
    Drain,
    FleetState,
    Member,
    PoolTarget,
    Start,
    Stop,
    reconcile,
)
from controller.models import InstanceState as S
from controller.models import Role

P, D = Role.PREFILL, Role.DECODE
NO_PREFILL = PoolTarget(0, 4)


def inst(iid: str, role: Role = D, tp: int = 2, state: S = S.READY, inflight: int = 0,
         created: float = 0.0, drain_at: float | None = None) -> Member:
    return Member(iid, role, tp, state, inflight, created, drain_at)


def run(decode: PoolTarget, *instances: Member, free: int = 100,
        prefill: PoolTarget = NO_PREFILL, now: float = 100.0) -> list[object]:
    return list(reconcile(FleetState({P: prefill, D: decode}, instances,
                                     Capacity.with_free(free), now, 30.0)))


def starts(actions: list[object]) -> int:
    return sum(isinstance(a, Start) for a in actions)


def test_scale_up_starts_the_missing_instances() -> None:
    actions = run(PoolTarget(3, 2), inst("d1"))
    assert starts(actions) == 2
    assert all(isinstance(a, Start) and a.tp == 2 and a.role is D for a in actions)


def test_converged_pool_plans_nothing() -> None:
    assert run(PoolTarget(2, 2), inst("d1"), inst("d2")) == []


def test_scale_down_drains_least_loaded_ready_and_stops_starting_first() -> None:
    actions = run(PoolTarget(1, 2), inst("d1", inflight=5), inst("d2", inflight=1),
                  inst("d3", state=S.STARTING, created=50))
    assert Stop("d3", "scale decode down to 1") in actions
    assert Drain("d2", "scale decode down to 1") in actions
    assert not any(isinstance(a, Drain) and a.instance_id == "d1" for a in actions)


def test_drained_instance_stops_when_idle_or_on_timeout() -> None:
    idle = inst("d9", state=S.DRAINING, inflight=0, drain_at=99.0)
    busy = inst("d8", state=S.DRAINING, inflight=2, drain_at=99.0)
    late = inst("d7", state=S.DRAINING, inflight=2, drain_at=10.0)
    actions = run(PoolTarget(1, 2), inst("d1"), idle, busy, late)
    stopped = {a.instance_id for a in actions if isinstance(a, Stop)}
    assert stopped == {"d9", "d7"}


def test_a_drained_prefill_waits_for_its_kv_handles_then_times_out_naming_them() -> None:
    handles = Member("p9", P, 4, S.DRAINING, 0, 0.0, 99.0, kv_handles=2)
    done = Member("p8", P, 4, S.DRAINING, 0, 0.0, 99.0)
    late = Member("p7", P, 4, S.DRAINING, 0, 0.0, 10.0, kv_handles=1)
    actions = run(PoolTarget(1, 2), inst("d1"), handles, done, late,
                  prefill=PoolTarget(1, 4))
    stops = {a.instance_id: a.reason for a in actions if isinstance(a, Stop)}
    assert stops == {"p8": "drained: no requests in flight, no KV handles out",
                     "p7": "drain timeout with 0 requests in flight and 1 KV handles out"}


def test_tp_change_surges_one_new_instance_before_draining() -> None:
    actions = run(PoolTarget(2, 4), inst("d1"), inst("d2"))
    assert [type(a) for a in actions] == [Start]
    assert actions[0].tp == 4  # type: ignore[attr-defined]


def test_tp_change_waits_for_replacement_to_be_ready() -> None:
    actions = run(PoolTarget(2, 4), inst("d1"), inst("d2"), inst("n1", tp=4, state=S.STARTING))
    assert actions == []


def test_tp_change_drains_one_old_when_a_new_one_is_ready_then_surges_again() -> None:
    actions = run(PoolTarget(2, 4), inst("d1", inflight=3), inst("d2"), inst("n1", tp=4))
    drains = [a for a in actions if isinstance(a, Drain)]
    assert [d.instance_id for d in drains] == ["d2"]
    assert starts(actions) == 0  # old d1 + new n1 hold the size; surge room used by n1


def test_tp_change_without_spare_accelerators_drains_first() -> None:
    actions = run(PoolTarget(2, 4), inst("d1"), inst("d2"), free=0)
    assert starts(actions) == 0
    assert len([a for a in actions if isinstance(a, Drain)]) == 1


def test_stale_starting_instances_are_stopped() -> None:
    actions = run(PoolTarget(1, 4), inst("d1", state=S.STARTING))
    assert Stop("d1", "TP 2 -> 4: replaced before it was ready") in actions
    assert starts(actions) == 1


def test_backoff_blocks_starts_only() -> None:
    inp = FleetState({P: PoolTarget(0, 4), D: PoolTarget(2, 2)}, (inst("d1"),),
                    Capacity.with_free(100), 5.0, 30.0, backoff_until={D: 10.0})
    assert reconcile(inp) == []
    later = FleetState(inp.targets, inp.instances, inp.capacity, 10.0, 30.0, inp.backoff_until)
    assert starts(reconcile(later)) == 1


def test_accelerator_budget_limits_starts() -> None:
    assert starts(run(PoolTarget(5, 2), free=5)) == 2


def test_roles_are_planned_independently() -> None:
    actions = reconcile(FleetState({P: PoolTarget(1, 4), D: PoolTarget(1, 2)}, (),
                             Capacity.with_free(100), 0.0, 30.0))
    assert {(a.role, a.tp) for a in actions if isinstance(a, Start)} == {(P, 4), (D, 2)}


def test_placement_is_decided_in_the_plan() -> None:
    """Each start carries its own slots, distinct from the used ones and from each other;
    a start that cannot be placed is not planned (never dropped later)."""
    cap = Capacity(per_node=4, nodes=2, used=frozenset({0, 1}))
    actions = reconcile(FleetState({P: PoolTarget(1, 4), D: PoolTarget(2, 2)}, (), cap, 0.0, 30.0))
    slots = {a.role: a.slots for a in actions if isinstance(a, Start) and a.role is P}
    assert slots == {P: (4, 5, 6, 7)}
    decode = [a.slots for a in actions if isinstance(a, Start) and a.role is D]
    assert decode == [(2, 3)]  # the second TP-2 instance has no node left with 2 free slots


def test_fragmented_capacity_plans_no_start() -> None:
    """Two free accelerators on two nodes hold no TP-2 instance (TP stays inside a node)."""
    cap = Capacity(per_node=2, nodes=2, used=frozenset({0, 2}))
    state = FleetState({P: PoolTarget(0, 2), D: PoolTarget(1, 2)}, (), cap, 0.0, 30.0)
    assert reconcile(state) == []
