"""KV integrity (reads of KV blocks a prefill engine had already freed) and pool quarantine:
what the console says about ``/stats`` ``kv_integrity`` and a pool's ``quarantine``. No
Streamlit.

Both fields are new: an older controller sends neither, the models then hold None, and
nothing is said.
"""

from __future__ import annotations

import math

from pdctl_api.schema import ClusterPublic, KvIntegrityPublic, QuarantinePublic, Role

KV_CONTRACT = "`docs/routing-and-accounting.md`, section “vLLM's KV contract”"


def _count(n: float, one: str, many: str) -> str:
    return f"{n:g} {one if n == 1 else many}"


def alert_text(k: KvIntegrityPublic, window_s: float) -> str | None:
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


def expired_text(k: KvIntegrityPublic, window_s: float) -> str | None:
    """The quieter warning when leases ran out in the window; None otherwise."""
    if k.expired_in_window <= 0:
        return None
    what = _count(k.expired_in_window, "finished prefill", "finished prefills")
    return (f"{what} in the last {window_s:g} s held KV blocks for nothing until their lease "
            "ran out: no decode read or released them in time, and the prefill engine freed "
            f"them ({k.expired_requests:g} in total, `kv.expired` in Events).")


def quarantined(cluster: ClusterPublic) -> dict[Role, QuarantinePublic]:
    """The quarantined pools of ``GET /api/v1/cluster``, by role."""
    return {role: pool.quarantine for role, pool in cluster.pools.items()
            if pool.quarantine is not None}


def fmt_duration(seconds: float) -> str:
    """``45 s``, ``2 min``, ``1 min 5 s`` (whole seconds, rounded up)."""
    s = max(0, math.ceil(seconds))
    if s < 60:
        return f"{s} s"
    return f"{s // 60} min" + (f" {s % 60} s" if s % 60 else "")


def quarantine_text(role: Role | str, q: QuarantinePublic) -> str:
    role = Role(role)
    return (f"**{role.capitalize()} pool quarantined** after "
            f"{_count(q.crashes, 'crash', 'crashes')} of its engines in service: no new "
            f"{role} instance starts for another {fmt_duration(max(0.0, q.remaining_s))}. "
            f"Last error: `{q.last_error}`.")
