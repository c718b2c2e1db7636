"""Pool and instance load over time (``/api/v1/utilization``) as the Pools page shows it:
frames (the answer -> DataFrames) and their charts. Pure: no Streamlit, no I/O.

One unit per quantity, everywhere: utilization and KV cache usage stay ratios in the frames
and read as percents (axes, tooltips, cards: ``PERCENT``); requests are counts; tokens per
second are prompt tokens/s for a prefill pool's work and output tokens/s for a decode pool's,
in the answer's clock."""

from __future__ import annotations

from dataclasses import dataclass

import altair as alt
import pandas as pd

from dashboard import altair_speed
from dashboard.charts import TIME
from pdctl_api.schema import InstanceLoadPublic, LoadSeriesPublic, Role, UtilizationPublic

altair_speed.install()

PERCENT = ".0%"  # utilization and KV cache usage, on every axis, legend and card
PERCENT_TIP = ".1%"
POOL_LINE = "pool"  # the pool's own series among its instances' lines
POOL_COLOR = "#333333"
LOAD_HEIGHT = 280  # the whole chart: its legend below takes ~70 px of it


@dataclass(frozen=True)
class Quantity:
    """One figure of the load: its title, how its values read, and whether it is a ratio
    read as a percent."""

    title: str
    fmt: str
    percent: bool = False

    @property
    def tip(self) -> str:
        return PERCENT_TIP if self.percent else self.fmt


QUANTITIES = {
    "utilization": Quantity("% of capacity", PERCENT, True),
    "running": Quantity("running requests", ",.1f"),
    "waiting": Quantity("waiting requests", ",.1f"),
    "tokens_per_s": Quantity("tokens / s", ",.0f"),
    "kv_cache_usage": Quantity("KV cache (%)", PERCENT, True),
}
CHOICES = {"Utilization %": "utilization", "Running": "running", "Waiting": "waiting",
           "Tokens / s": "tokens_per_s", "KV cache %": "kv_cache_usage"}


def work_tokens(role: Role | str) -> str:
    """The tokens a pool's capacity counts: ``prompt`` (prefill) or ``output`` (decode)."""
    return "prompt" if Role(role) is Role.PREFILL else "output"


def _values(series: LoadSeriesPublic, metric: str, role: Role | str) -> list[float | None]:
    if metric == "tokens_per_s":
        return list(getattr(series, f"{work_tokens(role)}_tokens_per_s"))
    return list(getattr(series, metric))


def _at_times(df: pd.DataFrame) -> pd.DataFrame:
    """``time`` from ``t`` (unix s), row by row, then only ``time, series, value``."""
    df = df.dropna(subset=["value"]).astype({"value": "float64", "t": "float64"})
    return df.assign(time=pd.to_datetime(df["t"], unit="s", utc=True))[
        ["time", "series", "value"]].reset_index(drop=True)


def pool_lines(u: UtilizationPublic, role: Role | str, metric: str) -> pd.DataFrame:
    """``time, series, value``: a line per instance of the pool seen in the window (one that
    ended stops; its replacement starts) and the pool's own (``POOL_LINE``); buckets without
    a value are left out."""
    role = Role(role)
    parts = [(i.id, _values(i.series, metric, role)) for i in u.instances if i.role is role]
    if role in u.pools:
        parts.append((POOL_LINE, _values(u.pools[role].series, metric, role)))
    frames = [pd.DataFrame({"t": u.t, "series": name, "value": values})
              for name, values in parts]
    return _at_times(pd.concat(frames, ignore_index=True) if frames
                     else pd.DataFrame({"t": [], "series": [], "value": []}))


INSTANCE_CHARTS = {  # its drill-down: a chart per unit, a line per figure
    "percent of capacity / KV cache": (("utilization", "utilization"),
                                       ("KV cache", "kv_cache_usage")),
    "requests": (("running", "running"), ("waiting", "waiting")),
    "tokens / s": (("prompt", "prompt_tokens_per_s"), ("output", "output_tokens_per_s")),
}


def instance_series(inst: InstanceLoadPublic, t: list[float], unit: str) -> pd.DataFrame:
    """``time, series, value`` of one instance's figures in one unit (``INSTANCE_CHARTS``)."""
    frames = [pd.DataFrame({"t": t, "series": name, "value": getattr(inst.series, field)})
              for name, field in INSTANCE_CHARTS[unit]]
    return _at_times(pd.concat(frames, ignore_index=True))


def find(u: UtilizationPublic, instance_id: str) -> InstanceLoadPublic | None:
    return next((i for i in u.instances if i.id == instance_id), None)


