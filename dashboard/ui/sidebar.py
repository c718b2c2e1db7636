"""The sidebar's settings: the time window or a custom range (day, from, to), the Live switch
and so the live cards' refresh interval (``run_every``), the operator's name for the audit
log, the token in use, and where the figures come from."""

from __future__ import annotations

import time
from datetime import datetime

import streamlit as st

from dashboard.client import ACTOR
from dashboard.ui.reads import forget_reads, may_change
from dashboard.ui.session import OPERATOR_KEY, TOKEN_KEY, config
from dashboard.ui.timerange import CUSTOM, WINDOW_CHOICES, default_range, span_text, time_range


def run_every() -> float | None:
    """The live cards' refresh interval, or None when the operator paused live refresh."""
    return config().refresh_s if st.session_state.get("pdctl_live", True) else None


def range_picker() -> None:
    """Day, from and to of a custom range."""
    begin, stop = default_range()
    defaults = {"pdctl_range_day": begin.date(), "pdctl_range_from": begin.time(),
                "pdctl_range_to": stop.time()}
    for key, value in defaults.items():
        st.session_state.setdefault(key, value)
    st.date_input("Day", key="pdctl_range_day", max_value=stop.date(),
                  help="the day the range starts (local time of the console)")
    left, right = st.columns(2)
    left.time_input("From", key="pdctl_range_from", step=60)
    right.time_input("To", key="pdctl_range_to", step=60,
                     help="at or before From: the next day")
    rng = time_range()
    end = rng.end if rng.end is not None else rng.stop()
    note = "  \nnot over yet: the pages show it up to now" if end > time.time() else ""
    st.caption(f"{datetime.fromtimestamp(end - rng.window_s):%Y-%m-%d %H:%M} → "
               f"{datetime.fromtimestamp(end):%Y-%m-%d %H:%M} "
               f"({span_text(rng.window_s)}){note}")


def sidebar() -> None:
    cfg = config()
    with st.sidebar:
        st.selectbox("Window", [*WINDOW_CHOICES, CUSTOM], index=1, key="pdctl_window",
                     help="time window of the statistics and charts: the last minutes up to "
                          f"now, or a fixed range in the past ({CUSTOM})")
        if st.session_state.get("pdctl_window") == CUSTOM:
            range_picker()
        st.toggle("Live", value=True, key="pdctl_live",
                  help=f"refresh the live cards every {cfg.refresh_s:g} s")
        if not may_change():
            st.caption(":material/visibility: viewer token: read only")
        if st.session_state.get(TOKEN_KEY):
            st.caption(":material/key: using the token entered in this session")
            if st.button("Forget the entered token", key="pdctl-forget-token"):
                del st.session_state[TOKEN_KEY]
                forget_reads()
                st.rerun()
        st.text_input("Operator", key=OPERATOR_KEY, max_chars=40, placeholder="your name",
                      help=f"the audit log names your changes `{ACTOR}/<name>` "
                           f"(`{ACTOR}` without a name)")
        series = (f"Prometheus `{cfg.prometheus_url}`" if cfg.prometheus_url
                  else "the controller's API")
        st.caption(f"controller `{cfg.controller_url}`  \ntime series from {series}  \n"
                   f"refresh every {cfg.refresh_s:g} s")
