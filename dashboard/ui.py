"""Streamlit glue shared by the pages: the clients (controller, Prometheus), cached reads,
sidebar settings and how errors are explained. Pages import this; plain logic lives in
frames/charts/changes/whatif/prom."""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from datetime import time as day_time
from typing import Any, TypeVar

import pandas as pd
import streamlit as st

from dashboard import frames, integrity
from dashboard.client import ACTOR, ApiError, ControllerClient
from dashboard.config import RECENT_LIMIT, ConsoleConfig, current_config, step_for
from dashboard.health import Health
from dashboard.prom import (
    LOAD_METRICS,
    PromClient,
    PromError,
    Result,
    Window,
    fetch,
    instance_query,
)
from pdctl_api.client import BAD_TOKEN, NO_TOKEN
from pdctl_api.schema import (
    AccessPublic,
    AdvisorPublic,
    ClusterPublic,
    EventPublic,
    RequestPublic,
    StatsPublic,
    TargetsPublic,
    TimeseriesPublic,
    TransferShare,
)

# Tests put a fake client / config here (``AppTest.session_state``) instead of a real one.
CLIENT_KEY = "pdctl_client"
OPERATOR_KEY = "pdctl_operator"
PROM_KEY = "pdctl_prom"
CONFIG_KEY = "pdctl_config"
DOWN_KEY = "pdctl_down"
TOKEN_KEY = "pdctl_entered_token"  # a token the operator entered in this browser session
WINDOWS = {"1 min": 60.0, "5 min": 300.0, "15 min": 900.0, "1 h": 3600.0}
CUSTOM = "Custom range"
MAX_RANGE_S = 86_400.0  # the API's longest window
CACHE_TTL_S = 0.8  # shorter than the refresh interval: dedups within a refresh, never stale


def config() -> ConsoleConfig:
    cfg = st.session_state.get(CONFIG_KEY)
    return cfg if isinstance(cfg, ConsoleConfig) else current_config()


@st.cache_resource(max_entries=16, show_spinner=False)
def _client_for(url: str, token: str | None, actor: str = ACTOR) -> ControllerClient:
    return ControllerClient(url, token, actor=actor)


def actor() -> str:
    """Who the audit log names for this session's changes: ``pdctl-console``, or
    ``pdctl-console/<name>`` once the operator gave a name in the sidebar."""
    name = "".join(ch for ch in str(st.session_state.get(OPERATOR_KEY) or "").strip()
                   if ch.isprintable())
    return f"{ACTOR}/{name}"[:64] if name else ACTOR


@st.cache_resource(max_entries=16, show_spinner=False)
def _with_token(key: str, token: str, _base: ControllerClient) -> ControllerClient:
    return _base.with_token(token)


def client() -> ControllerClient:
    """The controller's client: with the token the operator entered in this session, if any,
    else the configured one (``PDCTL_TOKEN``, the token file)."""
    injected = st.session_state.get(CLIENT_KEY)
    if isinstance(injected, ControllerClient):
        base = injected
    else:
        cfg = config()
        token, _ = cfg.token()
        base = _client_for(cfg.controller_url, token, actor())
    entered = st.session_state.get(TOKEN_KEY)
    return _with_token(base.cache_key, entered, base) if entered else base


def token_source(cfg: ConsoleConfig) -> str:
    """Where this session's token comes from, in words."""
    if st.session_state.get(TOKEN_KEY):
        return "the token entered in this console session"
    return cfg.token()[1]


# ---- cached reads: keyed by the client's cache_key, shared by every card and session -----

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


T = TypeVar("T")


def _unless_absent(call: Callable[[], T]) -> T | None:
    """``call()``, or None where the controller answers 404: older than that endpoint."""
    try:
        return call()
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise


@st.cache_data(ttl=CACHE_TTL_S, max_entries=16, show_spinner=False)
def _targets(key: str, _c: ControllerClient) -> TargetsPublic | None:
    return _unless_absent(_c.targets)  # None: no targets, no health status


@st.cache_data(ttl=5.0, max_entries=16, show_spinner=False)
def _advisor(key: str, _c: ControllerClient) -> AdvisorPublic:
    return _c.advisor()


@st.cache_data(ttl=CACHE_TTL_S, max_entries=32, show_spinner=False)
def _events(key: str, limit: int, kind: str | None, _c: ControllerClient
            ) -> list[EventPublic]:
    return _c.events(limit, kind)


