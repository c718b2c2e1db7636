"""Events: the controller's audit log — every accepted change and instance transition."""

from __future__ import annotations

import streamlit as st

from dashboard import frames
from dashboard.ui import errors, reads, tables
from dashboard.ui.sidebar import run_every

EVENT_KINDS = ["pool.update", "routing.update", "instance.starting", "instance.ready",
               "instance.draining", "instance.stopped", "instance.failed", "desired.reset",
               "controller.start", "controller.stop", "kv.after_expiry", "kv.expired",
               "pool.quarantined"]
LIMITS = [100, 500, 2000]

st.title("Events")
st.caption("From `/api/v1/events`, newest first: when, who, what, the change in words, and "
           "the values before and after as recorded")
kind_column, limit_column = st.columns([3, 1])
chosen_kind = kind_column.selectbox("kind", EVENT_KINDS, index=None, placeholder="all kinds",
                                    key="events_kind")
chosen_limit = limit_column.selectbox("show", LIMITS, index=0, key="events_limit")


@st.fragment(run_every=run_every())
@errors.card
def audit_log() -> None:
    df = frames.events_frame(reads.audit_events(int(chosen_limit), chosen_kind))
    st.dataframe(df, hide_index=True, width="stretch",
                 height=tables.rows_height(len(df), 700), column_config={
                     "when": st.column_config.DatetimeColumn("when",
                                                             format="YYYY-MM-DD HH:mm:ss"),
                     "change": st.column_config.TextColumn("change", width="large"),
                     "detail": st.column_config.TextColumn("detail", width="medium"),
                     "before": st.column_config.TextColumn("before", width="small"),
                     "after": st.column_config.TextColumn("after", width="small"),
                     "id": st.column_config.NumberColumn("#", format="%d")})
    st.caption(f"{len(df)} events")


audit_log()
