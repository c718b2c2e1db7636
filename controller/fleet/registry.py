"""The instance registry: the one writer of every ``Instance``.

Instances enter here when launched and leave when purged; every lifecycle transition goes
through ``transition`` and lands in the audit log; what the observer saw (health, load) is
applied here. Readers get instances and the ready members of each pool; the routing table is
told whenever a pool's ready members change.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

from controller.fleet.observer import EngineLoad
from controller.kvevents.hub import KvEventsHub
from controller.launchers.base import Launched
from controller.launchers.process import stop_leftover
from controller.models import Instance, InstanceState, Role
from controller.store import Store

log = logging.getLogger("pdctl.fleet")

RETAIN_TERMINAL_S = 600.0  # failed/stopped instances stay visible this long
LIVE_KEY = "live_instances"  # in the store: instances not yet stopped or failed
Members = Callable[[Role, list[Instance]], None]


class Registry:
    def __init__(self, store: Store, clock: Callable[[], float],
                 on_members: Members | None = None, kv: KvEventsHub | None = None) -> None:
        self.store = store
        self.clock = clock
        self.kv = kv  # subscribes to each instance's KV events while it lives
        self._instances: dict[str, Instance] = {}
        self._ready: dict[Role, list[Instance]] = {r: [] for r in Role}
        self._stopping: set[str] = set()
        self._on_members = on_members

    # ---- reading -----------------------------------------------------------------------

    def get(self, instance_id: str) -> Instance | None:
        return self._instances.get(instance_id)

    def __iter__(self) -> Iterator[Instance]:
        return iter(list(self._instances.values()))

    def __len__(self) -> int:
        return len(self._instances)

    def ready(self, role: Role) -> list[Instance]:
        return self._ready[role]

    def stopping(self, inst: Instance) -> bool:
        return inst.id in self._stopping

    def live(self) -> list[Instance]:
        """Neither terminal nor being stopped: what the planner and the observer look at."""
        return [i for i in self._instances.values()
                if not i.state.terminal and i.id not in self._stopping]

    def serving(self) -> list[Instance]:
        return [i for i in self._instances.values()
                if i.state in (InstanceState.READY, InstanceState.DRAINING)]

    def used_slots(self) -> frozenset[int]:
        return frozenset(s for i in self._instances.values()
                         if i.state.holds_accelerators or i.id in self._stopping
                         for s in i.slots)

    def used_accelerators(self) -> int:
        """Distinct accelerators that hold at least one instance."""
        return len({a for i in self._instances.values()
                    if i.state.holds_accelerators for a in i.accelerators})

    # ---- lifecycle ---------------------------------------------------------------------

    def add(self, inst: Instance, reason: str, actor: str = "reconciler") -> None:
        """A new instance, before its launcher has started it (it holds its slots)."""
        self._instances[inst.id] = inst
        self.store.record(actor, "instance.starting", inst.id, None,
                          {"role": inst.role.value, "tp": inst.tp, "kv_mode": inst.kv_mode,
                           "accelerators": list(inst.accelerators)}, reason)
        self._remember_live()

    def launched(self, inst: Instance, handle: Launched) -> None:
        """Its launcher started it: where it serves, on which node, and its NIXL identity."""
        inst.handle, inst.url, inst.node = handle, handle.url, handle.node
        inst.kv_peer = handle.kv_peer
        if self.kv is not None:
            self.kv.watch(inst.id, handle.kv_events)
        where = f" on node {handle.node}" if handle.node else ""
        self.store.record("reconciler", "instance.launched", inst.id, None,
                          {"url": handle.url, "node": handle.node, "pid": inst.pid},
                          f"serving at {handle.url}{where} once ready")
        self._remember_live()

    def adopt(self, inst: Instance, detail: str) -> None:
        """An engine a previous controller run left running, taken over as ready."""
        inst.ready_at = self.clock()
        self._instances[inst.id] = inst
        if self.kv is not None and isinstance(inst.handle, Launched):
            self.kv.watch(inst.id, inst.handle.kv_events)
        self.store.record("controller", "instance.adopted", inst.id, None,
                          {"role": inst.role.value, "tp": inst.tp, "kv_mode": inst.kv_mode,
                           "url": inst.url, "node": inst.node}, detail)
        log.info("%s adopted (%s)", inst.id, detail)
        self._refresh(inst.role)
        self._remember_live()

    def transition(self, inst: Instance, state: InstanceState, actor: str, detail: str
                   ) -> None:
        before = inst.state
        inst.state = state
        if state.terminal and self.kv is not None:
            self.kv.unwatch(inst.id)  # its blocks are gone with it
        self.store.record(actor, f"instance.{state.value}", inst.id, before.value, state.value,
                          detail)
        log.info("%s %s -> %s (%s)", inst.id, before.value, state.value, detail)
        self._refresh(inst.role)
        self._remember_live()

    # ---- across controller runs ----------------------------------------------------------

    def _remember_live(self) -> None:
        """Persist the instances not yet stopped or failed, so that a controller that ends
        without stopping them (SIGKILL, a crash) has them accounted for at its next start."""
        self.store.put(LIVE_KEY, [
            {"id": i.id, "role": i.role.value, "tp": i.tp, "kv_mode": i.kv_mode,
             "state": i.state.value, "url": i.url, "pid": i.pid, "node": i.node}
            for i in self._instances.values() if not i.state.terminal])

    def previous_run(self) -> list[dict[str, Any]]:
        """The instances the previous controller run left live (it ended without stopping
        them): ``id``, ``role``, ``tp``, ``kv_mode`` (absent from an older controller's:
        pull), ``state``, ``url``, ``pid``."""
        left = self.store.get(LIVE_KEY) or []
        return [r for r in left if isinstance(r, dict)] if isinstance(left, list) else []

    def close_previous_run(self, left: list[dict[str, Any]] | None = None,
                           notes: dict[str, str] | None = None) -> list[dict[str, Any]]:
        """Record as failed every instance the previous controller run left live (``left``:
        what ``previous_run`` said before any was adopted; default: it now), except those
        adopted since: each gets its ``instance.failed`` event, and an engine still running
        on its pid and port is stopped; ``notes`` says what became of an instance whose
        engine the launcher found. The events, in order."""
        events = []
        for rec in self.previous_run() if left is None else left:
            if rec.get("id") in self._instances:
                continue
            pid, port = rec.get("pid"), urlsplit(str(rec.get("url", ""))).port
            found = stop_leftover(pid, port) if isinstance(pid, int) and port else "none"
            how = {"none": ("its Ray actor was gone" if rec.get("node")
                            else "it had no local process"),
                   "gone": f"its process (pid {pid}) was gone",
                   "stopped": f"its process (pid {pid}) was still running and has been stopped",
                   "not ours": f"pid {pid} now belongs to another process"}[found]
            how = (notes or {}).get(str(rec.get("id")), how)
            events.append(self.store.record(
                "controller", "instance.failed", str(rec.get("id")), rec.get("state"), "failed",
                f"found at controller start: the previous controller run ended without "
                f"stopping it; {how}"))
        self._remember_live()
        return events

    def mark_ready(self, inst: Instance) -> None:
        now = self.clock()
        inst.ready_at = now
        self.transition(inst, InstanceState.READY, "controller",
                        f"healthy after {now - inst.created_at:.1f} s")

    def drain(self, inst: Instance, why: str, actor: str = "reconciler") -> None:
        inst.drain_started_at = self.clock()
        self.transition(inst, InstanceState.DRAINING, actor, why)

    def fail(self, inst: Instance, why: str) -> bool:
        """Mark ``inst`` failed; True when it was in service (ready or draining)."""
        in_service = inst.state in (InstanceState.READY, InstanceState.DRAINING)
        inst.last_error = why
        inst.ended_at = self.clock()
        self.transition(inst, InstanceState.FAILED, "controller", why)
        return in_service

    def begin_stop(self, inst: Instance) -> None:
        self._stopping.add(inst.id)

    def end_stop(self, inst: Instance, final_state: InstanceState | None, why: str) -> None:
        self._stopping.discard(inst.id)
        inst.ended_at = self.clock()
        if final_state is not None:
            self.transition(inst, final_state, "reconciler", why)

    def purge(self) -> list[str]:
        """Forget terminal instances older than ``RETAIN_TERMINAL_S``; their ids."""
        now = self.clock()
        gone = [i.id for i in self._instances.values()
                if i.state.terminal and now - (i.ended_at or now) > RETAIN_TERMINAL_S]
        for iid in gone:
            del self._instances[iid]
        return gone

    # ---- what the observer and the router saw --------------------------------------------

    def healthy(self, inst: Instance) -> None:
        inst.health_failures = 0

    def unhealthy(self, inst: Instance) -> int:
        """Count a failed health check; the instance's failures in a row."""
        inst.health_failures += 1
        return inst.health_failures

    def unreachable(self, inst: Instance, error: str) -> None:
        if not inst.state.terminal:  # a failed instance keeps the reason it failed for
            inst.last_error = error

    def restarted(self, inst: Instance, why: str, handles_voided: int) -> None:
        """A new engine answers at ``inst``'s address: the KV handles the old one gave out
        are void (``handles_voided`` were not yet read or released); a decode hop still
        holding one goes colocated (``Instance.incarnation``)."""
        inst.incarnation += 1
        detail = (f"the engine at {inst.url} restarted behind the same address ({why}); "
                  f"{handles_voided} KV handle(s) it gave out are void and its prefix cache "
                  "is empty")
        self.store.record("fleet", "instance.restarted", inst.id, None,
                          {"incarnation": inst.incarnation, "url": inst.url}, detail)
        log.warning("%s: %s", inst.id, detail)

    def apply_load(self, inst: Instance, load: EngineLoad) -> None:
        """An engine's /metrics, with the mean NIXL transfer time of the transfers completed
        since the previous poll."""
        inst.running, inst.waiting, inst.kv_usage = load.running, load.waiting, load.kv_usage
        if load.nixl_xfers > inst.nixl_xfers:
            seconds = load.nixl_xfer_s - inst.nixl_xfer_s
            inst.recent_xfer_ms = max(0.0, seconds / (load.nixl_xfers - inst.nixl_xfers) * 1e3)
        inst.nixl_xfers, inst.nixl_xfer_s = load.nixl_xfers, load.nixl_xfer_s
        inst.nixl_bytes = load.nixl_bytes
        inst.kv_expired, inst.kv_after_expiry = load.kv_expired, load.kv_after_expiry
        inst.nixl_failed = load.nixl_failed
        inst.local_compute = load.local_compute

    def _refresh(self, role: Role) -> None:
        members = sorted((i for i in self._instances.values()
                          if i.role is role and i.state.routable), key=lambda i: i.id)
        self._ready[role] = members
        if self._on_members is not None:
            self._on_members(role, members)
