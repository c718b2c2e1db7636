"""What-if before apply on the pages: a pool change's review shows what the controller
predicts it will do on the recent traffic (Controls and Planner), and the What-if card shows
the last prediction against what was measured once the change converged. What to show is
``dashboard.forecast``'s; the figures are the controller's (``/api/v1/whatif``)."""

from __future__ import annotations

from collections.abc import Mapping

import streamlit as st

from dashboard import forecast
from dashboard.client import ApiError
from dashboard.ui import errors
from dashboard.ui.session import client
from dashboard.ui.sidebar import run_every
from pdctl_api.schema import ForecastPublic

Prediction = ForecastPublic | str  # the prediction, or why there is none


def predict(pools: Mapping[str, Mapping[str, int]]) -> Prediction:
    """The controller's prediction for ``pools`` as proposed (``{"decode": {"size": 2}}``),
    or why it made none: a review shows either, and the change can still be confirmed."""
    got = errors.attempt(lambda: client().predict_pools(pools))
    if isinstance(got, ApiError):
        return got.detail if got.status else f"the controller did not answer: {got.detail}"
    return got


def show_prediction(pred: Prediction | None) -> None:
    """Inside a review: the prediction's table and headline, or why there is none."""
    if pred is None:
        return
    if isinstance(pred, str):
        st.caption(f"What-if: {pred}")
        return
    with st.container(key="pdctl-prediction"):
        st.markdown("**What-if** · " + " · ".join(forecast.prediction_lines(pred)))
        st.dataframe(forecast.prediction_frame(pred), hide_index=True)
        st.caption("; ".join(pred.notes))


@st.fragment(run_every=run_every())
@errors.card
def hindsight() -> None:
    """The last prediction against what was measured once its change converged; nothing
    before the first prediction, or from an older controller (no such route)."""
    try:
        w = client().whatif()
    except ApiError as exc:
        if exc.status == 404:
            return
        raise
    if w.forecast is None:
        return
    with st.container(border=True, key="pdctl-hindsight"):
        st.subheader("What-if: predicted against measured")
        st.markdown("\n".join(f"- {line}" for line in forecast.hindsight_lines(w)))
        if w.comparison:
            st.dataframe(forecast.hindsight_frame(w), hide_index=True)
