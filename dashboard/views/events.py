"""Events: the controller's audit log — every accepted change and instance transition."""

from __future__ import annotations

import streamlit as st

from dashboard import frames, ui
from dashboard.client import ApiError

KINDS = ["pool.update", "routing.update", "instance.starting", "instance.ready",
         "instance.draining", "instance.stopped", "instance.failed", "desired.reset",
         "controller.start", "controller.stop", "kv.after_expiry", "kv.expired",
         "pool.quarantined"]
LIMITS = [100, 500, 2000]

st.title("Events")
st.caption("From `/api/v1/events`, newest first: when, who, what, before, after")
left, right = st.columns([3, 1])
kind = left.selectbox("kind", KINDS, index=None, placeholder="all kinds", key="events_kind")
limit = right.selectbox("show", LIMITS, index=0, key="events_limit")


@st.fragment(run_every=ui.run_every())
def log() -> None:
    try:
        df = frames.events_frame(ui.events(int(limit), kind))
    except ApiError as exc:
        ui.card_error(exc)
        return
    st.dataframe(df, hide_index=True, width="stretch",
                 height=min(700, 38 + 35 * max(1, len(df))), column_config={
                     "when": st.column_config.DatetimeColumn("when",
                                                             format="YYYY-MM-DD HH:mm:ss"),
                     "before": st.column_config.TextColumn("before", width="small"),
                     "after": st.column_config.TextColumn("after", width="medium"),
                     "detail": st.column_config.TextColumn("detail", width="large"),
                     "id": st.column_config.NumberColumn("#", format="%d")})
    st.caption(f"{len(df)} events")


log()
