"""KV integrity (reads of KV blocks a prefill engine had already freed) and pool quarantine, as
the controller reports them: typed parsing of ``/stats`` ``kv_integrity`` and of a pool's
``quarantine``, and what the console says about them. No Streamlit.

Both fields are new: an older controller sends neither, and the parsers then return None (no
alert, nothing shown) instead of failing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

Json = dict[str, Any]
ROLES = ("prefill", "decode")
KV_CONTRACT = "`docs/routing-and-accounting.md`, section “vLLM's KV contract”"


def _num(value: Any) -> float:
    """A finite number from the JSON, or 0 (missing, null, not a number)."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return 0.0
    try:
        out = float(value)
    except ValueError:
        return 0.0
    return out if math.isfinite(out) else 0.0


def _count(n: float, one: str, many: str) -> str:
    return f"{n:g} {one if n == 1 else many}"


@dataclass(frozen=True)
class KvIntegrity:
    """``GET /api/v1/stats`` ``kv_integrity``: totals over the live prefill engines, growth
    within the window, request records marked suspect, and the controller's alert."""

    expired_requests: float = 0.0  # KV freed when its lease expired (cumulative)
    notifications_after_expiry: float = 0.0  # reads completed after that (cumulative)
    expired_in_window: float = 0.0
    after_expiry_in_window: float = 0.0
    suspect_requests: int = 0
    alert: bool = False

    @classmethod
    def from_stats(cls, stats: Json) -> KvIntegrity | None:
        """None when the controller does not report it (older than the field)."""
        raw = stats.get("kv_integrity")
        if not isinstance(raw, dict):
            return None
        return cls(expired_requests=_num(raw.get("expired_requests")),
                   notifications_after_expiry=_num(raw.get("notifications_after_expiry")),
                   expired_in_window=_num(raw.get("expired_in_window")),
                   after_expiry_in_window=_num(raw.get("after_expiry_in_window")),
                   suspect_requests=int(_num(raw.get("suspect_requests"))),
                   alert=raw.get("alert") is True)


def alert_text(k: KvIntegrity, window_s: float) -> str | None:
    """The red alert while reads of freed KV blocks are recent; None otherwise."""
    if not k.alert:
        return None
    reads = _count(k.after_expiry_in_window, "read", "reads")
    records = _count(k.suspect_requests, "request record is", "request records are")
    return (f"**{reads} of freed KV blocks in the last {window_s:g} s.** A prefill engine "
            "freed these requests' KV blocks when their lease expired, and a decode read "
            "completed afterwards: it succeeded silently, so the client got HTTP 200 with "
            "output that **may be wrong**. "
            f"{records} marked suspect (column *suspect* of Recent requests; "
            f"{k.notifications_after_expiry:g} such reads in total). See {KV_CONTRACT}.")


def expired_text(k: KvIntegrity, window_s: float) -> str | None:
    """The quieter warning when leases ran out in the window; None otherwise."""
    if k.expired_in_window <= 0:
        return None
    what = _count(k.expired_in_window, "finished prefill", "finished prefills")
    return (f"{what} in the last {window_s:g} s held KV blocks for nothing until their lease "
            "ran out: no decode read or released them in time, and the prefill engine freed "
            f"them ({k.expired_requests:g} in total, `kv.expired` in Events).")


@dataclass(frozen=True)
class Quarantine:
    """A pool's ``quarantine``: its engines crashed in service repeatedly, and no new
    instance starts before ``remaining_s`` runs out."""

    remaining_s: float
    crashes: int
    last_error: str

    @classmethod
    def of_pool(cls, pool: Json) -> Quarantine | None:
        """None when the pool is not quarantined, or the controller does not say."""
        raw = pool.get("quarantine")
        if not isinstance(raw, dict):
            return None
        return cls(remaining_s=max(0.0, _num(raw.get("remaining_s"))),
                   crashes=int(_num(raw.get("crashes"))),
                   last_error=str(raw.get("last_error") or "unknown"))


def quarantined(cluster: Json) -> dict[str, Quarantine]:
    """The quarantined pools of ``GET /api/v1/cluster``, by role."""
    pools = cluster.get("pools") or {}
    out = {}
    for role in ROLES:
        pool = pools.get(role)
        q = Quarantine.of_pool(pool) if isinstance(pool, dict) else None
        if q is not None:
            out[role] = q
    return out


def fmt_duration(seconds: float) -> str:
    """``45 s``, ``2 min``, ``1 min 5 s`` (whole seconds, rounded up)."""
    s = max(0, math.ceil(seconds))
    if s < 60:
        return f"{s} s"
    return f"{s // 60} min" + (f" {s % 60} s" if s % 60 else "")


def quarantine_text(role: str, q: Quarantine) -> str:
    return (f"**{role.capitalize()} pool quarantined** after "
            f"{_count(q.crashes, 'crash', 'crashes')} of its engines in service: no new "
            f"{role} instance starts for another {fmt_duration(q.remaining_s)}. "
            f"Last error: `{q.last_error}`.")
