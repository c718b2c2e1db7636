"""Review, then confirm: every change the console makes is first shown as what it will do
(``changes.PendingChange``), and sent only when the operator confirms it; the controller's
answer (a toast, or its refusal verbatim) is shown in the section that asked. Shared by the
Controls page and the Pools page's instance drill-down. Streamlit glue."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import streamlit as st

from dashboard.changes import PendingChange
from dashboard.client import ApiError
from dashboard.ui import errors, forecast_card
from dashboard.ui.reads import forget_reads
from dashboard.ui.session import client

PENDING_CHANGE_KEY = "pdctl_pending"  # (section, PendingChange) awaiting confirmation
CHANGE_OUTCOME_KEY = "pdctl_outcome"  # (section, ok, message) of the last change
SHOW_PENDING_KEY = "pdctl_show_pending"  # the section whose review was just asked for


def _send_change(section: str, what: str, call: Callable[[], Any]) -> None:
    refused = errors.attempt(call)
    if isinstance(refused, ApiError):
        st.session_state[CHANGE_OUTCOME_KEY] = (section, False, refused)
        return
    forget_reads()
    st.session_state[CHANGE_OUTCOME_KEY] = (section, True, what)


def confirm_pending() -> None:
    """Button callback: send the reviewed change."""
    held: tuple[str, PendingChange] | None = st.session_state.pop(PENDING_CHANGE_KEY, None)
    if held is None:
        return
    section, p = held
    c = client()
    if p.kind == "pool" and p.role is not None:
        role = p.role
        _send_change(section, f"{p.title}: sent, the pool is converging",
              lambda: c.set_pool(role, size=p.size, tp=p.tp, kv_mode=p.kv_mode))
    elif p.kind == "drain" and p.instance_id is not None:
        iid = p.instance_id
        _send_change(section, f"{iid} is draining", lambda: c.drain(iid))
    elif p.kind == "targets" and p.patch:
        change = dict(p.patch)
        _send_change(section, "targets updated: " + ", ".join(
            f"{k}={val:g}" for k, val in change.items()), lambda: c.set_targets(change))
    elif p.kind == "routing" and p.patch:
        patch = dict(p.patch)
        _send_change(section, "routing updated: " + ", ".join(
            f"{k}={val}" for k, val in patch.items()), lambda: c.set_routing(patch))


def cancel_pending() -> None:
    st.session_state.pop(PENDING_CHANGE_KEY, None)


def review(section: str, change: PendingChange | None) -> None:
    st.session_state.pop(CHANGE_OUTCOME_KEY, None)
    if change is None:
        st.session_state.pop(PENDING_CHANGE_KEY, None)
        st.session_state[CHANGE_OUTCOME_KEY] = (section, True, "nothing to change")
    else:
        st.session_state[PENDING_CHANGE_KEY] = (section, change)
        st.session_state[SHOW_PENDING_KEY] = section


def show_outcome(section: str) -> None:
    """The result of this section's last change: a toast, or the controller's refusal."""
    outcome = st.session_state.get(CHANGE_OUTCOME_KEY)
    if not outcome or outcome[0] != section:
        return
    _, ok, body = outcome
    errors.change_outcome(ok, body)
    if ok:
        st.session_state.pop(CHANGE_OUTCOME_KEY, None)


def show_pending(section: str) -> None:
    """The confirmation step for a reviewed change of this section."""
    held = st.session_state.get(PENDING_CHANGE_KEY)
    if not held or held[0] != section:
        return
    change: PendingChange = held[1]
    key = "pdctl-pending-" + re.sub(r"[^A-Za-z0-9_-]", "-", section)
    with st.container(border=True, key=key):
        if change.disruptive:
            st.warning(f"**Confirm a disruptive change — {change.title}**",
                       icon=":material/warning:")
        else:
            st.info(f"**Confirm — {change.title}**", icon=":material/info:")
        if change.kind == "pool":
            st.caption("The controller's plan for its next step (dry run); it plans again "
                       "every step until the pool has converged.")
        st.markdown("\n".join(f"- {e}" for e in change.effects))
        forecast_card.show_prediction(change.prediction)
        left, right = st.columns(2)
        # The loud button only for a change that drains or stops something.
        left.button("Confirm change", key=f"confirm-{section}",
                    type="primary" if change.disruptive else "secondary",
                    on_click=confirm_pending)
        right.button("Cancel", key=f"cancel-{section}", on_click=cancel_pending)
    if st.session_state.pop(SHOW_PENDING_KEY, None) == section:
        into_view(f".st-key-{key}")


def into_view(selector: str) -> None:
    """Scroll the page (Streamlit's own scrolling container) just enough to show the element
    ``selector`` finds: a confirmation asked for by a button at the bottom of the window
    appeared below the fold. Once, on the run that drew it (the live refreshes do not move
    the page again)."""
    target = json.dumps(selector)
    st.html(f"""<script>
setTimeout(() => {{
  const el = document.querySelector({target});
  if (el) el.scrollIntoView({{block: "nearest", behavior: "smooth"}});
}}, 150);
</script>""", unsafe_allow_javascript=True)
