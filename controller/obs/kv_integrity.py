"""Watches what the router cannot prevent: KV blocks read after the prefill freed them.

vLLM 0.32's prefill engine frees a finished request's blocks when its lease expires
(``vllm:nixl_num_kv_expired_reqs``). A decode read that completes afterwards succeeds on the
decode side; only the prefill notices, counts it (``vllm:nixl_num_notifications_after_expiry``)
and logs ``Potentially invalid KV blocks for unrecognized request <id>``. The client got
HTTP 200 with output computed from whatever those blocks held by then.

``LeaseWatch.check`` runs after every load poll: it turns growth of the two counters into
audit-log events and alerts, and reads the new lines of each local prefill engine's log to
mark the request records whose KV handle (the prefill's request id) was named there as
``suspect``.
"""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controller.metrics import Metrics
from controller.models import Instance, Role
from controller.requests_log import RequestLog
from controller.store import Store

INVALID_READ = re.compile(rb"Potentially invalid KV blocks for unrecognized request (\S+)")
MAX_READ = 1 << 20  # log bytes read per instance per check
ALERTS_KEPT = 1000


@dataclass(frozen=True)
class LeaseAlert:
    at: float  # unix time it was seen
    instance: str
    kind: str  # "expired" | "after_expiry"
    count: float  # growth of the engine's counter since the previous check


def log_path(inst: Instance) -> Path | None:
    """The engine's log file, for instances this controller runs as local processes."""
    handle = getattr(inst.handle, "handle", None)
    path = handle.get("log") if isinstance(handle, dict) else None
    return Path(path) if path is not None else None


class LeaseWatch:
    def __init__(self, requests: RequestLog, metrics: Metrics, store: Store,
                 clock: Callable[[], float] = time.time) -> None:
        self._requests = requests
        self._metrics = metrics
        self._store = store
        self._clock = clock
        self._seen: dict[str, tuple[float, float]] = {}  # instance -> (expired, after)
        self._offsets: dict[str, int] = {}
        self.alerts: deque[LeaseAlert] = deque(maxlen=ALERTS_KEPT)
        self.suspects = 0

    def check(self, instances: list[Instance]) -> None:
        live = {i.id for i in instances}
        for gone in set(self._seen) - live:
            self._seen.pop(gone, None)
            self._offsets.pop(gone, None)
        for inst in instances:
            if inst.role is Role.PREFILL:
                self._counters(inst)
                self._log_lines(inst)

    def _counters(self, inst: Instance) -> None:
        before = self._seen.get(inst.id, (0.0, 0.0))
        now = (inst.kv_expired, inst.kv_after_expiry)
        self._seen[inst.id] = now
        for kind, old, new, what in (
            ("expired", before[0], now[0], "KV blocks freed when their lease expired"),
            ("after_expiry", before[1], now[1],
             "reads of KV blocks already freed (output of those requests may be wrong)"),
        ):
            if new > old:
                self.alerts.append(LeaseAlert(self._clock(), inst.id, kind, new - old))
                self._store.record("controller", f"kv.{kind}", inst.id, old, new,
                                   f"{new - old:g} {what}")

    def _log_lines(self, inst: Instance) -> None:
        path = log_path(inst)
        if path is None:
            return
        try:
            with open(path, "rb") as f:
                f.seek(self._offsets.get(inst.id, 0))
                data = f.read(MAX_READ)
        except OSError:
            return
        end = data.rfind(b"\n") + 1  # a partial last line is read again next time
        self._offsets[inst.id] = self._offsets.get(inst.id, 0) + end
        for match in INVALID_READ.finditer(data[:end]):
            handle = match.group(1).decode("utf-8", "replace").rstrip(".")
            self.suspects += 1
            self._metrics.kv_suspect.inc()
            self._requests.mark_suspect(handle)

    def summary(self, window_s: float) -> dict[str, Any]:
        """Totals over the live prefill engines and what grew within the window."""
        since = self._clock() - window_s
        recent = [a for a in self.alerts if a.at >= since]
        after = sum(a.count for a in recent if a.kind == "after_expiry")
        return {
            "expired_requests": sum(v[0] for v in self._seen.values()),
            "notifications_after_expiry": sum(v[1] for v in self._seen.values()),
            "expired_in_window": sum(a.count for a in recent if a.kind == "expired"),
            "after_expiry_in_window": after,
            "suspect_requests": self.suspects,
            "alert": after > 0,
        }
