"""Pure planning: from desired pools and observed instances to a list of actions.

``reconcile`` decides everything -- which instances start, drain and stop, where a new instance
runs (its placement slots) and whether a pool may start one at all (its backoff) -- and the
fleet loop (``controller.fleet.loop``) only carries the actions out.

A TP change, or a KV mode change (pull <-> push), is a rolling replace with a surge of one: a
new instance at the new TP and mode starts, and only once it is ready does an old one drain,
so serving capacity never drops below the desired size (both modes serve side by side
meanwhile) (when the accelerators for one extra instance are not free, an old instance
drains first and the dip is stated in the reason). Draining instances stop once their in-
flight requests finish or the drain timeout passes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from controller.models import InstanceState, PoolTarget, Role
from controller.sizing import placement


@dataclass(frozen=True)
class Member:
    """What the reconciler needs to know of one live instance."""

    id: str
    role: Role
    tp: int
    state: InstanceState
    inflight: int = 0
    created_at: float = 0.0
    drain_started_at: float | None = None
    kv_mode: str = "pull"
    kv_handles: int = 0  # a prefill instance's KV handles not yet read, released or expired


@dataclass(frozen=True)
class Start:
    role: Role
    tp: int
    reason: str
    slots: tuple[int, ...] = ()  # placement slots, chosen by the plan (``placement.allocate``)
    kv_mode: str = "pull"


@dataclass(frozen=True)
class Drain:
    instance_id: str
    reason: str


@dataclass(frozen=True)
class Stop:
    instance_id: str
    reason: str


Action = Start | Drain | Stop


@dataclass(frozen=True)
class Capacity:
    """The accelerators' layout and the placement slots in use (by instances that hold
    accelerators, stopping ones included)."""

    per_node: int
    nodes: int
    share: int = 1
    used: frozenset[int] = frozenset()

    @classmethod
    def with_free(cls, free: int, per_node: int = 8) -> Capacity:
        """A layout of nodes of ``per_node`` with exactly ``free`` slots free (tables)."""
        nodes = max(1, -(-free // per_node))
        return cls(per_node, nodes, 1, frozenset(range(free, nodes * per_node)))


@dataclass(frozen=True)
class FleetState:
    targets: dict[Role, PoolTarget]
    instances: tuple[Member, ...]
    capacity: Capacity
    now: float
    drain_timeout_s: float
    backoff_until: Mapping[Role, float] = field(default_factory=dict)  # no start before


def reconcile(inp: FleetState) -> list[Action]:
    """Actions that move the observed instances toward the targets, for every role."""
    actions: list[Action] = []
    used = set(inp.capacity.used)
    for role, target in inp.targets.items():
        mine = [i for i in inp.instances if i.role is role]
        actions += _finish_drains(mine, inp.now, inp.drain_timeout_s)
        may_start = inp.now >= inp.backoff_until.get(role, 0.0)
        actions += _plan_pool(role, target, mine, inp.capacity, used, may_start)
    return actions


def _finish_drains(mine: Iterable[Member], now: float, timeout: float) -> list[Action]:
    out: list[Action] = []
    for i in mine:
        if i.state is not InstanceState.DRAINING:
            continue
        if i.inflight == 0 and i.kv_handles == 0:
            out.append(Stop(i.id, "drained: no requests in flight"
                            + (", no KV handles out" if i.role is Role.PREFILL else "")))
        elif i.drain_started_at is not None and now - i.drain_started_at >= timeout:
            out.append(Stop(i.id, f"drain timeout with {i.inflight} requests in flight"
                            + (f" and {i.kv_handles} KV handles out" if i.kv_handles else "")))
    return out


def _by_state(items: list[Member], state: InstanceState) -> list[Member]:
    return [i for i in items if i.state is state]


def _drain_order(items: list[Member]) -> list[Member]:
    """Least loaded first, newest first among equals: the cheapest to take away."""
    return sorted(items, key=lambda i: (i.inflight, -i.created_at, i.id))


def matches(i: Member, target: PoolTarget) -> bool:
    """The instance is what its pool wants: the pool's TP and KV mode."""
    return i.tp == target.tp and i.kv_mode == target.kv_mode


def change(i: Member, target: PoolTarget) -> str:
    """What replacing ``i`` changes: ``TP 2 -> 4``, ``KV pull -> push``, or both."""
    parts = []
    if i.tp != target.tp:
        parts.append(f"TP {i.tp} -> {target.tp}")
    if i.kv_mode != target.kv_mode:
        parts.append(f"KV {i.kv_mode} -> {target.kv_mode}")
    return ", ".join(parts)


def _replacement(stale: list[Member], target: PoolTarget) -> str:
    """What a new instance replaces the stale ones with: ``TP 4``, ``KV push``, or both."""
    parts = []
    if any(i.tp != target.tp for i in stale):
        parts.append(f"TP {target.tp}")
    if any(i.kv_mode != target.kv_mode for i in stale):
        parts.append(f"KV {target.kv_mode}")
    return ", ".join(parts)


def _plan_pool(role: Role, target: PoolTarget, mine: list[Member], cap: Capacity,
               used: set[int], may_start: bool) -> list[Action]:
    """One pool's actions; the slots of the instances it starts are added to ``used``."""
    live = [i for i in mine if i.state in (InstanceState.STARTING, InstanceState.READY)]
    match = [i for i in live if matches(i, target)]
    stale = [i for i in live if not matches(i, target)]
    actions: list[Action] = [
        Stop(i.id, f"{change(i, target)}: replaced before it was ready")
        for i in _by_state(stale, InstanceState.STARTING)
    ]
    stale_ready = _by_state(stale, InstanceState.READY)
    match_ready = _by_state(match, InstanceState.READY)

    if len(match) > target.size:
        excess = len(match) - target.size
        starting = sorted(_by_state(match, InstanceState.STARTING), key=lambda i: -i.created_at)
        for i in starting[:excess]:
            actions.append(Stop(i.id, f"scale {role.value} down to {target.size}"))
        for i in _drain_order(match_ready)[: max(0, excess - len(starting))]:
            actions.append(Drain(i.id, f"scale {role.value} down to {target.size}"))
        actions += [Drain(i.id, change(i, target)) for i in stale_ready]
        return actions

    # Old-TP (or old-mode) instances keep serving until enough new ones are ready.
    n_drain = max(0, len(match_ready) + len(stale_ready) - target.size)
    to_drain = _drain_order(stale_ready)[:n_drain]
    actions += [Drain(i.id, f"{change(i, target)}: replacement ready") for i in to_drain]

    surge = 1 if stale_ready else 0
    room = target.size + surge - (len(match) + len(stale_ready))
    n_start = min(target.size - len(match), room) if may_start else 0
    for _ in range(max(0, n_start)):
        slots = placement.allocate(used, cap.per_node, cap.nodes, target.tp, cap.share)
        if slots is None:
            if stale_ready and not to_drain and not any(
                i.state is InstanceState.DRAINING for i in mine
            ):
                victim = _drain_order(stale_ready)[0]
                actions.append(Drain(victim.id, f"{change(victim, target)}: no spare "
                                     "accelerators for a surge instance, draining first"))
            break
        used.update(slots)
        why = (f"{_replacement(stale_ready, target)} replacement" if stale_ready
               else f"{role.value} pool below size")
        actions.append(Start(role, target.tp, f"{why} ({len(match)}/{target.size})", slots,
                             target.kv_mode))
    return actions