def cluster() -> ClusterPublic:
    c = client()
    return _cluster(c.cache_key, c)


def stats(rng: TimeRange) -> StatsPublic:
    c = client()
    window, end = rng.asked()
    return _stats(c.cache_key, window, end, c)


def timeseries(rng: TimeRange) -> TimeseriesPublic:
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


@st.cache_data(ttl=30.0, max_entries=16, show_spinner=False)
def _access(key: str, _c: ControllerClient) -> AccessPublic | None:
    return _unless_absent(_c.access)  # None: one token, which may change


def may_change() -> bool:
    """Whether this console's token may change the cluster (the admin's, not the viewer's)."""
    c = client()
    try:
        access = _access(c.cache_key, c)
    except ApiError:
        return True  # the connection banner says why; a change would say it again
    return access is None or access.may_change


READ_ONLY_NOTE = ("This console holds the **viewer token**: it shows everything and changes "
                  "nothing (the controller answers 403 to a change). Changes need the admin "
                  "token (`STATE_DIR/token`).")


def targets() -> TargetsPublic | None:
    c = client()
    return _targets(c.cache_key, c)


def advisor() -> AdvisorPublic:
    c = client()
    return _advisor(c.cache_key, c)


def events(limit: int, kind: str | None) -> list[EventPublic]:
    c = client()
    return _events(c.cache_key, limit, kind, c)


# ---- Prometheus (optional): the time-series panels' source when configured ----------------

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
                _c: PromClient) -> Result:
    return fetch(_c, name, Window(end, window_s, step_s))


@st.cache_data(ttl=CACHE_TTL_S, max_entries=8, show_spinner=False)
def _firing(key: str, _c: PromClient) -> list[dict[str, str]]:
    return [dict(r.get("metric", {})) for r in _c.instant('ALERTS{alertstate="firing"}')]


def prometheus_alerts() -> None:
    """The alerts Prometheus has firing (its rules outlive this page: controller/obs/alerts.py);
    nothing without a Prometheus. A Prometheus that cannot answer is said once, quietly."""
    p = prom()
    if p is None:
        return
    try:
        firing = _firing(p.cache_key, p)
    except PromError as exc:
        st.caption(f"Prometheus alerts unavailable: {exc}")
        return
    for a in sorted(firing, key=lambda m: m.get("alertname", "")):
        st.error(f"**Prometheus alert firing: {a.get('alertname', '?')}** "
                 f"(severity {a.get('severity', '?')})", icon=":material/notifications:")


def prom_window(rng: TimeRange) -> Window:
    """The range query, its end on a step boundary so that every card of one refresh asks
    the same question (and shares the cached answer)."""
    window, end = rng.asked()
    step = step_for(window)
    return Window(math.floor((time.time() if end is None else end) / step) * step, window, step)


def prom_results(names: Sequence[str], rng: TimeRange) -> dict[str, Result] | None:
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


@st.cache_data(ttl=CACHE_TTL_S, max_entries=32, show_spinner=False)
def _prom_instance(key: str, instance_id: str, end: float, window_s: float, step_s: float,
                   _c: PromClient) -> dict[str, Result]:
    w = Window(end, window_s, step_s)
    return {name: _c.range(instance_query(name, instance_id), w.start, w.end, w.step_s)
            for name in LOAD_METRICS}


def prom_instance(instance_id: str, rng: TimeRange) -> dict[str, Result] | None:
    """One engine's load series over the range, or None without a Prometheus (or when it
    failed: a caption says so)."""
    c = prom()
    if c is None:
        return None
    w = prom_window(rng)
    try:
        return _prom_instance(c.cache_key, instance_id, w.end, w.window_s, w.step_s, c)
    except PromError as exc:
        st.caption(f"Its load over time is unavailable: Prometheus {exc}")
        return None


def prom_caption(what: str, rng: TimeRange) -> str:
    c, w = prom(), prom_window(rng)
    return (f"{what} · Prometheus `{c.url if c else ''}`, rate window {w.rate}, "
            f"step {w.step_s:g} s")


def forget_reads() -> None:
    """After a change: the next read must show it."""
    for fn in (_cluster, _stats, _timeseries, _requests, _advisor, _events, _prom_range,
               _targets, _prom_instance):
        fn.clear()


