"""Prometheus's answers for the time-series panels, when the console has one: its client, the
cached range queries of a range (their end on a step boundary, so that the cards of a refresh
share them) and the alerts it has firing. Without a Prometheus the panels read the
controller's API."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import streamlit as st

from dashboard.config import CACHE_TTL_S, step_for
from dashboard.prom import (
    PromClient,
    PromError,
    PromRange,
    PromResult,
    fetch,
)
from dashboard.ui.session import PROM_KEY, config
from dashboard.ui.timerange import TimeRange


@st.cache_resource(max_entries=4, show_spinner=False)
def _prom_for(url: str) -> PromClient:
    return PromClient(url)


def prom() -> PromClient | None:
    """The configured Prometheus, or None: the panels then use the controller's API."""
    injected = st.session_state.get(PROM_KEY)
    if isinstance(injected, PromClient):
        return injected
    url = config().prometheus_url
    return _prom_for(url) if url else None


@st.cache_data(ttl=CACHE_TTL_S, max_entries=64, show_spinner=False)
def _prom_range(key: str, name: str, end: float, window_s: float, step_s: float,
                _c: PromClient) -> PromResult:
    return fetch(_c, name, PromRange(end, window_s, step_s))


@st.cache_data(ttl=CACHE_TTL_S, max_entries=8, show_spinner=False)
def _firing(key: str, _c: PromClient) -> list[dict[str, Any]]:
    return _c.alerts()


def firing(p: PromClient) -> list[dict[str, Any]]:
    """Each alert ``p`` has firing: ``labels``, ``activeAt``, ``value`` (raises
    ``PromError``)."""
    return _firing(p.cache_key, p)


def prom_window(rng: TimeRange) -> PromRange:
    """The range query, its end on a step boundary so that every card of one refresh asks
    the same question (and shares the cached answer)."""
    window, end = rng.asked()
    step = step_for(window)
    return PromRange(math.floor((time.time() if end is None else end) / step) * step, window,
                     step)


def prom_results(names: Sequence[str], rng: TimeRange) -> dict[str, PromResult] | None:
    """The named queries over the range, or None when no Prometheus is configured or it
    failed (then a short warning says so and the card shows the controller's figures)."""
    c = prom()
    if c is None:
        return None
    w = prom_window(rng)
    try:
        return {n: _prom_range(c.cache_key, n, w.end, w.window_s, w.step_s, c) for n in names}
    except PromError as exc:
        st.warning(f"Prometheus at {exc.url} did not answer ({exc.detail}); showing the "
                   "controller's own figures instead.", icon=":material/cloud_off:")
        return None


def prom_caption(what: str, rng: TimeRange) -> str:
    c, w = prom(), prom_window(rng)
    return (f"{what} · Prometheus `{c.url if c else ''}`, rate window {w.rate}, "
            f"step {w.step_s:g} s")


CACHED = (_prom_range,)  # what a change makes stale (``reads.forget_reads``)
