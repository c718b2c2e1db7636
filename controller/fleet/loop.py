"""The fleet: observe -> plan -> act, forever.

Each tick observes (process exits, health), builds the planner's input from the registry, the
desired pools, the start guard and the routing table's in-flight counts, asks the pure
``reconcile`` what to do, and carries the actions out through the launcher. A separate
loop polls the engines' /metrics. Only the registry changes instances.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from controller.config import Settings
from controller.errors import InvalidChange, LaunchError, NotFound
from controller.fleet.desired import Desired, FleetCapacity, capacity_of, target_json
from controller.fleet.guard import StartGuard
from controller.fleet.history import LoadHistory, history_rows
from controller.fleet.observer import (
    EngineLoad,
    Observer,
    Probe,
    count_failures,
    launched,
    restart_reason,
)
from controller.fleet.reconcile import (
    Action,
    Capacity,
    Drain,
    FleetState,
    Member,
    Start,
    Stop,
    reconcile,
)
from controller.fleet.registry import Registry
from controller.launchers.base import Launched, Launcher, LaunchSpec
from controller.models import Instance, InstanceState, PoolTarget, Role
from controller.router.table import RoutingTable
from controller.sizing import placement

log = logging.getLogger("pdctl.fleet")


class Fleet:
    def __init__(self, settings: Settings, registry: Registry, desired: Desired,
                 observer: Observer, launcher: Launcher, table: RoutingTable,
                 clock: Callable[[], float]) -> None:
        self.settings, self.registry, self.desired = settings, registry, desired
        self.observer, self.launcher, self.table, self.clock = observer, launcher, table, clock
        cs = settings.controller
        self.guard = StartGuard(cs.crash_window_s, cs.quarantine_after)
        self._last_health: dict[str, float] = {}
        self._early_check: dict[str, float] = {}  # when a router report last brought one
        self._last_load: dict[str, EngineLoad] = {}  # each instance's previous /metrics poll
        self._tasks: set[asyncio.Task[Any]] = set()
        self._launching: dict[str, asyncio.Task[None]] = {}  # instance id -> its start
        self._wake = asyncio.Event()
        # Every poll's load per instance, for the load over time (``/api/v1/utilization``).
        self.load_history = LoadHistory(history_rows(cs.metrics_poll_s))

    # ---- the operator's changes ------------------------------------------------------------

    @property
    def targets(self) -> dict[Role, PoolTarget]:
        return self.desired.targets

    def set_pool(self, role: Role, size: int | None, tp: int | None, actor: str,
                 detail: str | None = None, kv_mode: str | None = None) -> PoolTarget:
        """Validate and apply a desired-state change (``detail``: why, for the audit log);
        raises InvalidChange, changes nothing."""
        target = self.desired.set(role, size, tp, actor, detail, kv_mode)
        self._wake.set()
        return target

    def preview_pool(self, role: Role, size: int | None, tp: int | None,
                     kv_mode: str | None = None) -> list[Action]:
        """The actions the next reconcile step would take for ``role`` if the change were
        applied now (a dry run, backoff aside); raises InvalidChange, changes nothing."""
        inp = self._plan_input(self.desired.check(role, size, tp, kv_mode))
        mine = {i.id for i in inp.instances if i.role is role}
        return [a for a in reconcile(FleetState(inp.targets, inp.instances, inp.capacity, inp.now,
                                          inp.drain_timeout_s))
                if (a.role is role if isinstance(a, Start) else a.instance_id in mine)]

    def drain(self, instance_id: str, actor: str) -> Instance:
        inst = self.registry.get(instance_id)
        if inst is None:
            raise NotFound(f"no instance {instance_id!r}")
        if inst.state not in (InstanceState.READY, InstanceState.STARTING):
            raise InvalidChange(f"instance {instance_id} is {inst.state.value}; only ready or "
                                "starting instances can be drained")
        self.registry.drain(inst, f"operator drain by {actor}", actor)
        self._wake.set()
        return inst

    def unreachable(self, inst: Instance, error: str) -> None:
        """The router could not reach ``inst``: record why and check it at the next tick --
        once per health interval: the other requests that failed with it report it too, and
        ``unhealthy_after`` counts checks a health interval apart, not failed requests (a
        burst of reports must not fail the instance in milliseconds, before its process's
        exit can be seen)."""
        self.registry.unreachable(inst, error)
        now = self.clock()
        if now - self._early_check.get(inst.id, float("-inf")) >= \
                self.settings.controller.health_interval_s:
            self._early_check[inst.id] = now
            self._last_health.pop(inst.id, None)
            self._wake.set()

    # ---- a controller start -----------------------------------------------------------

    async def recover(self) -> list[dict[str, Any]]:
        """What the previous controller run left: engines the launcher finds still running
        (Ray's named actors) are adopted when they belong to this state, answer their health
        check and are still wanted (their pool's TP and KV mode, within its size); the others
        are
        stopped. Every other instance it left is recorded as failed. The events, in order."""
        records = self.registry.previous_run()
        left = {str(r.get("id")): r for r in records}
        found = await self.launcher.reattach()
        taken = dict.fromkeys(Role, 0)
        notes: dict[str, str] = {}
        events = []
        for iid in sorted(found):
            handle, rec = found[iid], left.get(iid)
            inst, why = await self._adoptable(iid, handle, rec, taken)
            if inst is not None:
                taken[inst.role] += 1
                self.registry.adopt(inst, "found running at controller start, healthy and "
                                    f"wanted{f' (node {inst.node})' if inst.node else ''}")
                continue
            await self.launcher.stop(handle)
            if rec is not None:
                notes[iid] = f"its engine was still running ({why}) and has been stopped"
            else:
                events.append(self.registry.store.record(
                    "controller", "instance.stopped", iid, None, "stopped",
                    f"found running at controller start ({why}); stopped"))
        return events + self.registry.close_previous_run(records, notes)

    async def _adoptable(self, iid: str, handle: Launched, rec: dict[str, Any] | None,
                         taken: dict[Role, int]) -> tuple[Instance | None, str]:
        if rec is None:
            return None, "no instance of that id in this controller's state"
        ended = self.launcher.exit_reason(handle)
        if ended is not None:
            return None, f"its engine had ended: {ended}"
        try:
            role, tp = Role(rec["role"]), int(rec["tp"])
        except (KeyError, TypeError, ValueError):
            return None, "its record has no role and TP"
        kv_mode = str(rec.get("kv_mode") or "pull")  # recorded by an older controller: pull
        target = self.desired.targets[role]
        if tp != target.tp or kv_mode != target.kv_mode or taken[role] >= target.size:
            return None, (f"not wanted: the {role.value} pool is {target.size} at TP "
                          f"{target.tp}, KV {target.kv_mode}")
        per_node, nodes, share = self.capacity()
        slots = placement.allocate(set(self.registry.used_slots()), per_node, nodes, tp, share)
        if slots is None:
            return None, "no room left for it in the pools' capacity"
        inst = Instance(iid, role, tp, handle.url, state=InstanceState.READY,
                        created_at=self.clock(), slots=slots, handle=handle, node=handle.node,
                        accelerators=tuple(placement.physical(s, per_node, share)
                                           for s in slots),
                        kv_mode=kv_mode, kv_peer=handle.kv_peer)
        if (await self.observer.probe([inst]))[0] is not Probe.OK:
            return None, "it did not answer its health check"
        return inst, ""

    # ---- the loop ----------------------------------------------------------------------

    async def run(self) -> None:
        while True:
            try:
                await self.tick()
            except Exception:  # the loop must survive any single bad tick
                log.exception("reconcile tick failed")
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.settings.controller.tick_s)

    async def tick(self) -> None:
        for iid, why in (await self.observer.exits(self.registry.live())).items():
            inst = self.registry.get(iid)
            if inst is not None and not inst.state.terminal:
                self._fail(inst, why)
        await self._check_health()
        for iid in self.registry.purge():
            self._last_health.pop(iid, None)
            self._early_check.pop(iid, None)
            self._last_load.pop(iid, None)
        for action in reconcile(self._plan_input(self.desired.targets)):
            await self._act(action)

    def _fail(self, inst: Instance, why: str) -> None:
        in_service = self.registry.fail(inst, why)
        self.table.failed(inst, why)
        q = self.guard.failed(inst.role, self.clock(), in_service, why)
        if q is not None:
            cs = self.settings.controller
            wait = q.until - self.clock()
            self.registry.store.record(
                "controller", "pool.quarantined", inst.role.value, None, q.public(self.clock()),
                f"{q.crashes} crashes in service within {cs.crash_window_s:g} s (last: {why}); "
                f"no new {inst.role.value} instance for {wait:g} s")
            log.warning("%s pool quarantined for %g s after %d crashes (last: %s)",
                        inst.role.value, wait, q.crashes, why)
        if inst.handle is None or self.launcher.stop_after_exit \
                or self.launcher.exit_code(launched(inst)) is None:
            self._spawn(self._stop(inst, why, final_state=None))

    async def _check_health(self) -> None:
        now = self.clock()
        cs = self.settings.controller
        due = []
        for inst in self.registry.live():
            if inst.state is InstanceState.STARTING:
                if now - inst.created_at > cs.start_timeout_s:
                    self._fail(inst, f"not ready after {cs.start_timeout_s:.0f} s")
                    continue
                due.append(inst)
            elif now - self._last_health.get(inst.id, 0.0) >= cs.health_interval_s:
                due.append(inst)
        results = await self.observer.probe(due)
        verdict = count_failures(
            [(i.state is InstanceState.STARTING, r) for i, r in zip(due, results, strict=True)])
        if verdict.overloaded:
            log.warning("health checks of %d of %d instances timed out at once: the controller "
                        "is likely starved of CPU; not counting them against the instances",
                        verdict.uncounted, verdict.ready)
        for inst, result, failed in zip(due, results, verdict.failed, strict=True):
            self._last_health[inst.id] = now
            if inst.state.terminal or self.registry.stopping(inst):
                continue  # ended while the sweep ran
            self._after_probe(inst, result is Probe.OK, failed)

    def _after_probe(self, inst: Instance, ok: bool, failed: bool) -> None:
        if inst.state is InstanceState.STARTING:
            if ok:
                self.guard.started(inst.role)
                self.registry.mark_ready(inst)
        elif ok:
            self.registry.healthy(inst)
        elif failed and self.registry.unhealthy(inst) >= self.settings.controller.unhealthy_after:
            # An engine whose process has ended meanwhile failed for that reason.
            ended = self.launcher.exit_reason(launched(inst)) if inst.handle else None
            self._fail(inst, ended or f"{inst.health_failures} failed health checks")

    def capacity(self) -> FleetCapacity:
        """``(accelerators per node, nodes, instances per accelerator)``."""
        return capacity_of(self.settings, self.launcher)

    def _plan_input(self, targets: dict[Role, PoolTarget]) -> FleetState:
        observed = tuple(
            Member(i.id, i.role, i.tp, i.state, self.table.inflight(i.id), i.created_at,
                     i.drain_started_at, i.kv_mode, self.table.handles_out(i.id))
            for i in self.registry.live())
        capacity = Capacity(*self.capacity(), self.registry.used_slots())
        return FleetState(targets, observed, capacity, self.clock(),
                         self.settings.controller.drain_timeout_s,
                         dict(self.guard.backoff_until))

    async def _act(self, action: Action) -> None:
        if isinstance(action, Start):
            await self._start(action)
        elif isinstance(action, Drain):
            inst = self.registry.get(action.instance_id)
            if inst is not None and inst.state is InstanceState.READY:
                self.registry.drain(inst, action.reason)
        elif isinstance(action, Stop):
            inst = self.registry.get(action.instance_id)
            if inst is not None and not self.registry.stopping(inst):
                self._spawn(self._stop(inst, action.reason, InstanceState.STOPPED))

    def _next_id(self, role: Role) -> str:
        store = self.registry.store
        seq = int(store.get("instance_seq") or 0) + 1
        store.put("instance_seq", seq)
        return f"{role.value}-{seq}"

    async def _start(self, action: Start) -> None:
        """Register the instance (it holds its slots from now on), then launch it in the
        background: a Ray placement may take a while, and the loop must not wait on it."""
        per_node, _, share = self.capacity()
        accel = tuple(placement.physical(s, per_node, share) for s in action.slots)
        iid = self._next_id(action.role)
        log_path = (self.settings.controller.state_dir / "logs" / f"{iid}.log").resolve()
        inst = Instance(iid, action.role, action.tp, "", created_at=self.clock(),
                        accelerators=accel, slots=action.slots, kv_mode=action.kv_mode)
        self.registry.add(inst, action.reason)
        task = asyncio.get_running_loop().create_task(
            self._launch(inst, LaunchSpec(iid, action.role, action.tp, accel, log_path,
                                          action.kv_mode)))
        self._launching[iid] = task
        task.add_done_callback(lambda _: self._launching.pop(iid, None))
        await asyncio.sleep(0)  # a local launch completes here, within this tick

    async def _launch(self, inst: Instance, spec: LaunchSpec) -> None:
        try:
            handle = await self.launcher.start(spec)
        except (LaunchError, OSError) as exc:
            if not inst.state.terminal and not self.registry.stopping(inst):
                self.registry.fail(inst, f"launch failed: {exc}")
                self.guard.launch_failed(inst.role, self.clock())
            return
        self.registry.launched(inst, handle)
        self._wake.set()

    async def _stop(self, inst: Instance, why: str, final_state: InstanceState | None
                    ) -> None:
        self.registry.begin_stop(inst)
        try:
            pending = self._launching.get(inst.id)
            if pending is not None:  # still being placed: a cancelled start leaves nothing
                pending.cancel()
                await asyncio.gather(pending, return_exceptions=True)
            if inst.handle is not None:
                await self.launcher.stop(launched(inst))
        finally:
            self.registry.end_stop(inst, final_state, why)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def poll_load(self) -> None:
        """Refresh running/waiting/KV usage and NIXL counters of serving instances."""
        serving = self.registry.serving()
        polled = []
        for iid, load in (await self.observer.poll(serving)).items():
            inst = self.registry.get(iid)
            if inst is None:
                continue
            before = self._last_load.get(iid)
            why = None if before is None else restart_reason(before, load)
            if why is not None:
                self.registry.restarted(inst, why, self.table.void_handles(iid))
            self._last_load[iid] = load
            self.registry.apply_load(inst, load)
            polled.append(inst)
        self.load_history.record(polled)

    async def run_load_poller(self, after: Callable[[list[Instance]], None] | None = None
                              ) -> None:
        """Poll the engines' /metrics forever; ``after`` sees the live instances each time."""
        while True:
            with contextlib.suppress(Exception):
                await self.poll_load()
                if after is not None:
                    after([i for i in self.registry if not i.state.terminal])
            await asyncio.sleep(self.settings.controller.metrics_poll_s)

    async def shutdown(self) -> None:
        """Stop every instance this controller started; wait for the stops to finish."""
        await asyncio.gather(*(self._stop(i, "controller shutdown", InstanceState.STOPPED)
                               for i in self.registry.live()))
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.launcher.close()
        await self.observer.close()

    # ---- views -------------------------------------------------------------------------

    def ready(self, role: Role) -> list[Instance]:
        return self.registry.ready(role)

    def pool_view(self, role: Role) -> dict[str, Any]:
        target = self.desired.targets[role]
        mine = [i for i in self.registry if i.role is role]
        counts = {s: sum(1 for i in mine if i.state is s) for s in InstanceState}
        wanted = [i for i in mine if i.state.routable and i.tp == target.tp
                  and i.kv_mode == target.kv_mode]
        at_tp = len(wanted)
        others = sum(1 for i in mine if not i.state.terminal and i not in wanted)
        now = self.clock()
        q = self.guard.active(role, now)
        return {
            "desired": target_json(target),
            "actual": {"ready": counts[InstanceState.READY],
                       "starting": counts[InstanceState.STARTING],
                       "draining": counts[InstanceState.DRAINING],
                       "ready_at_desired_tp": at_tp},
            "converged": at_tp == target.size and others == 0,
            "quarantine": q.public(now) if q is not None else None,
            "valid_tp": self.desired.valid_tps(role),
        }
