"""Tables on a page: the columns of a table (text and number columns by label), a height that
shows a table's rows up to a cap, and the table of recent requests with its suspect flag, its
hand-off decision and why, and its silent KV fallback flag."""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from dashboard import frames


def text_columns(**labels: str) -> dict[str, Any]:
    """A text column per frame column (``column=label``)."""
    return {c: st.column_config.TextColumn(label) for c, label in labels.items()}


def number_columns(fmt: str, **labels: str) -> dict[str, Any]:
    """A number column per frame column (``column=label``), each shown in ``fmt``."""
    return {c: st.column_config.NumberColumn(label, format=fmt) for c, label in labels.items()}


def rows_height(rows: int, most: int | None = None) -> int:
    """The height (px) that shows ``rows`` rows (one at least) and the header, at most
    ``most``: a short table without a scroll bar, a long one scrolled."""
    height = 38 + 35 * max(1, rows)
    return height if most is None else min(most, height)


REQUEST_TABLE_COLUMNS = {
    "suspect": st.column_config.TextColumn(
        "suspect", width="small",
        help="the prefill engine reported this request's KV read as one of blocks it had "
             "already freed (lease expired): its output may be wrong"),
    "started": st.column_config.DatetimeColumn("started", format="HH:mm:ss.SSS"),
    **text_columns(id="request", path="path", status="status"),
    **number_columns("%d", prompt_tokens="prompt", output_tokens="output"),
    **number_columns("%.1f", ttft_ms="TTFT ms", transfer_ms="transfer ms"),
    **text_columns(prefill_instance="prefill", decode_instance="decode", kv_handle="KV handle"),
    "decision": st.column_config.TextColumn(
        "decision", help="the hand-off decision (`routing.disagg_policy`): disaggregated or "
                         "local; empty from an older controller"),
    "decision_reason": st.column_config.TextColumn("why", help="the decision's reason"),
    "kv_fallback": st.column_config.TextColumn(
        "KV fallback", width="small",
        help="routed disaggregated, but its decode engine computed the prompt itself: the KV "
             "never arrived (silent fallback)"),
}


def requests_table(requests: pd.DataFrame) -> None:
    """Recent requests (a ``frames.requests_frame``), newest first, suspect ones and silent
    KV fallbacks flagged."""
    table = frames.recent_table(requests)
    st.dataframe(table, column_config=REQUEST_TABLE_COLUMNS, hide_index=True, width="stretch",
                 height=rows_height(len(table), 420))
