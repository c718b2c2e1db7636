"""How a figure reads on a page: a time of day, milliseconds, bytes, and what a window's rates
divide by.
No Streamlit."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pdctl_api.schema import StatsPublic


def fmt_bytes(n: float | None) -> str:
    """Bytes in GB, MB, KB or B; "unknown" for None (a model whose architecture is not
    known)."""
    if n is None:
        return "unknown"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def clock(ts: float) -> str:
    """A unix time as the pages read it: local ``HH:MM:SS``."""
    return datetime.fromtimestamp(ts).strftime("%H:%M:%S")


def fmt_share(x: float | None) -> str:
    """A share as a percentage to a tenth; ``n/a`` for none."""
    return "n/a" if x is None else f"{x:.1%}"


def fmt_ms(ms: Any) -> str:
    return f"{float(ms):.1f} ms"


def rate_basis(s: StatsPublic) -> str:
    """What a window's rates divide by: the window, or the part of it the controller ran."""
    covered = s.covered_s if s.covered_s is not None else s.window_s
    if covered >= s.window_s - 0.5:
        return f"per second over the {s.window_s:g} s window"
    return (f"per second over the last {covered:.0f} s: the controller has recorded requests "
            f"for only that part of the {s.window_s:g} s window")
