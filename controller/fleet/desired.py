"""The desired pools: validated, persisted in the store, every accepted change recorded.

A pool is its size, TP and KV transfer mode (``controller.fleet.kv_mode``); a state stored by
an older controller, without a mode, is ``pull``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from controller.config import Settings
from controller.errors import ConfigError, InvalidChange
from controller.fleet.kv_mode import POOL_KV_MODES, kv_mode_refusal, push_capability
from controller.launchers.base import Launcher
from controller.models import PoolTarget, Role
from controller.sizing import fit
from controller.store import Store
from pdctl_api import profiles


def target_json(t: PoolTarget) -> dict[str, Any]:
    return {"size": t.size, "tp": t.tp, "kv_mode": t.kv_mode}


def targets_json(targets: dict[Role, PoolTarget]) -> dict[str, dict[str, Any]]:
    return {r.value: target_json(t) for r, t in targets.items()}


def target_of(stored: dict[str, Any]) -> PoolTarget:
    """A stored pool; one stored without a KV mode (an older controller's) is ``pull``."""
    mode = stored.get("kv_mode", "pull")
    if mode not in POOL_KV_MODES:
        raise ValueError(f"KV mode {mode!r} is neither pull nor push")
    return PoolTarget(int(stored["size"]), int(stored["tp"]), str(mode))


FleetCapacity = tuple[int, int, int]  # accelerators per node, nodes, instances per accelerator


def capacity_of(settings: Settings, launcher: Launcher) -> FleetCapacity:
    """The launcher's capacity (a Ray cluster's, read live) or the configured hardware's."""
    hw = settings.hardware
    known = launcher.capacity()
    return (*known, 1) if known is not None else (hw.per_node, hw.nodes, hw.share)


class Desired:
    """What the operator asked for. Starts from the store when the pools are managed and what
    is stored is still valid on this hardware, else from the config (recorded)."""

    def __init__(self, settings: Settings, store: Store, managed: bool,
                 capacity: Callable[[], FleetCapacity] | None = None,
                 push_problem: Callable[[], str | None] | None = None,
                 room: Callable[[dict[Role, PoolTarget]], str | None] | None = None) -> None:
        """``capacity``: the launcher's live capacity (a Ray cluster's) where it has one; the
        stored pools are then checked at start against the configured node size only, not
        the node count: a cluster whose workers are still joining must not reset them.
        ``push_problem``: why the engines cannot run KV push here, or None (default:
        ``kv_mode.push_capability``, asked only when a pool wants push). ``room``: why the
        cluster cannot place pools beyond their accelerators (``Launcher.room_problem``)."""
        self.settings = settings
        self.store = store
        self.managed = managed
        self.push_problem = push_problem or (lambda: push_capability(settings))
        self.room = room or (lambda targets: None)
        hw = settings.hardware
        self.live_capacity = capacity is not None
        self.capacity = capacity or (lambda: (hw.per_node, hw.nodes, hw.share))
        self.hw: profiles.HardwareProfile = settings.hardware.profile
        self._model = settings.known_profile
        self.targets = self._initial()

    @property
    def model(self) -> profiles.ModelProfile:
        """The model's numbers, for checking a change: managed pools always have them
        (external ones, whose architecture may be unknown, are never checked)."""
        if self._model is None:
            raise InvalidChange(f"model {self.settings.model.public_name!r}: its architecture "
                                "is unknown, so no change can be checked")
        return self._model

    def _config(self) -> dict[Role, PoolTarget]:
        p = self.settings.pools
        return {Role.PREFILL: PoolTarget(p.prefill.size, p.prefill.tp, p.prefill.kv_mode),
                Role.DECODE: PoolTarget(p.decode.size, p.decode.tp, p.decode.kv_mode)}

    def _initial(self) -> dict[Role, PoolTarget]:
        config = self._config()
        for role, target in config.items():
            problem = self.kv_mode_problem(role, target.kv_mode)
            if problem:
                raise ConfigError(f"pools.{role.value}.kv_mode: {problem}")
        stored = self.store.get("desired")
        if stored is None or not self.managed:
            self.store.put("desired", targets_json(config))
            return config
        try:
            targets = {Role(r): target_of(v) for r, v in stored.items()}
            self._check_all(targets, at_start=True)
            for role, target in targets.items():
                problem = self.kv_mode_problem(role, target.kv_mode)
                if problem:
                    raise InvalidChange(problem, f"pools.{role.value}.kv_mode")
        except (InvalidChange, KeyError, ValueError, TypeError) as exc:
            self.store.record("controller", "desired.reset", "pools", stored,
                              targets_json(config), f"stored pools invalid here: {exc}")
            self.store.put("desired", targets_json(config))
            return config
        return targets

    def _check_all(self, targets: dict[Role, PoolTarget], at_start: bool = False) -> None:
        per_node, nodes, share = self.capacity()
        if at_start and self.live_capacity:
            hw = self.settings.hardware
            per_node, nodes, share = hw.per_node, 1_000_000, hw.share
        fit.check_targets(targets, model=self.model, hw=self.hw, per_node=per_node,
                                 nodes=nodes, share=share)

    def kv_mode_problem(self, role: Role, mode: str) -> str | None:
        """Why ``role`` may not take KV mode ``mode`` here (``kv_mode.kv_mode_refusal``)."""
        backend = self.settings.backend
        needs = mode == "push" and backend != "external"
        return kv_mode_refusal(role, mode, backend, self.push_problem() if needs else None)

    def check(self, role: Role, size: int | None, tp: int | None,
              kv_mode: str | None = None) -> dict[Role, PoolTarget]:
        """The targets after the change; raises InvalidChange, changes nothing."""
        if size is None and tp is None and kv_mode is None:
            raise InvalidChange("nothing to change: give size, tp and/or kv_mode")
        if kv_mode is not None:
            problem = self.kv_mode_problem(role, kv_mode)
            if problem:
                raise InvalidChange(problem, f"pools.{role.value}.kv_mode")
        old = self.targets[role]
        mode = old.kv_mode if kv_mode is None else kv_mode
        if size is None and tp is None:  # the KV mode alone
            if not self.managed:
                raise InvalidChange("backend external: pools are the configured URLs; change "
                                    "them in the config file")
            return {**self.targets, role: dataclasses.replace(old, kv_mode=mode)}
        per_node, nodes, share = self.capacity()
        new = fit.check_change(
            self.targets, role, size, tp, model=self.model, hw=self.hw, per_node=per_node,
            nodes=nodes, managed=self.managed, share=share)
        # ``fit`` knows size and TP; every pool keeps its mode, the changed one takes ``mode``.
        out = {r: dataclasses.replace(t, kv_mode=mode if r is role else self.targets[r].kv_mode)
               for r, t in new.items()}
        problem = self.room(out)
        if problem:
            raise InvalidChange(problem, f"pools.{role.value}.size")
        return out

    def valid_tps(self, role: Role) -> list[int]:
        """The TPs ``role`` may change to now (``fit.valid_tps``)."""
        if not self.managed:
            return [self.targets[role].tp]
        per_node, _, _ = self.capacity()
        other = self.targets[Role.DECODE if role is Role.PREFILL else Role.PREFILL].tp
        return fit.valid_tps(self.model, self.hw, per_node, role, other)

    def set(self, role: Role, size: int | None, tp: int | None, actor: str,
            detail: str | None = None, kv_mode: str | None = None) -> PoolTarget:
        new = self.check(role, size, tp, kv_mode)
        before = target_json(self.targets[role])
        self.store.change("desired", targets_json(new), actor, "pool.update", role.value,
                          before, target_json(new[role]), detail)
        self.targets = new
        return new[role]