# ---- sidebar settings ----------------------------------------------------------------------

@dataclass(frozen=True)
class TimeRange:
    """What the pages show: the last ``window_s`` seconds (``end`` None: live, ending now),
    or the fixed range ``[end - window_s, end)`` the operator picked."""

    window_s: float
    end: float | None = None

    def stop(self) -> float:
        """The range's end now: a fixed end not yet reached is now."""
        now = time.time()
        return now if self.end is None else min(self.end, now)

    def start(self) -> float:
        return (time.time() if self.end is None else self.end) - self.window_s

    def asked(self) -> tuple[float, float | None]:
        """``(window_s, end)`` to ask the API for: a fixed range not over yet is asked from
        its start up to now (the whole second, so that the cards of a refresh share it)."""
        if self.end is None or self.end <= time.time():
            return self.window_s, self.end
        now = float(math.floor(time.time()))
        return max(1.0, now - self.start()), now

    def within(self) -> str:
        """``in the last 300 s`` or ``between 14:00:00 and 14:15:00``."""
        if self.end is None:
            return f"in the last {self.window_s:g} s"
        return f"between {clock(self.end - self.window_s)} and {clock(self.end)}"

    def label(self) -> str:
        if self.end is None:
            return f"Last {self.window_s:g} s"
        return (f"{clock(self.end - self.window_s)} → {clock(self.end)} "
                f"({_span_text(self.window_s)}, a fixed range)")


def _span_text(seconds: float) -> str:
    return (f"{seconds / 3600:g} h" if seconds >= 3600 and seconds % 900 == 0 else
            f"{seconds / 60:g} min" if seconds >= 60 and seconds % 60 == 0 else
            f"{seconds:g} s")


def custom_range(day: date, start: day_time, stop: day_time) -> TimeRange:
    """The range from ``start`` to ``stop`` on ``day`` (local time); a ``stop`` at or before
    ``start`` is on the next day (a range across midnight)."""
    begin = datetime.combine(day, start)
    end = datetime.combine(day, stop)
    if end <= begin:
        end += timedelta(days=1)
    return TimeRange(min((end - begin).total_seconds(), MAX_RANGE_S), end.timestamp())


def time_range() -> TimeRange:
    """The range the sidebar picked: a preset window ending now, or a custom fixed range."""
    choice = st.session_state.get("pdctl_window", "5 min")
    if choice != CUSTOM:
        return TimeRange(WINDOWS.get(choice, 300.0))
    begin, stop = _default_range()
    return custom_range(st.session_state.get("pdctl_range_day", begin.date()),
                        st.session_state.get("pdctl_range_from", begin.time()),
                        st.session_state.get("pdctl_range_to", stop.time()))


def _default_range() -> tuple[datetime, datetime]:
    """A custom range first shown: the 15 minutes up to the next whole minute (so that it
    holds what just happened)."""
    stop = datetime.now().replace(second=0, microsecond=0) + timedelta(minutes=1)
    return stop - timedelta(minutes=15), stop


def _range_picker() -> None:
    """Day, from and to of a custom range."""
    begin, stop = _default_range()
    defaults = {"pdctl_range_day": begin.date(), "pdctl_range_from": begin.time(),
                "pdctl_range_to": stop.time()}
    for key, value in defaults.items():
        st.session_state.setdefault(key, value)
    st.date_input("Day", key="pdctl_range_day", max_value=stop.date(),
                  help="the day the range starts (local time of the console)")
    left, right = st.columns(2)
    left.time_input("From", key="pdctl_range_from", step=60)
    right.time_input("To", key="pdctl_range_to", step=60,
                     help="at or before From: the next day")
    rng = time_range()
    end = rng.end if rng.end is not None else rng.stop()
    note = "  \nnot over yet: the pages show it up to now" if end > time.time() else ""
    st.caption(f"{datetime.fromtimestamp(end - rng.window_s):%Y-%m-%d %H:%M} → "
               f"{datetime.fromtimestamp(end):%Y-%m-%d %H:%M} "
               f"({_span_text(rng.window_s)}){note}")


def run_every() -> float | None:
    """The live cards' refresh interval, or None when the operator paused live refresh."""
    return config().refresh_s if st.session_state.get("pdctl_live", True) else None


