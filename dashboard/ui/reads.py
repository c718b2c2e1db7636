"""The controller's answers for the pages, cached: each read is keyed by the client's
``cache_key`` and shared by every card and browser session for ``CACHE_TTL_S``, so that the
cards of one refresh make one API call each; and ``forget_reads`` after a change."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TypeVar

import pandas as pd
import streamlit as st

from dashboard import frames
from dashboard.client import ApiError, ControllerClient
from dashboard.config import CACHE_TTL_S, RECENT_LIMIT, step_for
from dashboard.ui import errors, prom_reads
from dashboard.ui.session import client
from dashboard.ui.timerange import TimeRange
from pdctl_api.schema import (
    AccessPublic,
    AdvisorPublic,
    CachePublic,
    ClusterPublic,
    EventPublic,
    RequestPublic,
    StatsPublic,
    TargetsPublic,
    TimeseriesPublic,
    UtilizationPublic,
)

Found = TypeVar("Found")
Missing = TypeVar("Missing")


@st.cache_data(ttl=CACHE_TTL_S, max_entries=32, show_spinner=False)
def _cluster(key: str, _c: ControllerClient) -> ClusterPublic:
    return _c.cluster()


@st.cache_data(ttl=CACHE_TTL_S, max_entries=32, show_spinner=False)
def _stats(key: str, window_s: float, end: float | None, _c: ControllerClient) -> StatsPublic:
    return _c.stats(window_s, end)


@st.cache_data(ttl=CACHE_TTL_S, max_entries=32, show_spinner=False)
def _timeseries(key: str, window_s: float, step_s: float, end: float | None,
                _c: ControllerClient) -> TimeseriesPublic:
    return _c.timeseries(window_s, step_s, end)


@st.cache_data(ttl=CACHE_TTL_S, max_entries=32, show_spinner=False)
def _requests(key: str, limit: int, since: float | None, until: float | None,
              _c: ControllerClient) -> list[RequestPublic]:
    return _c.requests(limit, since, until)


def _or_absent(call: Callable[[], Found], absent: Callable[[ApiError], Missing]
               ) -> Found | Missing:
    """``call()``, or ``absent(its error)`` where the controller answers 404 (it is older
    than that endpoint, or has no such record)."""
    try:
        return call()
    except ApiError as exc:
        if exc.status == 404:
            return absent(exc)
        raise


def _none(exc: ApiError) -> None:
    return None


@st.cache_data(ttl=CACHE_TTL_S, max_entries=16, show_spinner=False)
def _targets(key: str, _c: ControllerClient) -> TargetsPublic | None:
    return _or_absent(_c.targets, _none)  # None: no targets, no health status


@st.cache_data(ttl=5.0, max_entries=16, show_spinner=False)
def _advisor(key: str, window_s: float, end: float | None, _c: ControllerClient
             ) -> AdvisorPublic:
    return _c.advisor(window_s, end)


@st.cache_data(ttl=CACHE_TTL_S, max_entries=32, show_spinner=False)
def _audit_events(key: str, limit: int, kind: str | None, _c: ControllerClient
                  ) -> list[EventPublic]:
    return _c.events(limit, kind)


@st.cache_data(ttl=CACHE_TTL_S, max_entries=32, show_spinner=False)
def _range_events(key: str, limit: int, kind: str | None, since: float, until: float | None,
                  _c: ControllerClient) -> list[EventPublic]:
    return _c.events(limit, kind, since=since, until=until)


@st.cache_data(ttl=30.0, max_entries=16, show_spinner=False)
def _access(key: str, _c: ControllerClient) -> AccessPublic | None:
    return _or_absent(_c.access, _none)  # None: one token, which may change


def cluster() -> ClusterPublic:
    c = client()
    return _cluster(c.cache_key, c)


def range_stats(rng: TimeRange) -> StatsPublic:
    """``/api/v1/stats`` of the range."""
    c = client()
    window, end = rng.asked()
    return _stats(c.cache_key, window, end, c)


def previous_stats(rng: TimeRange) -> StatsPublic:
    """``/api/v1/stats`` of the window of the same length just before the range (its end on
    a whole second, so that the refreshes of that second share it)."""
    c = client()
    window, _ = rng.asked()
    return _stats(c.cache_key, window, float(math.floor(rng.start())), c)


def range_timeseries(rng: TimeRange) -> TimeseriesPublic:
    """``/api/v1/timeseries`` of the range, about 60 buckets."""
    c = client()
    window, end = rng.asked()
    return _timeseries(c.cache_key, window, step_for(window), end, c)


def recent_requests(limit: int = RECENT_LIMIT, rng: TimeRange | None = None
                    ) -> list[RequestPublic]:
    """The newest ``limit`` requests; of a fixed range's, when ``rng`` is one (a live window
    filters its own: its start moves on every refresh)."""
    c = client()
    window, end = rng.asked() if rng is not None else (0.0, None)
    if end is None:
        return _requests(c.cache_key, limit, None, None, c)
    return _requests(c.cache_key, limit, end - window, end, c)


def requests_in(rng: TimeRange, limit: int = RECENT_LIMIT) -> pd.DataFrame:
    """The newest ``limit`` requests that started in the range, as a ``requests_frame``."""
    df = frames.requests_frame(recent_requests(limit, rng))
    return df[df["started_at"] >= rng.start()]


def request_by_id(request_id: str) -> RequestPublic | str:
    """One request's record, or why the controller has none (its 404 ``detail``: unknown,
    or no longer among the records it keeps). Not cached: the operator asks for it."""
    return _or_absent(lambda: client().request(request_id), lambda exc: exc.detail)


def may_change() -> bool:
    """Whether this console's token may change the cluster (the admin's, not the viewer's).
    A failed call says yes: the connection banner says why; a change would say it again."""
    c = client()
    access = errors.quietly(lambda: _access(c.cache_key, c), None)
    return access is None or access.may_change


def targets() -> TargetsPublic | None:
    c = client()
    return _targets(c.cache_key, c)


def advisor(rng: TimeRange) -> AdvisorPublic:
    """``/api/v1/advisor``: the advice from the range's requests."""
    c = client()
    window, end = rng.asked()
    return _advisor(c.cache_key, window, end, c)


