"""Events: the controller's audit log — every accepted change and instance transition — of
the sidebar's window or range."""

from __future__ import annotations

import streamlit as st

from dashboard import frames
from dashboard.ui import errors, reads, tables
from dashboard.ui.sidebar import run_every
from dashboard.ui.timerange import time_range

EVENT_KINDS = ["pool.update", "routing.update", "instance.starting", "instance.ready",
               "instance.draining", "instance.stopped", "instance.failed",
               "instance.restarted", "desired.reset",
               "controller.start", "controller.stop", "kv.after_expiry", "kv.expired",
               "pool.quarantined"]
LIMITS = [100, 500, 2000]

st.title("Events")
st.caption(f"{time_range().label()} · from `/api/v1/events`, newest first: when, who, what, "
           "the change in words, and the values before and after as recorded")
kind_column, limit_column = st.columns([3, 1])
chosen_kind = kind_column.selectbox("kind", EVENT_KINDS, index=None, placeholder="all kinds",
                                    key="events_kind")
chosen_limit = limit_column.selectbox("show", LIMITS, index=0, key="events_limit")


@st.fragment(run_every=run_every())
@errors.card
def audit_log() -> None:
    rng, limit = time_range(), int(chosen_limit)
    events = reads.range_events(rng, limit + 1, chosen_kind)  # one more: was any left out?
    df = frames.events_frame(events[:limit])
    st.dataframe(df, hide_index=True, width="stretch",
                 height=tables.rows_height(len(df), 700), column_config={
                     "when": st.column_config.DatetimeColumn("when",
                                                             format="YYYY-MM-DD HH:mm:ss"),
                     "change": st.column_config.TextColumn("change", width="large"),
                     "detail": st.column_config.TextColumn("detail", width="medium"),
                     "before": st.column_config.TextColumn("before", width="small"),
                     "after": st.column_config.TextColumn("after", width="small"),
                     "id": st.column_config.NumberColumn("#", format="%d")})
    what = f"{chosen_kind} " if chosen_kind else ""
    if len(events) > limit:
        st.caption(f"The newest {limit:,} of the {what}events {rng.within()}: a larger "
                   "\"show\" or a shorter window lists the others")
    else:
        st.caption(f"{len(df):,} {what}event{'' if len(df) == 1 else 's'} {rng.within()}")


audit_log()