def sidebar() -> None:
    cfg = config()
    with st.sidebar:
        st.selectbox("Window", [*WINDOWS, CUSTOM], index=1, key="pdctl_window",
                     help="time window of the statistics and charts: the last minutes up to "
                          f"now, or a fixed range in the past ({CUSTOM})")
        if st.session_state.get("pdctl_window") == CUSTOM:
            _range_picker()
        st.toggle("Live", value=True, key="pdctl_live",
                  help=f"refresh the live cards every {cfg.refresh_s:g} s")
        if not may_change():
            st.caption(":material/visibility: viewer token: read only")
        if st.session_state.get(TOKEN_KEY):
            st.caption(":material/key: using the token entered in this session")
            if st.button("Forget the entered token", key="pdctl-forget-token"):
                del st.session_state[TOKEN_KEY]
                forget_reads()
                st.rerun()
        st.text_input("Operator", key=OPERATOR_KEY, max_chars=40, placeholder="your name",
                      help=f"the audit log names your changes `{ACTOR}/<name>` "
                           f"(`{ACTOR}` without a name)")
        series = (f"Prometheus `{cfg.prometheus_url}`" if cfg.prometheus_url
                  else "the controller's API")
        st.caption(f"controller `{cfg.controller_url}`  \ntime series from {series}  \n"
                   f"refresh every {cfg.refresh_s:g} s")


# ---- errors --------------------------------------------------------------------------------

def explain(exc: ApiError, cfg: ConsoleConfig | None = None) -> str:
    """An operator-facing explanation of a failed call: what happened and what to do."""
    cfg = cfg or config()
    url = cfg.controller_url
    source = token_source(cfg)
    if exc.unreachable and exc.detail == BAD_TOKEN:
        return (f"The API token read from {source} {BAD_TOKEN.removeprefix('the API token ')}."
                " Enter the controller's token below, or fix where it came from.")
    if exc.unreachable and exc.detail == NO_TOKEN:
        return (f"No API token: the console reads it from `PDCTL_TOKEN` or `{source}`, and "
                "found none. Point `--state-dir` / `PDCTL_STATE_DIR` at the controller's "
                "state directory, or set `PDCTL_TOKEN`.")
    if exc.unreachable:
        return (f"Cannot reach the controller at {url} ({exc.detail}). Is it running? Start "
                "one with `pdctl lab` or `pdctl controller`, or point the console at it with "
                f"`--controller URL` / `PDCTL_URL`. Retrying every {cfg.refresh_s:g} s.")
    if exc.unauthorized:
        return (f"The controller at {url} refused the API token (401: {exc.detail}). The "
                f"token was read from {source}; it must match the controller's "
                "`STATE_DIR/token` (or `STATE_DIR/viewer-token`): enter one below, or start "
                "the console with the controller's `--state-dir`, or set `PDCTL_TOKEN`.")
    return f"The controller answered {exc.status}: {exc.detail}"


def change_outcome(ok: bool, body: Any) -> None:
    """A change's result: a toast when it was sent, else the controller's refusal verbatim
    (or why it could not be reached)."""
    if ok:
        st.toast(str(body), icon=":material/check_circle:")
    elif isinstance(body, ApiError) and body.refused:
        st.error(f"Refused by the controller (HTTP {body.status}); nothing was changed:\n\n"
                 f"{body.detail}", icon=":material/block:")
    else:
        st.error(explain(body), icon=":material/block:")


def card_error(exc: ApiError) -> None:
    """Inside a live card: short, since the page banner explains connection problems."""
    if exc.unreachable or exc.unauthorized:
        st.warning("No data: the controller is not answering (see above).", icon="⚠️")
    else:
        st.error(explain(exc))


def connection_banner() -> None:
    """Checks the controller (one cheap authenticated call); on failure shows why and marks the
    session down so pages render nothing; on recovery reruns the whole app."""
    try:
        client().routing()
    except ApiError as exc:
        icon = ":material/cloud_off:" if exc.unreachable and not exc.token_problem else \
            ":material/key_off:"
        st.error(explain(exc), icon=icon)
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
            forget_reads()
            st.rerun()


