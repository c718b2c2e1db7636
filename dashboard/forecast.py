"""A pool change's prediction (``POST /api/v1/whatif/pools``) and, once the change has
converged, the prediction against what was measured (``GET /api/v1/whatif``), as the tables
and lines the console shows. Pure: no Streamlit here."""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from dashboard.ui.figures import fmt_share
from pdctl_api.schema import FiguresPublic, ForecastPublic, WhatIfPublic

FIGURE_LABELS: Mapping[str, str] = {
    "ttft": "TTFT", "queue": "queue", "prefill": "prefill", "transfer": "KV transfer",
    "decode_sched": "decode scheduling", "gap_p99": "inter-token gap p99 (per request)"}
STATUS_TEXT: Mapping[str, str] = {
    "proposed": "not made: the pools are as they were",
    "superseded": "a later change took the pools elsewhere: nothing to measure",
    "converging": "made; instances are starting or draining",
    "measuring": "converged; waiting for requests to measure",
    "measured": "measured on the requests served since the change converged"}


def _ms(v: float | None) -> str:
    return "—" if v is None else f"{v:,.0f}" if v >= 100 else f"{v:,.1f}"


def prediction_frame(f: ForecastPublic) -> pd.DataFrame:
    """One row per figure: p50 and p90 (ms) on the pools now and as proposed."""
    rows = [{"figure": label,
             "now p50": _ms(f.before.p50_ms.get(name)), "now p90": _ms(f.before.p90_ms.get(name)),
             "proposed p50": _ms(f.after.p50_ms.get(name)),
             "proposed p90": _ms(f.after.p90_ms.get(name))}
            for name, label in FIGURE_LABELS.items()]
    return pd.DataFrame(rows, columns=["figure", "now p50", "now p90", "proposed p50",
                                       "proposed p90"])


def prediction_lines(f: ForecastPublic) -> list[str]:
    """What the prediction played and its headline: share within target, accelerator-hours."""
    hours = f.accelerator_hours
    return [
        f"Predicted on the last {f.requests:,} requests ({f.span_s / 60:.1f} min of traffic), "
        f"{f.current_label} → {f.proposed_label}",
        f"within the TTFT target ({f.ttft_target_ms:,.0f} ms): "
        f"{fmt_share(f.before.within_ttft)} now → {fmt_share(f.after.within_ttft)} proposed",
        f"accelerator-hours for that traffic: {hours.get('current', 0):.3g} now → "
        f"{hours.get('proposed', 0):.3g} proposed",
    ]


def hindsight_lines(w: WhatIfPublic) -> list[str]:
    """The last prediction's status, and when measured the share within target both ways."""
    f = w.forecast
    if f is None or w.status is None:
        return []
    out = [f"Prediction #{f.id} ({f.proposed_label}): {STATUS_TEXT.get(w.status, w.status)}"]
    m: FiguresPublic | None = w.measured
    if w.status == "measuring":
        out.append(f"at least {w.min_requests} requests are needed")
    if m is not None:
        out.append(f"within the TTFT target: predicted {fmt_share(f.after.within_ttft)}, "
                   f"measured {fmt_share(m.within_ttft)} ({m.requests:,} requests)")
    return out


def hindsight_frame(w: WhatIfPublic) -> pd.DataFrame:
    """One row per figure and quantile: predicted, measured (ms) and the prediction's error."""
    rows = [{"figure": FIGURE_LABELS.get(c.figure, c.figure), "quantile": c.quantile,
             "predicted (ms)": _ms(c.predicted_ms), "measured (ms)": _ms(c.measured_ms),
             "error": "—" if c.error is None else f"{c.error:+.0%}"}
            for c in w.comparison]
    return pd.DataFrame(rows, columns=["figure", "quantile", "predicted (ms)", "measured (ms)",
                                       "error"])
