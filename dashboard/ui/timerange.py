"""The time the pages show: the sidebar's window ending now, or a fixed custom range; what to
ask the API for it; and how a time reads (``clock``)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from datetime import time as day_time

import streamlit as st

from dashboard.ui.figures import clock

WINDOW_CHOICES = {"1 min": 60.0, "5 min": 300.0, "15 min": 900.0, "1 h": 3600.0}
CUSTOM = "Custom range"
MAX_RANGE_S = 86_400.0  # the API's longest window


@dataclass(frozen=True)
class TimeRange:
    """What the pages show: the last ``window_s`` seconds (``end`` None: live, ending now),
    or the fixed range ``[end - window_s, end)`` the operator picked."""

    window_s: float
    end: float | None = None

    def stop(self) -> float:
        """The range's end now: a fixed end not yet reached is now."""
        now = time.time()
        return now if self.end is None else min(self.end, now)

    def start(self) -> float:
        return (time.time() if self.end is None else self.end) - self.window_s

    def asked(self) -> tuple[float, float | None]:
        """``(window_s, end)`` to ask the API for: a fixed range not over yet is asked from
        its start up to now (the whole second, so that the cards of a refresh share it)."""
        if self.end is None or self.end <= time.time():
            return self.window_s, self.end
        now = float(math.floor(time.time()))
        return max(1.0, now - self.start()), now

    def within(self) -> str:
        """``in the last 300 s`` or ``between 14:00:00 and 14:15:00``."""
        if self.end is None:
            return f"in the last {self.window_s:g} s"
        return f"between {clock(self.end - self.window_s)} and {clock(self.end)}"

    def label(self) -> str:
        if self.end is None:
            return f"Last {self.window_s:g} s"
        return (f"{clock(self.end - self.window_s)} → {clock(self.end)} "
                f"({span_text(self.window_s)}, a fixed range)")


def span_text(seconds: float) -> str:
    return (f"{seconds / 3600:g} h" if seconds >= 3600 and seconds % 900 == 0 else
            f"{seconds / 60:g} min" if seconds >= 60 and seconds % 60 == 0 else
            f"{seconds:g} s")


def custom_range(day: date, start: day_time, stop: day_time) -> TimeRange:
    """The range from ``start`` to ``stop`` on ``day`` (local time); a ``stop`` at or before
    ``start`` is on the next day (a range across midnight)."""
    begin = datetime.combine(day, start)
    end = datetime.combine(day, stop)
    if end <= begin:
        end += timedelta(days=1)
    return TimeRange(min((end - begin).total_seconds(), MAX_RANGE_S), end.timestamp())


def time_range() -> TimeRange:
    """The range the sidebar picked: a preset window ending now, or a custom fixed range."""
    choice = st.session_state.get("pdctl_window", "5 min")
    if choice != CUSTOM:
        return TimeRange(WINDOW_CHOICES.get(choice, 300.0))
    begin, stop = default_range()
    return custom_range(st.session_state.get("pdctl_range_day", begin.date()),
                        st.session_state.get("pdctl_range_from", begin.time()),
                        st.session_state.get("pdctl_range_to", stop.time()))


def default_range() -> tuple[datetime, datetime]:
    """A custom range first shown: the 15 minutes up to the next whole minute (so that it
    holds what just happened)."""
    stop = datetime.now().replace(second=0, microsecond=0) + timedelta(minutes=1)
    return stop - timedelta(minutes=15), stop