# ---- the pool cards ----------------------------------------------------------------------


@dataclass(frozen=True)
class PoolFigures:
    """A pool over the window, as its card reads it: ``None`` where there is no value;
    ``why`` says why there is no utilization, ``basis`` what its capacity is."""

    utilization: float | None
    running: float | None
    waiting: float | None
    tokens_per_s: float | None
    kv_cache_usage: float | None
    tokens: str  # prompt | output
    basis: str
    why: str | None


def pool_figures(u: UtilizationPublic, role: Role | str) -> PoolFigures:
    role = Role(role)
    pool = u.pools.get(role)
    bases = list(dict.fromkeys(i.capacity.basis for i in u.instances if i.role is role))
    if pool is None:
        return PoolFigures(None, None, None, None, None, work_tokens(role), "",
                           "no answer for this pool")
    w = pool.window
    rate = w.prompt_tokens_per_s if role is Role.PREFILL else w.output_tokens_per_s
    why = None
    if w.utilization is None:
        why = pool.reason or ("no instance in the window" if not bases
                              else "no capacity in the window")
    return PoolFigures(w.utilization, w.running, w.waiting, rate, w.kv_cache_usage,
                       work_tokens(role), "; ".join(bases), why)


def fmt_percent(ratio: float | None) -> str:
    return "—" if ratio is None else f"{ratio:.0%}"


def fmt_count(value: float | None, fmt: str = ",.1f") -> str:
    return "—" if value is None else format(value, fmt)


def clock_words(u: UtilizationPublic) -> str:
    """Which clock the rates and capacities are in."""
    if u.clock == "modelled":
        return (f"rates in modelled time (the simulation runs at time_scale {u.time_scale:g}: "
                "wall rates x that), as the profiles are")
    return "rates in wall time"


# ---- charts ------------------------------------------------------------------------------


def _axis(q: Quantity, title: str | None = None) -> alt.Y:
    scale = alt.Scale(domainMin=0)
    return alt.Y("value:Q", title=title or q.title, scale=scale,
                 axis=alt.Axis(format=q.fmt) if q.percent else alt.Axis())


LINE_COLORS = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#eeca3b", "#b279a2",
               "#ff9da6", "#9d755d", "#bab0ac"]


def load_chart(df: pd.DataFrame, metric: str, title: str | None = None) -> alt.Chart:
    """A line per instance (coloured) and the pool's (dark, dashed, thicker) of one figure:
    one chart, not layers (a layer per kind doubled the time Altair takes on 3,000 points)."""
    q = QUANTITIES[metric]
    names = [str(x) for x in dict.fromkeys(df["series"]) if x != POOL_LINE]
    colors = [LINE_COLORS[k % len(LINE_COLORS)] for k in range(len(names))]
    pool = alt.datum.series == POOL_LINE
    return alt.Chart(df, height=LOAD_HEIGHT).mark_line(point=alt.OverlayMarkDef(size=12)).encode(
        x=TIME, y=_axis(q, title),
        color=alt.Color("series:N", title="instance", sort=[*names, POOL_LINE],
                        scale=alt.Scale(domain=[*names, POOL_LINE],
                                        range=[*colors, POOL_COLOR]),
                        legend=alt.Legend(orient="bottom")),
        strokeDash=alt.condition(pool, alt.value([6, 3]), alt.value([1, 0])),
        strokeWidth=alt.condition(pool, alt.value(2.5), alt.value(1.5)),
        tooltip=[alt.Tooltip("time:T", format="%H:%M:%S"),
                 alt.Tooltip("series:N", title="line"),
                 alt.Tooltip("value:Q", format=q.tip, title=title or q.title)])


def instance_chart(df: pd.DataFrame, unit: str) -> alt.Chart:
    """One instance's figures in one unit (``INSTANCE_CHARTS``), a line each."""
    percent = unit.startswith("percent")
    fmt, tip = (PERCENT, PERCENT_TIP) if percent else (",.1f", ",.1f")
    return alt.Chart(df, height=LOAD_HEIGHT - 40).mark_line(point=True).encode(
        x=TIME,
        y=alt.Y("value:Q", title=unit, scale=alt.Scale(domainMin=0),
                axis=alt.Axis(format=fmt) if percent else alt.Axis()),
        color=alt.Color("series:N", title=None, legend=alt.Legend(orient="bottom")),
        tooltip=[alt.Tooltip("time:T", format="%H:%M:%S"), "series:N",
                 alt.Tooltip("value:Q", format=tip)])
