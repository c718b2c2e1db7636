"""The cluster: desired pools, the instance registry, and the loop that converges them.

This is the one place that knows pool membership. The loop observes (process exits, health,
engine load), asks ``reconciler.plan`` what to do, and applies the actions through the
launcher. Every accepted change and every instance transition lands in the audit log.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import signal
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from controller import placement, validation
from controller.config import RoutingSettings, Settings
from controller.errors import InvalidChange, LaunchError, NotFound
from controller.launchers.base import Launched, Launcher, LaunchSpec
from controller.models import Instance, InstanceState, Role
from controller.reconciler import Action, Drain, Observed, PlanInput, PoolTarget, Start, Stop, plan
from controller.router.policies import Policy, make_policy
from controller.store import Store

log = logging.getLogger("pdctl.cluster")

RETAIN_TERMINAL_S = 600.0  # failed/stopped instances stay visible this long
SUSPECT_S = 2.0
MAX_BACKOFF_S = 30.0
QUARANTINE_BASE_S = 30.0  # first quarantine; doubles with every further crash in the window
MAX_QUARANTINE_S = 600.0
LOAD_SERIES = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:kv_cache_usage_perc": "kv_usage",
    "vllm:nixl_xfer_time_seconds_sum": "nixl_xfer_s",
    "vllm:nixl_xfer_time_seconds_count": "nixl_xfers",
    "vllm:nixl_bytes_transferred_sum": "nixl_bytes",
    "vllm:nixl_num_kv_expired_reqs_total": "kv_expired",
    "vllm:nixl_num_notifications_after_expiry_total": "kv_after_expiry",
}


def parse_load(text: str) -> dict[str, float]:
    """Sum the load and NIXL series of a vLLM /metrics page (an engine may expose several)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        field = LOAD_SERIES.get(name)
        if field:
            with contextlib.suppress(ValueError, IndexError):
                out[field] = out.get(field, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def apply_load(inst: Instance, load: dict[str, float]) -> None:
    """Update an instance from its parsed /metrics, including the mean NIXL transfer time
    of the transfers completed since the previous poll."""
    inst.running = load.get("running", 0.0)
    inst.waiting = load.get("waiting", 0.0)
    inst.kv_usage = load.get("kv_usage", 0.0)
    xfers = load.get("nixl_xfers", 0.0)
    if xfers > inst.nixl_xfers:
        seconds = load.get("nixl_xfer_s", 0.0) - inst.nixl_xfer_s
        inst.recent_xfer_ms = max(0.0, seconds / (xfers - inst.nixl_xfers) * 1e3)
    inst.nixl_xfers = xfers
    inst.nixl_xfer_s = load.get("nixl_xfer_s", 0.0)
    inst.nixl_bytes = load.get("nixl_bytes", 0.0)
    inst.kv_expired = load.get("kv_expired", 0.0)
    inst.kv_after_expiry = load.get("kv_after_expiry", 0.0)


class Probe(enum.Enum):
    OK = "ok"
    DOWN = "down"  # refused, reset, or answered with an error
    TIMEOUT = "timeout"


def exit_reason(code: int) -> str:
    """``process exited with status -4 (SIGILL)``: a signal's name where there is one."""
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"process exited with status {code} ({signal.Signals(-code).name})"
    return f"process exited with status {code}"


@dataclass(frozen=True)
class Quarantine:
    """A pool whose engines keep crashing in service: no restart before ``until``."""

    until: float  # cluster clock
    crashes: int  # in the crash window
    last_error: str

    def public(self, now: float) -> dict[str, Any]:
        return {"remaining_s": round(max(0.0, self.until - now), 1), "crashes": self.crashes,
                "last_error": self.last_error}


def quarantine_s(crashes: int, after: int) -> float | None:
    """How long a pool with ``crashes`` crashes in the window waits before its next start;
    None below the ``after`` threshold."""
    if crashes < after:
        return None
    return min(MAX_QUARANTINE_S, QUARANTINE_BASE_S * 2 ** (crashes - after))


@dataclass(frozen=True)
class SweepVerdict:
    failed: tuple[bool, ...]  # per probe: counts as a failed health check
    ready: int  # ready instances probed
    uncounted: int  # their timeouts not counted (most of them timed out at once)

    @property
    def overloaded(self) -> bool:
        return self.uncounted > 0


OVERLOAD_MIN = 2  # timeouts in one sweep before "all timed out" reads as controller overload


def count_failures(sweep: list[tuple[bool, Probe]]) -> SweepVerdict:
    """Which probes of one health sweep count against their instance. ``sweep`` holds
    ``(starting, result)`` per probed instance.

    An instance that refuses or answers with an error always counts. A timeout counts unless
    most ready instances timed out in the same sweep: engines do not all hang at once, but a
    controller starved of CPU sees every probe time out -- failing the whole fleet then would
    turn an overload into an outage. Starting instances never count (the start timeout
    covers them)."""
    ready = [r for starting, r in sweep if not starting]
    timeouts = sum(r is Probe.TIMEOUT for r in ready)
    starved = timeouts >= OVERLOAD_MIN and timeouts * 2 > len(ready)
    return SweepVerdict(
        tuple(not starting and (r is Probe.DOWN or (r is Probe.TIMEOUT and not starved))
              for starting, r in sweep),
        len(ready), timeouts if starved else 0)


class Cluster:
    def __init__(self, settings: Settings, store: Store, launcher: Launcher,
                 client: httpx.AsyncClient, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.store = store
        self.launcher = launcher
        self.client = client
        self.clock = clock
        self.model = settings.model_profile
        self.hw = settings.hardware.profile
        self.instances: dict[str, Instance] = {}
        self.targets = self._initial_targets()
        self.routing = self._initial_routing()
        self._policies: dict[Role, Policy] = {}
        self._ready: dict[Role, list[Instance]] = {r: [] for r in Role}
        self._stopping: set[str] = set()
        self._fail_streak: dict[Role, int] = dict.fromkeys(Role, 0)
        self._backoff_until: dict[Role, float] = dict.fromkeys(Role, 0.0)
        self._crashes: dict[Role, deque[float]] = {r: deque() for r in Role}
        self.quarantine: dict[Role, Quarantine | None] = dict.fromkeys(Role)
        self._last_health: dict[str, float] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._wake = asyncio.Event()
        self._reset_policies()

    # ---- desired state ---------------------------------------------------------------

    def _config_targets(self) -> dict[Role, PoolTarget]:
        p = self.settings.pools
        return {Role.PREFILL: PoolTarget(p.prefill.size, p.prefill.tp),
                Role.DECODE: PoolTarget(p.decode.size, p.decode.tp)}

    def _initial_targets(self) -> dict[Role, PoolTarget]:
        config = self._config_targets()
        stored = self.store.get("desired")
        if stored is None or not self.launcher.managed:
            self.store.put("desired", _targets_json(config))
            return config
        targets = {Role(r): PoolTarget(int(v["size"]), int(v["tp"])) for r, v in stored.items()}
        hw = self.settings.hardware
        try:
            validation.check_targets(targets, model=self.model, hw=self.hw,
                                     per_node=hw.per_node, nodes=hw.nodes, share=hw.share)
        except (InvalidChange, KeyError) as exc:
            self.store.record("controller", "desired.reset", "pools", _targets_json(targets),
                              _targets_json(config), f"stored pools invalid here: {exc}")
            self.store.put("desired", _targets_json(config))
            return config
        return targets

    def _initial_routing(self) -> RoutingSettings:
        stored = self.store.get("routing")
        if stored is not None:
            with contextlib.suppress(ValueError):
                return RoutingSettings.model_validate(stored)
        self.store.put("routing", self.settings.routing.model_dump())
        return self.settings.routing

    def _reset_policies(self) -> None:
        self._policies = {Role.PREFILL: make_policy(self.routing.prefill_policy),
                          Role.DECODE: make_policy(self.routing.decode_policy)}

    def set_pool(self, role: Role, size: int | None, tp: int | None, actor: str
                 ) -> PoolTarget:
        """Validate and apply a desired-state change; raises InvalidChange, changes nothing."""
        hw = self.settings.hardware
        new = validation.check_change(
            self.targets, role, size, tp, model=self.model, hw=self.hw,
            per_node=hw.per_node, nodes=hw.nodes, managed=self.launcher.managed,
            share=hw.share)
        before = _target_json(self.targets[role])
        self.targets = new
        self.store.put("desired", _targets_json(new))
        self.store.record(actor, "pool.update", role.value, before, _target_json(new[role]))
        self._wake.set()
        return new[role]

    def preview_pool(self, role: Role, size: int | None, tp: int | None) -> list[Action]:
        """The actions the next reconcile step would take for ``role`` if the change were
        applied now (a dry run); raises InvalidChange like ``set_pool``, changes nothing."""
        hw = self.settings.hardware
        new = validation.check_change(
            self.targets, role, size, tp, model=self.model, hw=self.hw,
            per_node=hw.per_node, nodes=hw.nodes, managed=self.launcher.managed,
            share=hw.share)
        inp = self._plan_input()
        planned = plan(PlanInput(new, inp.instances, inp.free_accelerators, inp.now,
                                 inp.drain_timeout_s, frozenset(Role)))
        mine = {i.id for i in inp.instances if i.role is role}
        return [a for a in planned
                if (a.role is role if isinstance(a, Start) else a.instance_id in mine)]

    def set_routing(self, patch: dict[str, Any], actor: str) -> RoutingSettings:
        if not patch:
            raise InvalidChange("nothing to change: give at least one routing field")
        before = self.routing.model_dump()
        try:
            new = RoutingSettings.model_validate({**before, **patch})
        except ValueError as exc:
            raise InvalidChange(str(exc)) from None
        self.routing = new
        self.store.put("routing", new.model_dump())
        changed = {k: v for k, v in new.model_dump().items() if before.get(k) != v}
        self.store.record(actor, "routing.update", "routing",
                          {k: before[k] for k in changed}, changed)
        if {"prefill_policy", "decode_policy"} & changed.keys():
            self._reset_policies()
        return new

    def drain(self, instance_id: str, actor: str) -> Instance:
        inst = self.instances.get(instance_id)
        if inst is None:
            raise NotFound(f"no instance {instance_id!r}")
        if inst.state not in (InstanceState.READY, InstanceState.STARTING):
            raise InvalidChange(f"instance {instance_id} is {inst.state.value}; only ready or "
                                "starting instances can be drained")
        self._drain(inst, f"operator drain by {actor}", actor)
        self._wake.set()
        return inst

    # ---- routing view ------------------------------------------------------------------

    def ready(self, role: Role) -> list[Instance]:
        return self._ready[role]

    def pick(self, role: Role, exclude: set[str]) -> Instance | None:
        """An instance of ``role`` for the next request, by the role's policy."""
        pool = self._ready[role]
        now = self.clock()
        candidates = [i for i in pool if i.id not in exclude and i.suspect_until <= now]
        if not candidates:
            candidates = [i for i in pool if i.id not in exclude]
        if not candidates:
            return None
        return self._policies[role].choose(candidates)

    def report_unreachable(self, inst: Instance, error: str) -> None:
        """The router could not reach ``inst``: avoid it briefly and check it soon."""
        if inst.state.terminal:
            return  # already failed or stopped; keep the reason recorded then
        inst.suspect_until = self.clock() + SUSPECT_S
        inst.last_error = error
        self._last_health.pop(inst.id, None)
        self._wake.set()

    def _refresh_membership(self) -> None:
        for role in Role:
            self._ready[role] = sorted(
                (i for i in self.instances.values() if i.role is role and i.state.routable),
                key=lambda i: i.id)

    # ---- transitions -------------------------------------------------------------------

    def _transition(self, inst: Instance, state: InstanceState, actor: str, detail: str
                    ) -> None:
        before = inst.state
        inst.state = state
        self.store.record(actor, f"instance.{state.value}", inst.id, before.value, state.value,
                          detail)
        log.info("%s %s -> %s (%s)", inst.id, before.value, state.value, detail)
        self._refresh_membership()

    def _drain(self, inst: Instance, why: str, actor: str = "reconciler") -> None:
        inst.drain_started_at = self.clock()
        self._transition(inst, InstanceState.DRAINING, actor, why)

    def _fail(self, inst: Instance, why: str) -> None:
        in_service = inst.state in (InstanceState.READY, InstanceState.DRAINING)
        inst.last_error = why
        inst.ended_at = self.clock()
        self._transition(inst, InstanceState.FAILED, "controller", why)
        streak = self._fail_streak[inst.role] = self._fail_streak[inst.role] + 1
        self._backoff_until[inst.role] = self.clock() + min(MAX_BACKOFF_S, 0.5 * 2**streak)
        if in_service:
            self._crashed(inst.role, why)
        if self.launcher.exit_code(_launched(inst)) is None:
            self._spawn(self._stop_process(inst, why, final_state=None))

    def _crashed(self, role: Role, why: str) -> None:
        """Count a crash in service; enough of them in the window quarantine the pool. A
        pool's readiness does not end it (an engine that dies on its first request of a kind
        becomes ready every time); only the window forgets crashes."""
        cs, now = self.settings.controller, self.clock()
        crashes = self._crashes[role]
        crashes.append(now)
        while crashes and crashes[0] < now - cs.crash_window_s:
            crashes.popleft()
        wait = quarantine_s(len(crashes), cs.quarantine_after)
        if wait is None:
            return
        q = Quarantine(now + wait, len(crashes), why)
        self.quarantine[role] = q
        self._backoff_until[role] = max(self._backoff_until[role], q.until)
        self.store.record("controller", "pool.quarantined", role.value, None,
                          q.public(now), f"{len(crashes)} crashes in service within "
                          f"{cs.crash_window_s:g} s (last: {why}); no new {role.value} "
                          f"instance for {wait:g} s")
        log.warning("%s pool quarantined for %g s after %d crashes (last: %s)", role.value,
                    wait, len(crashes), why)

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
        self._check_exits()
        await self._check_health()
        self._purge_terminal()
        for action in plan(self._plan_input()):
            await self._apply(action)

    def _check_exits(self) -> None:
        for inst in list(self.instances.values()):
            if inst.state.terminal or inst.id in self._stopping:
                continue
            code = self.launcher.exit_code(_launched(inst))
            if code is not None:
                self._fail(inst, exit_reason(code))

    async def _check_health(self) -> None:
        now = self.clock()
        cs = self.settings.controller
        due = []
        for inst in self.instances.values():
            if inst.id in self._stopping or inst.state.terminal:
                continue
            if inst.state is InstanceState.STARTING:
                if now - inst.created_at > cs.start_timeout_s:
                    self._fail(inst, f"not ready after {cs.start_timeout_s:.0f} s")
                    continue
                due.append(inst)
            elif now - self._last_health.get(inst.id, 0.0) >= cs.health_interval_s:
                due.append(inst)
        results = await asyncio.gather(*(self._probe(i) for i in due))
        counted = count_failures(
            [(i.state is InstanceState.STARTING, r) for i, r in zip(due, results, strict=True)])
        if counted.overloaded:
            log.warning("health checks of %d of %d instances timed out at once: the controller "
                        "is likely starved of CPU; not counting them against the instances",
                        counted.uncounted, counted.ready)
        for inst, result, failed in zip(due, results, counted.failed, strict=True):
            self._after_probe(inst, result is Probe.OK, failed, now)

    async def _probe(self, inst: Instance) -> Probe:
        try:
            r = await self.client.get(f"{inst.url}/health",
                                      timeout=self.settings.controller.health_timeout_s)
        except httpx.TimeoutException:
            return Probe.TIMEOUT
        except httpx.HTTPError:
            return Probe.DOWN
        return Probe.OK if r.status_code == 200 else Probe.DOWN

    def _after_probe(self, inst: Instance, ok: bool, failed: bool, now: float) -> None:
        self._last_health[inst.id] = now
        if inst.state.terminal or inst.id in self._stopping:
            return
        if inst.state is InstanceState.STARTING:
            if ok:
                inst.ready_at = now
                self._fail_streak[inst.role] = 0
                took = now - inst.created_at
                self._transition(inst, InstanceState.READY, "controller",
                                 f"healthy after {took:.1f} s")
            return
        if ok:
            inst.health_failures = 0
            inst.suspect_until = 0.0
            return
        if not failed:
            return
        inst.health_failures += 1
        if inst.health_failures >= self.settings.controller.unhealthy_after:
            self._fail(inst, f"{inst.health_failures} failed health checks")

    def _purge_terminal(self) -> None:
        now = self.clock()
        for inst in list(self.instances.values()):
            if inst.state.terminal and now - (inst.ended_at or now) > RETAIN_TERMINAL_S:
                del self.instances[inst.id]
                self._last_health.pop(inst.id, None)

    def _plan_input(self) -> PlanInput:
        now = self.clock()
        observed = tuple(
            Observed(i.id, i.role, i.tp, i.state, i.inflight, i.created_at, i.drain_started_at)
            for i in self.instances.values()
            if not i.state.terminal and i.id not in self._stopping
        )
        may_start = frozenset(r for r in Role if now >= self._backoff_until[r])
        return PlanInput(self.targets, observed, self._free_accelerators(), now,
                         self.settings.controller.drain_timeout_s, may_start)

    def _used_slots(self) -> set[int]:
        used: set[int] = set()
        for inst in self.instances.values():
            if inst.state.holds_accelerators or inst.id in self._stopping:
                used.update(inst.slots)
        return used

    def _free_accelerators(self) -> int:
        hw = self.settings.hardware
        return hw.total_accelerators * hw.share - len(self._used_slots())

    async def _apply(self, action: Action) -> None:
        if isinstance(action, Start):
            await self._start(action)
        elif isinstance(action, Drain):
            inst = self.instances.get(action.instance_id)
            if inst is not None and inst.state is InstanceState.READY:
                self._drain(inst, action.reason)
        elif isinstance(action, Stop):
            inst = self.instances.get(action.instance_id)
            if inst is not None and inst.id not in self._stopping:
                self._spawn(self._stop_process(inst, action.reason, InstanceState.STOPPED))

    def _next_id(self, role: Role) -> str:
        seq = int(self.store.get("instance_seq") or 0) + 1
        self.store.put("instance_seq", seq)
        return f"{role.value}-{seq}"

    async def _start(self, action: Start) -> None:
        hw = self.settings.hardware
        slots = placement.allocate(self._used_slots(), hw.per_node, hw.nodes, action.tp,
                                   hw.share)
        if slots is None:
            log.warning("no free accelerators for %s TP %d", action.role.value, action.tp)
            return
        accel = tuple(placement.physical(s, hw.per_node, hw.share) for s in slots)
        iid = self._next_id(action.role)
        log_path = self.settings.controller.state_dir / "logs" / f"{iid}.log"
        spec = LaunchSpec(iid, action.role, action.tp, accel, log_path)
        try:
            launched = await self.launcher.start(spec)
        except LaunchError as exc:
            self.store.record("reconciler", "instance.launch_failed", iid, None, None, str(exc))
            self._backoff_until[action.role] = self.clock() + MAX_BACKOFF_S
            return
        inst = Instance(iid, action.role, action.tp, launched.url, created_at=self.clock(),
                        accelerators=accel, slots=slots, handle=launched)
        self.instances[iid] = inst
        self.store.record("reconciler", "instance.starting", iid, None,
                          {"role": action.role.value, "tp": action.tp, "url": launched.url,
                           "accelerators": list(accel)}, action.reason)

    async def _stop_process(self, inst: Instance, why: str,
                            final_state: InstanceState | None) -> None:
        self._stopping.add(inst.id)
        try:
            await self.launcher.stop(_launched(inst))
        finally:
            self._stopping.discard(inst.id)
            inst.ended_at = self.clock()
            if final_state is not None:
                self._transition(inst, final_state, "reconciler", why)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def poll_load(self) -> None:
        """Refresh running/waiting/KV usage of serving instances from their /metrics."""
        live = [i for i in self.instances.values()
                if i.state in (InstanceState.READY, InstanceState.DRAINING)]
        texts = await asyncio.gather(*(self._fetch_metrics(i) for i in live))
        for inst, text in zip(live, texts, strict=True):
            if text is not None:
                apply_load(inst, parse_load(text))

    async def _fetch_metrics(self, inst: Instance) -> str | None:
        try:
            r = await self.client.get(f"{inst.url}/metrics", timeout=2.0)
            return r.text if r.status_code == 200 else None
        except httpx.HTTPError:
            return None

    async def run_load_poller(self, after: Callable[[list[Instance]], None] | None = None
                              ) -> None:
        """Poll the engines' /metrics forever; ``after`` sees the live instances each time."""
        while True:
            with contextlib.suppress(Exception):
                await self.poll_load()
                if after is not None:
                    after([i for i in self.instances.values() if not i.state.terminal])
            await asyncio.sleep(self.settings.controller.metrics_poll_s)

    async def shutdown(self) -> None:
        """Stop every instance this controller started; wait for the stops to finish."""
        live = [i for i in self.instances.values()
                if not i.state.terminal and i.id not in self._stopping]
        await asyncio.gather(*(self._stop_process(i, "controller shutdown",
                                                  InstanceState.STOPPED) for i in live))
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.launcher.close()

    # ---- views -------------------------------------------------------------------------

    def pool_view(self, role: Role) -> dict[str, Any]:
        target = self.targets[role]
        mine = [i for i in self.instances.values() if i.role is role]
        counts = {s.value: sum(1 for i in mine if i.state is s) for s in InstanceState}
        ready_at_tp = sum(1 for i in mine if i.state.routable and i.tp == target.tp)
        others = sum(1 for i in mine if not i.state.terminal
                     and not (i.state.routable and i.tp == target.tp))
        q = self.quarantine[role]
        now = self.clock()
        return {
            "desired": _target_json(target),
            "actual": {"ready": counts["ready"], "starting": counts["starting"],
                       "draining": counts["draining"], "ready_at_desired_tp": ready_at_tp},
            "converged": ready_at_tp == target.size and others == 0,
            "quarantine": q.public(now) if q is not None and q.until > now else None,
        }

    def used_accelerators(self) -> int:
        """Distinct accelerators that hold at least one instance."""
        return len({a for i in self.instances.values()
                    if i.state.holds_accelerators for a in i.accelerators})


def _launched(inst: Instance) -> Launched:
    assert isinstance(inst.handle, Launched)
    return inst.handle


def _target_json(t: PoolTarget) -> dict[str, int]:
    return {"size": t.size, "tp": t.tp}


def _targets_json(targets: dict[Role, PoolTarget]) -> dict[str, dict[str, int]]:
    return {r.value: _target_json(t) for r, t in targets.items()}
