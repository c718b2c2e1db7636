"""The operator's service targets (SLOs): what the console's health status, its target lines
and the Prometheus alerting rules hold the fleet to. Live: ``PATCH /api/v1/targets`` changes
them, persisted in the store and recorded in the audit log."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

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
        if changed:
            self.store.change(KEY, new.model_dump(), actor, "targets.update", "targets",
                              {k: before[k] for k in changed}, changed)
        self.settings = new
        return new


class TargetsCollector(Collector):
    """The operator's service targets, read at scrape time: the alerting rules compare the
    measured figures with these (controller/obs/alerts.py)."""

    def __init__(self, targets: Callable[[], TargetsSettings]) -> None:
        self._targets = targets

    def collect(self) -> Iterator[GaugeMetricFamily]:
        t = self._targets()
        for name, value, doc in (
                ("pdctl_target_ttft_p95_seconds", t.ttft_p95_ms / 1e3, "TTFT p95 target"),
                ("pdctl_target_ttft_p99_seconds", t.ttft_p99_ms / 1e3, "TTFT p99 target"),
                ("pdctl_target_gap_p99_seconds", t.gap_p99_ms / 1e3,
                 "inter-token gap p99 target"),
                ("pdctl_target_error_ratio", t.error_rate,
                 "failed and refused requests over all requests: target")):
            yield GaugeMetricFamily(name, f"{doc} (GET /api/v1/targets)", value=value)