def scaled_time_banner() -> None:
    """Every page: say so when simulated time does not run at wall speed."""
    try:
        scale = cluster().time_scale
    except ApiError:
        return  # the connection banner says why
    if scale == 1.0:
        return
    speed = f"{1 / scale:g}x faster" if scale < 1 else f"{scale:g}x slower"
    st.info(f"**Simulated time runs {speed} than the modelled hardware** (`sim.time_scale` "
            f"{scale:g}): latencies here are wall time, {scale:g}x the modelled ones, and "
            f"rates and bandwidths {1 / scale:g}x the modelled ones. The Transfer page "
            "compares bandwidth with the link in modelled time; the Planner page works in "
            "modelled time throughout.", icon=":material/speed:")


HEALTH_TITLES = {"ok": "Healthy", "warn": "Watch", "breach": "Target broken",
                 "no data": "No traffic in the window"}


def health_banner(h: Health) -> None:
    """The status at a glance: green, amber or red, each check and pool problem listed."""
    lines = [f"- {'✗' if c.broken else '⚠' if c.near else '✓'} {c.text()}" for c in h.checks]
    lines += [f"- ⚠ {p}" for p in h.pools]
    body = f"**{HEALTH_TITLES[h.status]}**\n\n" + "\n".join(lines)
    show = {"ok": st.success, "warn": st.warning, "breach": st.error, "no data": st.info}
    icon = {"ok": ":material/check_circle:", "warn": ":material/warning:",
            "breach": ":material/error:", "no data": ":material/hourglass_empty:"}
    show[h.status](body, icon=icon[h.status])


def rate_basis(s: StatsPublic) -> str:
    """What a window's rates divide by: the window, or the part of it the controller ran."""
    covered = s.covered_s if s.covered_s is not None else s.window_s
    if covered >= s.window_s - 0.5:
        return f"per second over the {s.window_s:g} s window"
    return (f"per second over the last {covered:.0f} s: the controller has recorded requests "
            f"for only that part of the {s.window_s:g} s window")


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


def quarantine_alerts(cluster: ClusterPublic, where: str = "") -> None:
    """An error per quarantined pool; ``where`` is appended (e.g. a pointer to a page)."""
    for role, q in integrity.quarantined(cluster).items():
        st.error(integrity.quarantine_text(role, q) + where, icon=":material/block:")


REQUEST_COLUMNS = {
    "suspect": st.column_config.TextColumn(
        "suspect", width="small",
        help="the prefill engine reported this request's KV read as one of blocks it had "
             "already freed (lease expired): its output may be wrong"),
    "started": st.column_config.DatetimeColumn("started", format="HH:mm:ss.SSS"),
    "id": st.column_config.TextColumn("request"),
    "path": st.column_config.TextColumn("path"),
    "status": st.column_config.TextColumn("status"),
    "prompt_tokens": st.column_config.NumberColumn("prompt", format="%d"),
    "output_tokens": st.column_config.NumberColumn("output", format="%d"),
    "ttft_ms": st.column_config.NumberColumn("TTFT ms", format="%.1f"),
    "transfer_ms": st.column_config.NumberColumn("transfer ms", format="%.1f"),
    "prefill_instance": st.column_config.TextColumn("prefill"),
    "decode_instance": st.column_config.TextColumn("decode"),
    "kv_handle": st.column_config.TextColumn("KV handle"),
}


def requests_table(requests: pd.DataFrame) -> None:
    """Recent requests (a ``frames.requests_frame``), newest first, suspect ones flagged."""
    table = frames.recent_table(requests)
    st.dataframe(table, column_config=REQUEST_COLUMNS, hide_index=True, width="stretch",
                 height=min(420, 38 + 35 * max(1, len(table))))


def chart(where: Any, spec: Any, **kwargs: Any) -> None:
    """``where.altair_chart(spec)``, skipping Altair's JSON-schema validation of the whole
    spec, which Streamlit asks for (``to_dict()``) at every refresh (with ``altair_speed``:
    0.92 of the render time on the Transfer and Pools pages, measured in BENCHMARKS.md part
    4). The chart builders' specs are validated by their unit tests (``tests/dashboard``)."""
    object.__setattr__(spec, "to_dict", functools.partial(type(spec).to_dict, spec,
                                                          validate=False))
    where.altair_chart(spec, **kwargs)


def clock(ts: float) -> str:
    return datetime.fromtimestamp(ts).strftime("%H:%M:%S")


def fmt_bytes(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def fmt_ms(ms: Any) -> str:
    return f"{float(ms):.1f} ms"