def audit_events(limit: int, kind: str | None) -> list[EventPublic]:
    """The newest ``limit`` audit events (of ``kind`` only, when given)."""
    c = client()
    return _audit_events(c.cache_key, limit, kind, c)


EVENTS_STEP_S = 10.0  # a live window's events are asked from a 10 s boundary (cached)


def range_events(rng: TimeRange, limit: int = 500, kind: str | None = None
                 ) -> list[EventPublic]:
    """The newest ``limit`` audit events (of ``kind`` only, when given) within the range,
    newest first."""
    c = client()
    window, end = rng.asked()
    since = (end if end is not None else time.time()) - window
    if end is None:  # a live window: ask from a step boundary, so refreshes share the answer
        asked = math.floor(since / EVENTS_STEP_S) * EVENTS_STEP_S
        return [e for e in _range_events(c.cache_key, limit, kind, asked, None, c)
                if e.ts >= since]
    return _range_events(c.cache_key, limit, kind, since, end, c)


def forget_reads() -> None:
    """After a change: the next read must show it."""
    for fn in (_cluster, _stats, _timeseries, _requests, _advisor, _audit_events,
               _range_events, _targets, _utilization, _cache,
               *prom_reads.CACHED):
        fn.clear()


@st.cache_data(ttl=CACHE_TTL_S, max_entries=32, show_spinner=False)
def _utilization(key: str, window_s: float, step_s: float, end: float | None,
                 _c: ControllerClient) -> UtilizationPublic | None:
    return _or_absent(lambda: _c.utilization(window_s, step_s, end), _none)


def range_utilization(rng: TimeRange) -> UtilizationPublic | None:
    """``/api/v1/utilization`` of the range in ``/timeseries``'s buckets (about 60): every
    pool and instance of a page from one read; None from a controller older than it."""
    c = client()
    window, end = rng.asked()
    return _utilization(c.cache_key, window, step_for(window), end, c)


@st.cache_data(ttl=CACHE_TTL_S, max_entries=32, show_spinner=False)
def _cache(key: str, window_s: float, step_s: float, end: float | None,
           _c: ControllerClient) -> CachePublic | None:
    return _or_absent(lambda: _c.cache(window_s, step_s, end), _none)


def range_cache(rng: TimeRange) -> CachePublic | None:
    """``/api/v1/cache`` of the range in ``/timeseries``'s buckets (about 60): the prefix
    cache's hit rates, savings and block index; None from a controller older than it."""
    c = client()
    window, end = rng.asked()
    return _cache(c.cache_key, window, step_for(window), end, c)
