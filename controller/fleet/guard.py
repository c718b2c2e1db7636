"""When a pool may start an instance: backoff after failed starts, quarantine after crashes in
service. A value the planner reads (``backoff_until``), changed by the fleet loop's events."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from controller.models import Role

MAX_BACKOFF_S = 30.0
QUARANTINE_BASE_S = 30.0  # first quarantine; doubles with every further crash in the window
MAX_QUARANTINE_S = 600.0


@dataclass(frozen=True)
class Quarantine:
    """A pool whose engines keep crashing in service: no restart before ``until``."""

    until: float  # fleet clock
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


class StartGuard:
    def __init__(self, crash_window_s: float, quarantine_after: int) -> None:
        self.crash_window_s = crash_window_s
        self.quarantine_after = quarantine_after
        self.backoff_until: dict[Role, float] = dict.fromkeys(Role, 0.0)
        self.quarantine: dict[Role, Quarantine | None] = dict.fromkeys(Role)
        self._streak: dict[Role, int] = dict.fromkeys(Role, 0)
        self._crashes: dict[Role, deque[float]] = {r: deque() for r in Role}

    def started(self, role: Role) -> None:
        """An instance of ``role`` became ready: failed starts are forgiven."""
        self._streak[role] = 0

    def launch_failed(self, role: Role, now: float) -> None:
        self.backoff_until[role] = now + MAX_BACKOFF_S

    def failed(self, role: Role, now: float, in_service: bool, why: str) -> Quarantine | None:
        """An instance failed; a new quarantine when this crash puts the pool in one.

        Every failure backs off (doubling with the streak); crashes in service also count in
        the crash window. A pool's readiness does not end a quarantine (an engine that dies on
        its first request of a kind becomes ready every time); only the window forgets."""
        streak = self._streak[role] = self._streak[role] + 1
        self.backoff_until[role] = now + min(MAX_BACKOFF_S, 0.5 * 2**streak)
        if not in_service:
            return None
        crashes = self._crashes[role]
        crashes.append(now)
        while crashes and crashes[0] < now - self.crash_window_s:
            crashes.popleft()
        wait = quarantine_s(len(crashes), self.quarantine_after)
        if wait is None:
            return None
        q = Quarantine(now + wait, len(crashes), why)
        self.quarantine[role] = q
        self.backoff_until[role] = max(self.backoff_until[role], q.until)
        return q

    def active(self, role: Role, now: float) -> Quarantine | None:
        q = self.quarantine[role]
        return q if q is not None and q.until > now else None
