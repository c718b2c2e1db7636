"""The hand-off decision on the Transfer page (``/api/v1/stats`` ``handoff``, the
``/timeseries`` buckets' ``decided_*``, the request records' ``decision``): the policy in
force, the window's decision mix, the mix over the range with the page's marks, the silent KV
fallbacks per pair, and the latest decisions with their reasons. What to show is
``dashboard.handoff``'s."""

from __future__ import annotations

import streamlit as st

from dashboard import charts
from dashboard import handoff as ho
from dashboard.config import RECENT_LIMIT
from dashboard.ui import errors, marks, plot, reads, tables
from dashboard.ui.sidebar import run_every
from dashboard.ui.tables import number_columns, text_columns
from dashboard.ui.timerange import time_range
from pdctl_api.schema import HandoffPublic

FALLBACK_COLUMNS = {
    **text_columns(prefill="prefill", decode="decode"),
    **number_columns("%d", requests="silent fallbacks"),
}
DECISION_COLUMNS = {
    "fallback": st.column_config.TextColumn(
        "KV fallback", width="small", help="routed disaggregated, but its decode engine "
                                           "computed the prompt itself: the KV never arrived"),
    **text_columns(id="request", decision="decision", decision_reason="why", path="path",
                   prefill_instance="prefill", decode_instance="decode"),
    **number_columns("%d", prompt_tokens="prompt"),
    **number_columns("%.1f", ttft_ms="TTFT ms"),
}
LATEST = 10


def handoff_metrics(h: HandoffPublic) -> None:
    for col, card in zip(st.columns(5), ho.handoff_cards(h), strict=True):
        col.metric(card.label, card.value, delta=card.delta, delta_color="off",
                   delta_arrow="off", help=card.help)


@st.fragment(run_every=run_every())
@errors.card
def handoff_section(limit: int = RECENT_LIMIT) -> None:
    """Which requests move KV at all, why, and the ones whose KV never arrived; the latest
    decisions from the newest ``limit`` records of the range (the page's one read)."""
    st.subheader("Hand-off")
    rng = time_range()
    h = ho.handoff_of(reads.range_stats(rng))
    if h is None:
        st.caption(ho.NO_HANDOFF)
        return
    st.caption(f"From `/api/v1/stats` `handoff`, requests started {rng.within()}; "
               f"{ho.policy_words(h)} (Controls changes it)")
    for a in ho.alerts_of(h):
        st.warning(a, icon=":material/warning:")
    if not ho.decided(h) and not h.fallback_requests:
        st.info(ho.NO_DECISIONS.format(within=rng.within()), icon=":material/alt_route:")
        return
    handoff_metrics(h)
    ts = reads.range_timeseries(rng)
    left, right = st.columns([3, 2])
    if ho.has_decisions(ts):
        marked = marks.range_marks(rng)
        left.caption(f"Decisions per {ts.step_s:g} s bucket, stacked; {marks.LEGEND}")
        plot.chart(left, charts.span(charts.annotate(charts.decision_mix(
            ho.decision_series(ts)), marked), rng.start(), rng.stop()), width="stretch")
        marks.in_words(left, marked)
    else:
        left.caption("This controller does not count decisions per bucket.")
    right.markdown("**Silent KV fallbacks per prefill → decode pair**")
    pairs = ho.fallback_pairs(h)
    if pairs.empty:
        right.caption(f"None {rng.within()}: every disaggregated request's KV arrived.")
    else:
        right.dataframe(pairs, column_config=FALLBACK_COLUMNS, hide_index=True,
                        width="stretch", height=tables.rows_height(len(pairs), 280))
    latest = ho.latest_decisions(reads.requests_in(rng, limit), LATEST)
    st.markdown("**Latest decisions**")
    if latest.empty:
        st.caption(f"No request {rng.within()} carries a decision.")
        return
    st.dataframe(latest, column_config=DECISION_COLUMNS, hide_index=True, width="stretch",
                 height=tables.rows_height(len(latest), 420))
