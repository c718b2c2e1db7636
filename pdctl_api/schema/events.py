"""The audit log (``GET /api/v1/events``): every change, when, by whom, before and after."""

from __future__ import annotations

from typing import Any

from pdctl_api.schema.common import Public


class EventPublic(Public):
    """``GET /api/v1/events``: one audit-log entry; ``before``/``after`` are any JSON."""

    id: int
    ts: float
    actor: str
    kind: str
    target: str
    before: Any = None
    after: Any = None
    detail: str | None = None
