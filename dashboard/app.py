"""The operator console: ``streamlit run dashboard/app.py -- --controller URL --state-dir DIR``
(``pdctl dashboard`` does this). Navigation over the pages, the sidebar, and the connection
banner that keeps the pages quiet while the controller is unreachable or refuses the token.

The page scripts live in ``views/``, not ``pages/``: Streamlit treats a ``pages/`` folder next
to the main script as a v1 multipage app until ``st.navigation`` has run once, so a deep link
(``/controls``) opened first after start would run the page without this script."""

from __future__ import annotations

import sys
from pathlib import Path

import streamlit as st

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:  # run by path: make ``dashboard`` importable as a package
    sys.path.insert(0, str(HERE.parent))

from dashboard.ui import alerts  # noqa: E402
from dashboard.ui.session import DOWN_KEY  # noqa: E402
from dashboard.ui.sidebar import run_every, sidebar  # noqa: E402

OVERVIEW = HERE / "views" / "overview.py"
NAV_PAGES = [
    # The default page is served at /; its own pathname is reserved but not served, so
    # /overview (a bookmark, a runbook's link) is a hidden page of the same script below.
    st.Page(OVERVIEW, title="Overview", icon=":material/speed:", url_path="home",
            default=True),
    st.Page(HERE / "views" / "transfer.py", title="Transfer", icon=":material/swap_horiz:",
            url_path="transfer"),
    st.Page(HERE / "views" / "pools.py", title="Pools", icon=":material/dns:", url_path="pools"),
    st.Page(HERE / "views" / "controls.py", title="Controls", icon=":material/tune:",
            url_path="controls"),
    st.Page(HERE / "views" / "advisor.py", title="Advisor", icon=":material/lightbulb:",
            url_path="advisor"),
    st.Page(HERE / "views" / "planner.py", title="Planner", icon=":material/auto_graph:",
            url_path="planner"),
    st.Page(HERE / "views" / "events.py", title="Events", icon=":material/history:",
            url_path="events"),
    st.Page(OVERVIEW, title="Overview", icon=":material/speed:", url_path="overview",
            visibility="hidden"),
]

st.set_page_config(page_title="pdctl console", page_icon=":material/speed:", layout="wide")
chosen_page = st.navigation(NAV_PAGES)
sidebar()


@st.fragment(run_every=run_every())
def connection() -> None:
    alerts.connection_banner()


connection()
if st.session_state.get(DOWN_KEY):
    st.stop()
alerts.scaled_time_banner()
chosen_page.run()
