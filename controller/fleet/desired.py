"""The desired pools: validated, persisted in the store, every accepted change recorded."""

from __future__ import annotations

from collections.abc import Callable

from controller.config import Settings
from controller.errors import InvalidChange
from controller.launchers.base import Launcher
from controller.models import PoolTarget, Role
from controller.sizing import fit
from controller.store import Store
from pdctl_api import profiles


def target_json(t: PoolTarget) -> dict[str, int]:
    return {"size": t.size, "tp": t.tp}


def targets_json(targets: dict[Role, PoolTarget]) -> dict[str, dict[str, int]]:
    return {r.value: target_json(t) for r, t in targets.items()}


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
                 capacity: Callable[[], FleetCapacity] | None = None) -> None:
        """``capacity``: the launcher's live capacity (a Ray cluster's) where it has one; the
        stored pools are then checked at start against the configured node size only, not
        the node count: a cluster whose workers are still joining must not reset them."""
        self.settings = settings
        self.store = store
        self.managed = managed
        hw = settings.hardware
        self.live_capacity = capacity is not None
        self.capacity = capacity or (lambda: (hw.per_node, hw.nodes, hw.share))
        self.model: profiles.ModelProfile = settings.model_profile
        self.hw: profiles.HardwareProfile = settings.hardware.profile
        self.targets = self._initial()

    def _config(self) -> dict[Role, PoolTarget]:
        p = self.settings.pools
        return {Role.PREFILL: PoolTarget(p.prefill.size, p.prefill.tp),
                Role.DECODE: PoolTarget(p.decode.size, p.decode.tp)}

    def _initial(self) -> dict[Role, PoolTarget]:
        config = self._config()
        stored = self.store.get("desired")
        if stored is None or not self.managed:
            self.store.put("desired", targets_json(config))
            return config
        try:
            targets = {Role(r): PoolTarget(int(v["size"]), int(v["tp"]))
                       for r, v in stored.items()}
            self._check_all(targets, at_start=True)
        except (InvalidChange, KeyError, ValueError) as exc:
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

    def check(self, role: Role, size: int | None, tp: int | None) -> dict[Role, PoolTarget]:
        """The targets after the change; raises InvalidChange, changes nothing."""
        per_node, nodes, share = self.capacity()
        return fit.check_change(
            self.targets, role, size, tp, model=self.model, hw=self.hw, per_node=per_node,
            nodes=nodes, managed=self.managed, share=share)

    def valid_tps(self, role: Role) -> list[int]:
        """The TPs ``role`` may change to now (``fit.valid_tps``)."""
        if not self.managed:
            return [self.targets[role].tp]
        per_node, _, _ = self.capacity()
        other = self.targets[Role.DECODE if role is Role.PREFILL else Role.PREFILL].tp
        return fit.valid_tps(self.model, self.hw, per_node, role, other)

    def set(self, role: Role, size: int | None, tp: int | None, actor: str,
            detail: str | None = None) -> PoolTarget:
        new = self.check(role, size, tp)
        before = target_json(self.targets[role])
        self.targets = new
        self.store.put("desired", targets_json(new))
        self.store.record(actor, "pool.update", role.value, before, target_json(new[role]),
                          detail)
        return new[role]
