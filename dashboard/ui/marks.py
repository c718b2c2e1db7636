"""The marks every time chart of every page carries: configuration changes, and each
instance's failure, drain and start, from the audit log of the page's range."""

from __future__ import annotations

from typing import Any

import pandas as pd

from dashboard import timeline
from dashboard.ui import errors, reads
from dashboard.ui.figures import clock
from dashboard.ui.timerange import TimeRange

MARK_EVENTS = 500  # audit events read for one range's marks
LEGEND = ("marks: green a change, red a failure, orange a drain, blue an instance starting")


def range_marks(rng: TimeRange) -> pd.DataFrame:
    """The range's marks (``time, kind, label``, oldest first); none where the events cannot
    be read: the chart itself still shows."""
    events = errors.quietly(lambda: reads.range_events(rng, MARK_EVENTS), [])
    return timeline.change_marks(events, rng.start(), rng.stop())


NOTE_LIMIT = 6  # marks listed in words under a card's charts


def in_words(where: Any, marked: pd.DataFrame) -> None:
    """The marks of a card's charts in words, oldest first (hovering a mark shows the same):
    what the charts mark can be read without finding each rule."""
    if marked.empty:
        return
    rows = marked.tail(NOTE_LIMIT)
    words = " · ".join(f"{clock(t.timestamp())} {label}"
                       for t, label in zip(rows["time"], rows["label"], strict=True))
    more = len(marked) - len(rows)
    where.caption(f"Marked on the charts: {words}"
                  + (f" (and {more} earlier: Events lists them)" if more else ""))
