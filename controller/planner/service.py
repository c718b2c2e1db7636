"""The planner loop: every interval, observe -> predict -> decide -> act.

``Planner`` owns the planner's live settings (mode, targets, interval, predictor; kept in the
store so that a restart keeps an operator's choice), its predictor and its history of
decisions. ``step`` is one pass; ``run`` calls it every interval. In ``apply`` mode a decision
is carried out through ``Fleet.set_pool`` -- the operator's validated path -- under the app's
write lock, recorded in the audit log with actor ``planner`` and the reasons."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from controller.config import PlannerMode, Settings
from controller.errors import InvalidChange
from controller.fleet import Fleet
from controller.metrics import Metrics
from controller.models import InstanceState, Role
from controller.planner.decide import (
    Bounds,
    PlannerTargets,
    Pools,
    ScaleDecision,
    Stability,
    decide,
    stability_at,
)
from controller.planner.lookahead import Foresight, Lookahead, Present, look_ahead
from controller.planner.observe import Window, observe, observed_json, ready
from controller.planner.predict import LoadPredictor, PredictorName
from controller.planner.profile import PerfProfile, ProfileIndex, profile_key
from controller.planner.tp_advice import TpAdvice, advise_tp
from controller.requests_log import RequestLog
from controller.store import Store
from controller.whatif.live import live_spec, recent_traffic

log = logging.getLogger("pdctl.planner")
HISTORY = 720  # decisions kept (a day at 120 s)
STUCK_INTERVALS = 3  # a change still starting after this many intervals holds nothing back
PLANNER_ACTOR = "planner"


@dataclass
class Live:
    """What the API may change while the controller runs."""

    mode: PlannerMode
    ttft_ms: float
    itl_ms: float
    interval_s: float
    predictor: PredictorName

    def public(self) -> dict[str, Any]:
        return {"mode": self.mode, "ttft_ms": self.ttft_ms, "itl_ms": self.itl_ms,
                "interval_s": self.interval_s, "predictor": self.predictor}


@dataclass(frozen=True)
class Plan:
    """One pass of the loop, as the API shows it."""

    at: float
    mode: PlannerMode
    current: dict[str, int]
    recommended: dict[str, int]
    reasons: tuple[str, ...]
    hold: str | None
    observed: dict[str, Any] | None
    predicted: dict[str, float] | None
    applied: bool = False
    error: str | None = None
    tp_advice: dict[str, Any] | None = None  # a pool's size and TP to review (never applied)

    def public(self) -> dict[str, Any]:
        return {"at": self.at, "mode": self.mode, "current": self.current,
                "recommended": self.recommended, "reasons": list(self.reasons),
                "hold": self.hold, "observed": self.observed, "predicted": self.predicted,
                "applied": self.applied, "error": self.error, "tp_advice": self.tp_advice}


@dataclass
class _Marks:
    """Where the current interval started: the gap histogram, the arrival counts, the time."""

    gaps: np.ndarray
    arrived: tuple[int, int]
    at: float
    last_targets: dict[Role, tuple[int, int]] = field(default_factory=dict)
    changed_at: float | None = None  # when the pools' desired state last changed


class Planner:
    def __init__(self, settings: Settings, fleet: Fleet, requests: RequestLog,
                 metrics: Metrics, store: Store, writes: asyncio.Lock,
                 clock: Callable[[], float] = time.time,
                 arrivals: Callable[[], tuple[int, int]] | None = None) -> None:
        """``arrivals``: the router's count of requests that arrived and of their prompt
        tokens, since it started."""
        ps = settings.planner
        self.settings, self.fleet, self.requests = settings, fleet, requests
        self.metrics, self.store, self.writes, self.clock = metrics, store, writes, clock
        self.index = ProfileIndex(ps.profile_dir)
        stored = store.get("planner") or {}
        self.live = Live(**{**{"mode": ps.mode, "ttft_ms": ps.ttft_ms, "itl_ms": ps.itl_ms,
                               "interval_s": ps.interval_s, "predictor": ps.predictor},
                            **{k: v for k, v in stored.items()
                               if k in ("mode", "ttft_ms", "itl_ms", "interval_s",
                                        "predictor")}})
        self.predictor = LoadPredictor(self.live.predictor)
        self.history: deque[Plan] = deque(maxlen=HISTORY)
        self.arrivals = arrivals
        self._marks = _Marks(metrics.gaps.snapshot(), arrivals() if arrivals else (0, 0),
                             clock())
        self._wake = asyncio.Event()
        self.next_at: float | None = None
        if self.live.mode != "off" and self.problem() is not None:
            log.warning("planner: %s; it stays off", self.problem())
            self.live.mode = "off"

    # ---- what it plans with ------------------------------------------------------------

    @property
    def time_scale(self) -> float:
        return self.settings.time_scale

    def profile_name(self, role: Role) -> str:
        s = self.settings
        return profile_key(s.backend, s.model.profile_name, s.hardware.accelerator,
                           self.fleet.targets[role].tp)

    def profiles(self) -> dict[Role, PerfProfile | None]:
        s = self.settings
        return {r: self.index.find(s.backend, s.model.profile_name, s.hardware.accelerator,
                                   self.fleet.targets[r].tp) for r in Role}

    def problem(self) -> str | None:
        """Why the planner cannot run on these pools, or None."""
        if self.settings.backend == "external":
            return "the planner sizes pools the controller runs; backend external has none"
        missing = [self.profile_name(r) for r, p in self.profiles().items() if p is None]
        if missing:
            known = ", ".join(self.index.known()) or "none"
            return (f"no performance profile for {' and '.join(sorted(set(missing)))}: "
                    f"`pdctl profile` measures one (planner.profile_dir adds it); known: "
                    f"{known}")
        return None

    def bounds(self) -> Bounds:
        ps = self.settings.planner
        per_node, nodes, share = self.fleet.capacity()
        total = per_node * nodes * share
        t = self.fleet.targets
        return Bounds(
            min_prefill=ps.min_prefill,
            max_prefill=ps.max_prefill if ps.max_prefill is not None
            else total // t[Role.PREFILL].tp,
            min_decode=ps.min_decode,
            max_decode=ps.max_decode if ps.max_decode is not None
            else total // t[Role.DECODE].tp,
            accelerator_budget=ps.accelerator_budget or total)

    def pools(self) -> Pools:
        t = self.fleet.targets
        return Pools(t[Role.PREFILL].size, t[Role.PREFILL].tp, t[Role.DECODE].size,
                     t[Role.DECODE].tp)

    # ---- live changes ------------------------------------------------------------------

    def update(self, patch: dict[str, Any], actor: str) -> Live:
        """Change mode, targets, interval or predictor; InvalidChange changes nothing."""
        if not patch:
            raise InvalidChange("nothing to change: give at least one planner field")
        new = replace(self.live, **patch)
        if new.mode != "off":
            why = self.problem()
            if why is not None:
                raise InvalidChange(f"the planner cannot run: {why}", "mode")
        before = self.live.public()
        self.store.change("planner", new.public(), actor, "planner.update", "planner", before,
                          new.public())
        if new.predictor != self.live.predictor:
            self.predictor = LoadPredictor(new.predictor)
        self.live = new
        if new.mode == "off":
            self.metrics.planner_recommended.clear()
        self._wake.set()
        return new

    # ---- one pass ----------------------------------------------------------------------

    def _stability(self, now: float) -> Stability:
        t = self.fleet.targets
        shape = {r: (t[r].size, t[r].tp) for r in Role}
        m = self._marks
        if shape != m.last_targets:
            if m.last_targets:
                m.changed_at = now
            m.last_targets = shape
        starting = any(i.state is InstanceState.STARTING for i in self.fleet.registry)
        ps = self.settings.planner
        return stability_at(now, starting, m.changed_at, self.live.interval_s, ps.cooldown_s,
                            ps.scale_down_utilization, STUCK_INTERVALS)

    def step(self) -> Plan:
        """Observe the interval that just ended, predict the next, decide; no action."""
        now = self.clock()
        m = self._marks
        gaps = self.metrics.gaps.snapshot()
        gap_p95 = self.metrics.gaps.quantile(gaps - m.gaps, 0.95)
        arrived = self.arrivals() if self.arrivals else None
        span = max(1e-3, now - m.at) if arrived is not None else self.live.interval_s
        instances = list(self.fleet.registry)
        window = Window(span, self.requests.finished(span, now), gap_p95,
                        ready(instances, Role.DECODE), ready(instances, Role.PREFILL),
                        None if arrived is None else arrived[0] - m.arrived[0],
                        0 if arrived is None else arrived[1] - m.arrived[1])
        m.gaps, m.at = gaps, now
        if arrived is not None:
            m.arrived = arrived
        obs = observe(window, self.time_scale)
        min_requests = self.settings.planner.min_requests
        if obs.requests >= min_requests:
            self.predictor.update(obs.load)
        pred = self.predictor.predict()
        pools = self.pools()
        current = {"prefill": pools.prefill, "decode": pools.decode}
        profs = self.profiles()
        pp, dp = profs[Role.PREFILL], profs[Role.DECODE]
        if pp is None or dp is None:
            return Plan(now, self.live.mode, current, current, (), self.problem(),
                        observed_json(obs), None)
        decision: ScaleDecision = decide(
            obs if obs.requests >= min_requests else None, pred, pp, dp,
            PlannerTargets(self.live.ttft_ms, self.live.itl_ms), self.bounds(), pools,
            self._stability(now), min_requests)
        if decision.hold and decision.hold.startswith("no data"):
            decision = replace(decision, hold=decision.hold.replace(
                "0 finished", f"{obs.requests} finished"))
        return Plan(now, self.live.mode, current,
                    {"prefill": decision.prefill, "decode": decision.decode},
                    decision.reasons, decision.hold, observed_json(obs),
                    None if pred is None else {"request_rate": pred.request_rate,
                                               "prompt_tokens": pred.prompt_tokens,
                                               "output_tokens": pred.output_tokens})

    def act(self, plan: Plan) -> Plan:
        """Carry ``plan`` out in apply mode (the shrinking pool first, so that the other may
        take what it frees); the plan as recorded."""
        if plan.mode != "apply" or plan.hold is not None or plan.recommended == plan.current:
            return plan
        pools = self.pools()
        if {"prefill": pools.prefill, "decode": pools.decode} != plan.current:
            return replace(plan, error="the pools changed during the pass: not applied")
        detail = "; ".join(plan.reasons)
        order = sorted(Role, key=lambda r: plan.recommended[r.value] - plan.current[r.value])
        try:
            for role in order:
                if plan.recommended[role.value] != plan.current[role.value]:
                    self.fleet.set_pool(role, plan.recommended[role.value], None,
                                        PLANNER_ACTOR, detail)
        except InvalidChange as exc:
            log.warning("planner: change refused: %s", exc)
            return replace(plan, error=f"refused: {exc}")
        self._marks.changed_at = plan.at
        self._marks.last_targets = {r: (self.fleet.targets[r].size, self.fleet.targets[r].tp)
                                    for r in Role}
        return replace(plan, applied=True)

    def _foresight_job(self, plan: Plan) -> Callable[[], Foresight] | str | None:
        """The look-ahead of ``plan`` as a job to run off the event loop (its inputs read
        here), a reason it cannot run, or None when it should not."""
        ps = self.settings.planner
        if not ps.lookahead or plan.mode == "off" or plan.hold is not None:
            return None
        spec = live_spec(self.settings, self.live.ttft_ms)
        if isinstance(spec, str):
            return f"look-ahead: {spec}: not run"
        now = self.clock()
        recent = recent_traffic(self.requests, now, ps.lookahead_window_s, self.time_scale)
        if len(recent) < ps.min_requests:
            return f"look-ahead: {len(recent)} recent requests, too few: not run"
        observed = (plan.observed or {}).get("load", {}).get("request_rate") or 0.0
        predicted = (plan.predicted or {}).get("request_rate") or 0.0
        rate_scale = predicted / observed if observed > 0 and predicted > 0 else 1.0
        present = Present(self.pools(), [], ps.instance_start_s,
                          recent[-1].time_s - recent[0].time_s)
        proposal = (plan.recommended["prefill"], plan.recommended["decode"])
        la = Lookahead(window_s=ps.lookahead_window_s)
        bounds, ttft_ms = self.bounds(), self.live.ttft_ms
        may_shrink = not self._stability(now).cooling_down
        return lambda: look_ahead(recent, proposal, present, spec, la, bounds, ttft_ms,
                                  rate_scale, may_shrink)

    def _tp_job(self, plan: Plan) -> Callable[[], TpAdvice] | str | None:
        """The TP advice for ``plan``'s recommended sizes as a job to run off the event loop,
        a reason it cannot run, or None when it should not."""
        ps = self.settings.planner
        if not ps.tp_advice or plan.mode == "off":
            return None
        spec = live_spec(self.settings, self.live.ttft_ms)
        if isinstance(spec, str):
            return f"TP: {spec}: no advice"
        recent = recent_traffic(self.requests, self.clock(), ps.lookahead_window_s,
                                self.time_scale)
        if len(recent) < ps.min_requests:
            return f"TP: {len(recent)} recent requests, too few: no advice"
        pools = self.pools()
        counts = (plan.recommended["prefill"], plan.recommended["decode"])
        valid = {r: self.fleet.desired.valid_tps(r) for r in Role}
        return lambda: advise_tp(recent, pools, counts, valid, spec)

    async def _off_loop(self, plan: Plan) -> Plan:
        """``plan`` corrected by its look-ahead, then with its TP advice: seconds of
        discrete-event runs, off the event loop and unlocked; a failure leaves the planner's
        own sizes, with the reason."""
        job = self._foresight_job(plan)
        if isinstance(job, str):
            plan = replace(plan, reasons=(*plan.reasons, job))
        elif job is not None:
            try:
                f = await asyncio.to_thread(job)
            except Exception as exc:
                log.exception("planner look-ahead failed")
                plan = replace(plan, reasons=(*plan.reasons, f"look-ahead failed: {exc}"))
            else:
                plan = replace(plan, recommended={"prefill": f.prefill, "decode": f.decode},
                               reasons=(*plan.reasons, *f.reasons))
        tp = self._tp_job(plan)
        if isinstance(tp, str):
            return replace(plan, reasons=(*plan.reasons, tp))
        if tp is None:
            return plan
        try:
            advice = await asyncio.to_thread(tp)
        except Exception as exc:
            log.exception("planner TP advice failed")
            return replace(plan, reasons=(*plan.reasons, f"TP advice failed: {exc}"))
        chosen = None if advice.role is None else {
            "role": advice.role, "size": advice.counts[advice.role],
            "tp": advice.tp[advice.role]}
        return replace(plan, tp_advice=chosen, reasons=(*plan.reasons, *advice.reasons))

    async def tick(self) -> Plan:
        async with self.writes:
            plan = self.step()
        plan = await self._off_loop(plan)
        async with self.writes:
            plan = self.act(plan)
        self.history.append(plan)
        if plan.mode != "off":
            for role in Role:
                self.metrics.planner_recommended.labels(role.value).set(
                    plan.recommended[role.value])
        return plan

    async def run(self) -> None:
        """Every interval while the mode is not off; a mode change wakes it at once (and
        starts a fresh interval)."""
        while True:
            self._wake.clear()
            if self.live.mode == "off":
                self.next_at = None
                await self._wake.wait()
                self.begin_interval()
                continue
            self.next_at = self.clock() + self.live.interval_s
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.live.interval_s)
                self.begin_interval()
                continue  # woken by a change: a fresh interval under the new settings
            try:
                await self.tick()
            except Exception:  # the loop must survive a bad pass
                log.exception("planner pass failed")

    def begin_interval(self, at: float | None = None) -> None:
        """Start observing afresh (from ``at``, default now): the next pass sees only what
        happens from here."""
        m = self._marks
        m.gaps, m.at = self.metrics.gaps.snapshot(), self.clock() if at is None else at
        if self.arrivals:
            m.arrived = self.arrivals()
