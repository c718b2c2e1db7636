"""What the pages say at their top: the connection banner (with the token form that mends a
refused token), scaled simulated time, the fleet's health, and the alerts (KV transfer share,
reads of freed KV blocks, expired leases, quarantined pools) and the incidents strip (instances
failed, pools quarantined, Prometheus's firing rules, the TTFT part that grew most)."""

from __future__ import annotations

import streamlit as st

from dashboard import integrity, timeline
from dashboard.client import ApiError
from dashboard.health import Health
from dashboard.prom import PromError
from dashboard.ui import errors, prom_reads, reads
from dashboard.ui.session import DOWN_KEY, TOKEN_KEY, client
from pdctl_api.schema import ClusterPublic, StatsPublic, TransferShare

READ_ONLY_NOTE = ("This console holds the **viewer token**: it shows everything and changes "
                  "nothing (the controller answers 403 to a change). Changes need the admin "
                  "token (`STATE_DIR/token`).")
HEALTH_TITLES = {"ok": "Healthy", "warn": "Watch", "breach": "Target broken",
                 "no data": "No traffic in the window"}


def read_only_note() -> None:
    """In place of the forms of a console that holds the viewer token."""
    st.info(READ_ONLY_NOTE, icon=":material/visibility:")


def connection_banner() -> None:
    """Checks the controller (one cheap authenticated call); on failure shows why and marks the
    session down so pages render nothing; on recovery reruns the whole app."""
    answer = errors.attempt(lambda: client().routing())
    if isinstance(answer, ApiError):
        exc = answer
        icon = ":material/cloud_off:" if exc.unreachable and not exc.token_problem else \
            ":material/key_off:"
        st.error(errors.explain(exc), icon=icon)
        st.session_state[DOWN_KEY] = True
        if exc.unauthorized or exc.token_problem:
            token_form()
        return
    if st.session_state.get(DOWN_KEY):
        st.session_state[DOWN_KEY] = False
        st.rerun()


def token_form() -> None:
    """Recover from a wrong or missing token without restarting the console: a token entered
    here is kept in this browser session only (server memory), never written anywhere."""
    with st.form("pdctl-token", border=False):
        entered = st.text_input("API token for this session", type="password",
                                key="pdctl-token-input",
                                help="the controller's `STATE_DIR/token` (admin: reads and "
                                     "changes) or `STATE_DIR/viewer-token` (reads only)")
        if st.form_submit_button("Use this token") and entered.strip():
            st.session_state[TOKEN_KEY] = entered.strip()
            reads.forget_reads()
            st.rerun()


def scaled_time_banner() -> None:
    """Every page: say so when simulated time does not run at wall speed (nothing when the
    controller does not answer: the connection banner says why)."""
    scale = errors.quietly(lambda: reads.cluster().time_scale, 1.0)
    if scale == 1.0:
        return
    speed = f"{1 / scale:g}x faster" if scale < 1 else f"{scale:g}x slower"
    st.info(f"**Simulated time runs {speed} than the modelled hardware** (`sim.time_scale` "
            f"{scale:g}). One clock against the targets: every latency compared with a "
            "target (the health status, the TTFT percentile chart, pool utilization, the "
            "Planner) is in **modelled time**, wall time / "
            f"{scale:g}. The other latencies are wall time, {scale:g}x the modelled ones, and "
            f"rates and bandwidths {1 / scale:g}x the modelled ones; the Transfer page "
            "compares bandwidth with the link in modelled time.", icon=":material/speed:")


def health_banner(h: Health) -> None:
    """The status at a glance: green, amber or red, each check and pool problem listed."""
    lines = [f"- {'✗' if c.broken else '⚠' if c.near else '✓'} {c.text()}" for c in h.checks]
    lines += [f"- ⚠ {p}" for p in (*h.pools, *h.failures)]
    body = f"**{HEALTH_TITLES[h.status]}**\n\n" + "\n".join(lines)
    show = {"ok": st.success, "warn": st.warning, "breach": st.error, "no data": st.info}
    icon = {"ok": ":material/check_circle:", "warn": ":material/warning:",
            "breach": ":material/error:", "no data": ":material/hourglass_empty:"}
    show[h.status](body, icon=icon[h.status])


def prometheus_incidents() -> list[timeline.Incident]:
    """The alerts Prometheus has firing (its rules outlive this page: controller/obs/alerts.py),
    with their value and since when; none without a Prometheus. A Prometheus that cannot
    answer is said once, quietly."""
    p = prom_reads.prom()
    if p is None:
        return []
    try:
        return timeline.alert_incidents(prom_reads.firing(p))
    except PromError as exc:
        st.caption(f"Prometheus alerts unavailable: {exc}")
        return []


def incidents_strip(incidents: list[timeline.Incident], within: str) -> None:
    """Why the fleet is not healthy: every incident of the window, newest first, in one
    bordered strip (``st-key-incidents``); a quiet line when there is none."""
    if not incidents:
        st.caption(f"No incidents {within}: no instance failed, no pool quarantined, no "
                   "alert firing.")
        return
    icons = {"error": ":red[:material/error:]", "warning": ":orange[:material/warning:]"}
    with st.container(border=True, key="incidents"):
        st.markdown(f"**Incidents {within}** (newest first)")
        st.markdown("\n".join(f"- {icons[i.severity]} {i.text}" for i in incidents))


def transfer_alert(share: TransferShare) -> None:
    if share.alert:
        # Enough digits that the share reads above the threshold it broke (not "20% > 20%").
        digits = next((d for d in range(4) if round(share.p50, d + 2) >
                       round(share.alert_share, d + 2)), 3)
        st.error(f"**KV transfer is {share.p50:.{digits}%} of TTFT** (median over disaggregated "
                 f"requests), above the alert share of {share.alert_share:.0%}. The link "
                 "is slowing first tokens: check the KV link, or raise "
                 "`disagg_min_prompt_tokens` so short prompts stay colocated.",
                 icon=":material/warning:")


def kv_integrity_alerts(stats: StatsPublic, window_s: float) -> None:
    """Red while reads of freed KV blocks are recent (output may be wrong); a quieter warning
    when leases ran out in the window. Nothing from a controller without ``kv_integrity``."""
    k = stats.kv_integrity
    if k is None:
        return
    if text := integrity.alert_text(k, window_s):
        st.error(text, icon=":material/dangerous:")
    if text := integrity.expired_text(k, window_s):
        st.warning(text, icon=":material/hourglass_bottom:")


def state_alert(cluster: ClusterPublic) -> None:
    """An error while the controller cannot write its state directory."""
    if cluster.state_problem:
        st.error(f"**Changes are refused**: {cluster.state_problem}. Clients are served; "
                 "free space in the state directory, then make the change again.",
                 icon=":material/database:")


def quarantine_alerts(cluster: ClusterPublic, where: str = "") -> None:
    """An error per quarantined pool; ``where`` is appended (e.g. a pointer to a page)."""
    for role, q in integrity.quarantined(cluster).items():
        st.error(integrity.quarantine_text(role, q) + where, icon=":material/block:")
