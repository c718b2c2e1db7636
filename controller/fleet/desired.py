"""The desired pools: validated, persisted in the store, every accepted change recorded."""

from __future__ import annotations

from controller import profiles, validation
from controller.config import Settings
from controller.errors import InvalidChange
from controller.models import Role
from controller.reconciler import PoolTarget
from controller.store import Store


def target_json(t: PoolTarget) -> dict[str, int]:
    return {"size": t.size, "tp": t.tp}


def targets_json(targets: dict[Role, PoolTarget]) -> dict[str, dict[str, int]]:
    return {r.value: target_json(t) for r, t in targets.items()}


class Desired:
    """What the operator asked for. Starts from the store when the pools are managed and what
    is stored is still valid on this hardware, else from the config (recorded)."""

    def __init__(self, settings: Settings, store: Store, managed: bool) -> None:
        self.settings = settings
        self.store = store
        self.managed = managed
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
            self._check_all(targets)
        except (InvalidChange, KeyError, ValueError) as exc:
            self.store.record("controller", "desired.reset", "pools", stored,
                              targets_json(config), f"stored pools invalid here: {exc}")
            self.store.put("desired", targets_json(config))
            return config
        return targets

    def _check_all(self, targets: dict[Role, PoolTarget]) -> None:
        hw = self.settings.hardware
        validation.check_targets(targets, model=self.model, hw=self.hw, per_node=hw.per_node,
                                 nodes=hw.nodes, share=hw.share)

    def check(self, role: Role, size: int | None, tp: int | None) -> dict[Role, PoolTarget]:
        """The targets after the change; raises InvalidChange, changes nothing."""
        hw = self.settings.hardware
        return validation.check_change(
            self.targets, role, size, tp, model=self.model, hw=self.hw, per_node=hw.per_node,
            nodes=hw.nodes, managed=self.managed, share=hw.share)

    def set(self, role: Role, size: int | None, tp: int | None, actor: str) -> PoolTarget:
        new = self.check(role, size, tp)
        before = target_json(self.targets[role])
        self.targets = new
        self.store.put("desired", targets_json(new))
        self.store.record(actor, "pool.update", role.value, before, target_json(new[role]))
        return new[role]
