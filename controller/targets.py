"""The operator's service targets (SLOs): what the console's health status, its target lines
and the Prometheus alerting rules hold the fleet to. Live: ``PATCH /api/v1/targets`` changes
them, persisted in the store and recorded in the audit log."""

from __future__ import annotations

import contextlib
from typing import Any

from controller.config import TargetsSettings, patched
from controller.errors import InvalidChange
from controller.store import Store

KEY = "targets"


class Targets:
    def __init__(self, initial: TargetsSettings, store: Store) -> None:
        self.store = store
        self.settings = initial
        stored = store.get(KEY)
        if stored is not None:
            with contextlib.suppress(ValueError):
                self.settings = TargetsSettings.model_validate(stored)
                return
        store.put(KEY, initial.model_dump())

    def update(self, patch: dict[str, Any], actor: str) -> TargetsSettings:
        """Validate and apply a change, persisted and recorded; InvalidChange changes
        nothing."""
        if not patch:
            raise InvalidChange("nothing to change: give at least one target")
        before = self.settings.model_dump()
        new = patched(self.settings, patch, "targets.")
        changed = {k: v for k, v in new.model_dump().items() if before.get(k) != v}
        self.settings = new
        self.store.put(KEY, new.model_dump())
        if changed:
            self.store.record(actor, "targets.update", "targets",
                              {k: before[k] for k in changed}, changed)
        return new
