"""The prefix cache on the pages (``/api/v1/cache``): the Pools page's section (the fleet's
hit rate reported and predicted, tokens saved, decode KV saved and moved, drift, the hit rate
over the range, each instance's rates and block index) and the Transfer page's decode KV
saved. What to show is ``dashboard.prefix_cache``'s."""

from __future__ import annotations

from typing import Any

import streamlit as st

from dashboard import charts
from dashboard import prefix_cache as pc
from dashboard.ui import errors, marks, plot, reads, tables
from dashboard.ui.figures import fmt_bytes
from dashboard.ui.sidebar import run_every
from dashboard.ui.tables import number_columns, text_columns
from dashboard.ui.timerange import time_range
from pdctl_api.schema import CachePublic

CACHE_COLUMNS = {
    **text_columns(instance="instance", role="role"),
    "index": st.column_config.TextColumn(
        "KV index", help="the controller's block index of the instance, from its KV events: "
                         "healthy (cache-aware routing uses it), stale and why, or no events "
                         "(a cache_aware pool routes such an instance by load)"),
    **number_columns("%d", requests="requests"),
    **{k: st.column_config.NumberColumn(label, format="percent") for k, label in (
        ("hit_rate", "hit rate"), ("predicted_hit_rate", "predicted"), ("drift", "drift"))},
    **number_columns("%d", blocks="blocks"),
    **number_columns("%.2f", events_per_s="events / s"),
}


def cache_metrics(c: CachePublic) -> None:
    for col, card in zip(st.columns(4), pc.cache_cards(c), strict=True):
        col.metric(card.label, card.value, delta=card.delta, delta_color="off",
                   delta_arrow="off", help=card.help)


@st.fragment(run_every=run_every())
@errors.card
def prefix_cache_section() -> None:
    """The Pools page's section: routing by prefix cache, and how well it predicts."""
    st.subheader("Prefix cache")
    rng = time_range()
    c = reads.range_cache(rng)
    if c is None:
        st.caption(pc.NO_CACHE_ROUTE)
        return
    st.caption(f"From `/api/v1/cache`, requests started {rng.within()}; {pc.policies_words(c)}"
               f" (Controls changes them)")
    for w in c.warnings:
        st.warning(w, icon=":material/warning:")
    if not pc.has_cache_data(c):
        st.info(pc.NO_CACHE_DATA.format(within=rng.within()), icon=":material/database:")
    else:
        cache_metrics(c)
        series = pc.hit_rate_series(c)
        marked = marks.range_marks(rng)
        st.caption(f"Hit rate per {c.step_s:g} s bucket: reported by the engines, predicted "
                   f"by the router (dashed); {marks.LEGEND}")
        plot.chart(st, charts.span(charts.annotate(charts.hit_rates(series), marked),
                                   rng.start(), rng.stop()), width="stretch")
        marks.in_words(st, marked)
    table = pc.cache_instances(c)
    if not table.empty:
        st.dataframe(table, column_config=CACHE_COLUMNS, hide_index=True, width="stretch",
                     height=tables.rows_height(len(table), 420))


def decode_kv_saved(where: Any) -> None:
    """The Transfer page's line on KV the decode instances did not pull (they held those
    blocks already); nothing without figures or from an older controller."""
    c = errors.quietly(lambda: reads.range_cache(time_range()), None)
    if c is None or not pc.has_cache_data(c):
        return
    moved, saved = c.decode_kv_bytes_moved, c.decode_kv_bytes_saved
    if moved is None or saved is None:  # the model's architecture is unknown
        return
    share = f" ({saved / (saved + moved):.0%} of the prompts' KV)" if saved + moved else ""
    where.caption(f"Decode prefix hits: {fmt_bytes(saved)} of KV not pulled, the decode "
                  f"instances held those blocks already (predicted from the KV index){share}; "
                  f"{fmt_bytes(moved)} pulled (modelled from the uncached prompt blocks). "
                  "Pools shows the prefix cache.")
