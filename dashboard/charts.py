"""Chart builders: each takes DataFrames shaped by ``dashboard.frames`` and returns an Altair
chart. Pure: no Streamlit, no I/O."""

from __future__ import annotations

import altair as alt
import pandas as pd

from dashboard import altair_speed
from dashboard.frames import PART_LABELS, PATHS, ROLE_NAMES
from dashboard.handoff import DECISION_SERIES
from dashboard.prefix_cache import PREDICTED, REPORTED
from dashboard.timeline import MARK_COLORS

altair_speed.install()

PART_ORDER = list(PART_LABELS.values())
PART_COLORS = ["#9e9e9e", "#4c78a8", "#e45756", "#54a24b", "#d4b9da"]
PATH_COLORS = ["#4c78a8", "#72b7b2", "#e45756"]
PART_SCALE = alt.Scale(domain=PART_ORDER, range=PART_COLORS)
PATH_SCALE = alt.Scale(domain=list(PATHS), range=PATH_COLORS)
MARK_SCALE = alt.Scale(domain=list(MARK_COLORS), range=list(MARK_COLORS.values()))
TIME = alt.X("time:T", title=None, axis=alt.Axis(format="%H:%M:%S"))
HEIGHT = 240


SUSPECT_COLOR = "#d62728"


def _suspect(flagged: object, other: object) -> object:
    """An encoding that takes ``flagged`` for suspect requests (``suspect`` column)."""
    return alt.condition("datum.suspect", alt.value(flagged), alt.value(other))


def _part_color(swatch_outline: bool = True) -> alt.Color:
    """The TTFT parts' colours; ``swatch_outline=False`` draws the legend's swatches without
    the mark's stroke."""
    legend = (alt.Legend(orient="bottom") if swatch_outline
              else alt.Legend(orient="bottom", symbolStrokeWidth=0))
    return alt.Color("part:N", scale=PART_SCALE, sort=PART_ORDER, title="TTFT part",
                     legend=legend)


def _part_order() -> alt.Order:
    # Stack in the order of the request's life: queue at the bottom.
    return alt.Order("part_rank:Q", sort="ascending")


def _ranked(long: pd.DataFrame) -> pd.DataFrame:
    return long.assign(part_rank=long["part"].map({p: i for i, p in enumerate(PART_ORDER)}))


def ttft_recent(parts: pd.DataFrame) -> alt.Chart:
    """Stacked TTFT parts of each recent request, oldest left."""
    return alt.Chart(_ranked(parts), height=HEIGHT).mark_bar().encode(
        x=alt.X("seq:O", title="recent requests (oldest left)",
                axis=alt.Axis(labels=False, ticks=False)),
        y=alt.Y("sum(ms):Q", title="TTFT (ms)", stack="zero"),
        color=_part_color(swatch_outline=False), order=_part_order(),
        # A suspect request (it read freed KV blocks) is outlined in red; nothing else is, the
        # legend's swatches included (they take the mark's constant stroke).
        stroke=_suspect(SUSPECT_COLOR, "transparent"), strokeWidth=_suspect(2.0, 0.0),
        tooltip=["id:N", "path:N", "prompt_tokens:Q", "part:N",
                 alt.Tooltip("ms:Q", format=".2f"), alt.Tooltip("ttft_ms:Q", format=".2f"),
                 alt.Tooltip("suspect:N", title="suspect (read freed KV)")],
    )


def ttft_parts_over_time(parts: pd.DataFrame) -> alt.Chart:
    """Mean TTFT parts per time bucket, stacked (means add up to the mean TTFT)."""
    return alt.Chart(_ranked(parts), height=HEIGHT).mark_area().encode(
        x=TIME, y=alt.Y("ms:Q", title="mean TTFT (ms)", stack="zero"),
        color=_part_color(), order=_part_order(),
        tooltip=[alt.Tooltip("time:T", format="%H:%M:%S"), "part:N",
                 alt.Tooltip("ms:Q", format=".2f")],
    )


def ttft_percentiles(pct: pd.DataFrame, targets: dict[str, float] | None = None,
                     title: str = "TTFT (ms)") -> alt.Chart | alt.LayerChart:
    """TTFT percentile lines; ``targets`` (label -> ms) are drawn as dashed rules."""
    lines = alt.Chart(pct, height=HEIGHT).mark_line(point=False).encode(
        x=TIME, y=alt.Y("ms:Q", title=title),
        color=alt.Color("percentile:N", sort=["p50", "p90", "p99"],
                        scale=alt.Scale(range=["#4c78a8", "#f58518", "#e45756"]),
                        legend=alt.Legend(orient="bottom")),
        tooltip=[alt.Tooltip("time:T", format="%H:%M:%S"), "percentile:N",
                 alt.Tooltip("ms:Q", format=".2f")],
    )
    if not targets:
        return lines
    rules = pd.DataFrame({"label": list(targets), "ms": list(targets.values())})
    return alt.LayerChart(layer=[lines, *_dashed_levels(rules, "ms", "#b279a2", ".0f")],
                          height=HEIGHT)


def _dashed_levels(levels: pd.DataFrame, field: str, color: str, fmt: str,
                   labelled: bool = True) -> list[alt.Chart]:
    """A dashed horizontal rule at each row's ``field`` (a target, a ceiling), its ``label``
    in the tooltip and, when ``labelled``, written at its left end."""
    rule = alt.Chart(levels).mark_rule(color=color, strokeDash=[6, 4]).encode(
        y=f"{field}:Q", tooltip=["label:N", alt.Tooltip(f"{field}:Q", format=fmt)])
    if not labelled:
        return [rule]
    text = alt.Chart(levels).mark_text(align="left", dx=4, dy=-6, color=color).encode(
        y=f"{field}:Q", text="label:N")
    return [rule, text]


def _ceiling(ceiling_gbps: float, link: str) -> pd.DataFrame:
    return pd.DataFrame({"gbps": [ceiling_gbps], "label": [f"{link} ceiling"]})


def instance_requests(requests: pd.DataFrame) -> alt.Chart:
    """Each request through one instance: its TTFT at the time it started, by path."""
    return alt.Chart(requests, height=HEIGHT - 60).mark_point(filled=True, opacity=0.7).encode(
        x=alt.X("started:T", title=None, axis=alt.Axis(format="%H:%M:%S")),
        y=alt.Y("ttft_ms:Q", title="TTFT (ms)"),
        color=alt.Color("path:N", scale=PATH_SCALE, legend=alt.Legend(orient="bottom")),
        tooltip=["id:N", "path:N", "status:N", "prompt_tokens:Q",
                 alt.Tooltip("ttft_ms:Q", format=".1f"),
                 alt.Tooltip("transfer_ms:Q", format=".1f")],
    )


def request_rate(rate: pd.DataFrame) -> alt.Chart:
    """Requests per second by path, stacked."""
    return alt.Chart(rate, height=HEIGHT).mark_area().encode(
        x=TIME, y=alt.Y("per_s:Q", title="requests / s", stack="zero"),
        color=alt.Color("path:N", scale=PATH_SCALE, legend=alt.Legend(orient="bottom")),
        tooltip=[alt.Tooltip("time:T", format="%H:%M:%S"), "path:N",
                 alt.Tooltip("per_s:Q", format=".2f")],
    )


def series_lines(long: pd.DataFrame, title: str) -> alt.Chart:
    """A line per ``series`` (``time, series, value``), its legend below."""
    return alt.Chart(long, height=HEIGHT - 40).mark_line(point=True).encode(
        x=TIME, y=alt.Y("value:Q", title=title, scale=alt.Scale(domainMin=0)),
        color=alt.Color("series:N", title=None, legend=alt.Legend(orient="bottom")),
        tooltip=[alt.Tooltip("time:T", format="%H:%M:%S"), "series:N",
                 alt.Tooltip("value:Q", format=",.1f")])


def span(chart: alt.Chart | alt.LayerChart, start: float, end: float) -> alt.LayerChart:
    """``chart`` with its time axis over the whole window ``start``..``end`` (unix s), drawn
    or not: every time chart of a page then shares one x-axis, however much data each has."""
    edges = pd.DataFrame({"time": pd.to_datetime([start, end], unit="s", utc=True)})
    frame = alt.Chart(edges).mark_point(opacity=0).encode(x=TIME)
    return alt.LayerChart(layer=[chart, frame])


def annotate(chart: alt.Chart | alt.LayerChart, marks: pd.DataFrame
             ) -> alt.Chart | alt.LayerChart:
    """``chart`` with each mark (``time, kind, label``: ``timeline.change_marks``) as a
    vertical rule coloured by its kind, the kind written at the plot's top."""
    if marks.empty:
        return chart
    color = alt.Color("kind:N", scale=MARK_SCALE, legend=None)
    rule = alt.Chart(marks).mark_rule(strokeDash=[2, 3], strokeWidth=1.5).encode(
        x=TIME, color=color, tooltip=[alt.Tooltip("time:T", format="%H:%M:%S"), "label:N"])
    # The label at the plot's top edge by value (an offset from the middle, dy, pushed it out
    # of the plot whenever the chart's height differed, and the plot shrank to make room).
    text = alt.Chart(marks).mark_text(align="left", baseline="top", dx=3, angle=0,
                                      fontSize=10).encode(
        x=TIME, y=alt.YValue(2), text="kind:N", color=color)
    # The marks' colours are their own: the chart's colour scale stays the chart's.
    return alt.LayerChart(layer=[chart, rule, text]).resolve_scale(color="independent")


def path_share_ring(share: pd.DataFrame) -> alt.Chart:
    """Disaggregated vs colocated (and failed) requests in the window."""
    total = max(1, int(share["requests"].sum()))
    data = share.assign(share=share["requests"] / total)
    return alt.Chart(data, height=HEIGHT).mark_arc(innerRadius=55).encode(
        theta=alt.Theta("requests:Q", stack=True),
        color=alt.Color("path:N", scale=PATH_SCALE, legend=alt.Legend(orient="bottom")),
        tooltip=["path:N", "requests:Q", alt.Tooltip("share:Q", format=".1%")],
    )


def kv_throughput(ts: pd.DataFrame) -> alt.Chart:
    """KV bytes moved per second of wall time, in GB/s."""
    return alt.Chart(ts, height=HEIGHT).mark_area(opacity=0.7, color="#e45756").encode(
        x=TIME, y=alt.Y("kv_gb_per_s:Q", title="KV moved (GB/s)"),
        tooltip=[alt.Tooltip("time:T", format="%H:%M:%S"),
                 alt.Tooltip("kv_gb_per_s:Q", format=".3f", title="GB/s"),
                 alt.Tooltip("kv_bytes:Q", format=".3s", title="bytes")],
    )


def achieved_bandwidth(ts: pd.DataFrame, ceiling_gbps: float, link: str) -> alt.LayerChart:
    """Bandwidth achieved while transferring (bytes / transfer time) against the link's
    ceiling."""
    busy = ts[ts["transfer_gbps"] > 0]
    line = alt.Chart(busy).mark_line(point=True, color="#4c78a8").encode(
        x=TIME, y=alt.Y("transfer_gbps:Q", title="achieved GB/s",
                        scale=alt.Scale(domainMin=0)),
        tooltip=[alt.Tooltip("time:T", format="%H:%M:%S"),
                 alt.Tooltip("transfer_gbps:Q", format=".2f", title="GB/s")],
    )
    ceiling = _dashed_levels(_ceiling(ceiling_gbps, link), "gbps", "#e45756", ".1f")
    return alt.LayerChart(layer=[line, *ceiling], height=HEIGHT)


def transfer_percentiles(df: pd.DataFrame) -> alt.Chart:
    """KV transfer p50 and p99 per bucket (``time, percentile, ms``)."""
    return alt.Chart(df, height=HEIGHT).mark_line(point=True).encode(
        x=TIME, y=alt.Y("ms:Q", title="KV transfer (ms)", scale=alt.Scale(domainMin=0)),
        color=alt.Color("percentile:N", legend=alt.Legend(orient="bottom")),
        tooltip=[alt.Tooltip("time:T", format="%H:%M:%S"), "percentile:N",
                 alt.Tooltip("ms:Q", format=".1f")])


def kv_bytes_vs_prompt(requests: pd.DataFrame, expected: pd.DataFrame) -> alt.LayerChart:
    """KV bytes of each disaggregated request against its prompt length, with the model's
    bytes-per-token line."""
    disagg = requests[(requests["path"] == "disaggregated") & (requests["kv_bytes"] > 0)]
    disagg = disagg.assign(kv_mb=disagg["kv_bytes"] / 1e6)
    points = alt.Chart(disagg).mark_point(filled=True, opacity=0.6).encode(
        x=alt.X("prompt_tokens:Q", title="prompt tokens"),
        y=alt.Y("kv_mb:Q", title="KV bytes (MB)"),
        color=alt.Color("transfer_ms:Q", title="transfer ms",
                        scale=alt.Scale(scheme="orangered")),
        # A suspect request (it read freed KV blocks) is a large red-outlined cross.
        shape=_suspect("cross", "circle"), size=_suspect(160, 40),
        stroke=_suspect(SUSPECT_COLOR, "transparent"), strokeWidth=_suspect(2.0, 0.0),
        tooltip=["id:N", "prompt_tokens:Q", alt.Tooltip("kv_mb:Q", format=".1f"),
                 alt.Tooltip("transfer_ms:Q", format=".2f"),
                 alt.Tooltip("suspect:N", title="suspect (read freed KV)")],
    )
    line = alt.Chart(expected).mark_line(color="#888", strokeDash=[4, 4]).encode(
        x="prompt_tokens:Q", y="kv_mb:Q")
    return alt.LayerChart(layer=[line, points], height=HEIGHT)


GRID_METRICS = {
    "kv_cache_usage": ("KV cache usage", alt.Scale(domain=[0, 1], scheme="blues")),
    "running": ("running requests", alt.Scale(scheme="greens", domainMin=0)),
    "waiting": ("waiting requests", alt.Scale(scheme="oranges", domainMin=0)),
}
STATE_SCALE = alt.Scale(domain=["ready", "starting", "draining", "failed", "stopped"],
                        range=["#54a24b", "#eeca3b", "#f58518", "#e45756", "#bab0ac"])


def instance_grid(instances: pd.DataFrame, metric: str = "kv_cache_usage") -> alt.FacetChart:
    """One cell per instance, a block per role: readable at a glance for hundreds."""
    if metric == "state":
        color = alt.Color("state:N", scale=STATE_SCALE, legend=alt.Legend(orient="bottom"))
    else:
        title, scale = GRID_METRICS[metric]
        color = alt.Color(f"{metric}:Q", title=title, scale=scale, legend=alt.Legend(
            orient="bottom", format=".0%" if metric == "kv_cache_usage" else alt.Undefined))
    # Gaps between the cells, not a white stroke: the page's own background shows through,
    # light or dark theme alike.
    gap = alt.Scale(paddingInner=0.12)
    base = alt.Chart(instances).mark_rect().encode(
        x=alt.X("col:O", axis=None, scale=gap), y=alt.Y("row:O", axis=None, scale=gap),
        color=color,
        tooltip=["id:N", "role:N", "state:N", "tp:Q", "running:Q", "waiting:Q", "inflight:Q",
                 alt.Tooltip("kv_cache_usage:Q", format=".1%")],
    ).properties(width=alt.Step(26), height=alt.Step(26))
    return base.facet(row=alt.Row("role:N", sort=ROLE_NAMES, title=None,
                                  header=alt.Header(labelFontSize=13, labelAngle=0,
                                                    labelAlign="left")))


def transfer_by_link(sweep: pd.DataFrame, link: str, prompt_tokens: int) -> alt.LayerChart:
    """Transfer time by prompt length for every link (log scales), the chosen one bold."""
    data = sweep.assign(chosen=sweep["link"] == link)
    lines = alt.Chart(data).mark_line(point=True).encode(
        x=alt.X("prompt_tokens:Q", title="prompt tokens", scale=alt.Scale(type="log")),
        y=alt.Y("transfer_ms:Q", title="transfer time (ms)", scale=alt.Scale(type="log")),
        color=alt.Color("link:N", legend=alt.Legend(orient="right")),
        strokeWidth=alt.condition("datum.chosen", alt.value(3.5), alt.value(1.2)),
        tooltip=["link:N", "prompt_tokens:Q", alt.Tooltip("kv_gb:Q", format=".3f"),
                 alt.Tooltip("transfer_ms:Q", format=".2f")],
    )
    marker = alt.Chart(pd.DataFrame({"prompt_tokens": [max(1, prompt_tokens)]})).mark_rule(
        color="#888", strokeDash=[4, 4]).encode(x="prompt_tokens:Q")
    return alt.LayerChart(layer=[lines, marker], height=HEIGHT + 60)


def part_lines(parts: pd.DataFrame, title: str) -> alt.Chart:
    """One line per TTFT part (e.g. each part's p99), not stacked: percentiles do not add."""
    return alt.Chart(parts, height=HEIGHT).mark_line().encode(
        x=TIME, y=alt.Y("ms:Q", title=title), color=_part_color(),
        tooltip=[alt.Tooltip("time:T", format="%H:%M:%S"), "part:N",
                 alt.Tooltip("ms:Q", format=".2f")],
    )


def bandwidth_by_source(bw: pd.DataFrame, ceiling_gbps: float, link: str) -> alt.LayerChart:
    """Achieved transfer bandwidth, as the engines' NIXL counters and the controller's
    accounting see it, against the link's ceiling."""
    lines = alt.Chart(bw).mark_line(point=True).encode(
        x=TIME, y=alt.Y("gbps:Q", title="achieved GB/s", scale=alt.Scale(domainMin=0)),
        color=alt.Color("source:N", legend=alt.Legend(orient="bottom")),
        tooltip=[alt.Tooltip("time:T", format="%H:%M:%S"), "source:N",
                 alt.Tooltip("gbps:Q", format=".2f", title="GB/s")],
    )
    ceiling = _dashed_levels(_ceiling(ceiling_gbps, link), "gbps", "#e45756", ".1f",
                             labelled=False)
    return alt.LayerChart(layer=[lines, *ceiling], height=HEIGHT)


HIT_SERIES = [REPORTED, PREDICTED]
HIT_COLORS = alt.Scale(domain=HIT_SERIES, range=["#4c78a8", "#f58518"])


def hit_rates(long: pd.DataFrame) -> alt.Chart:
    """Prefix-cache hit rate per bucket (``time, series, value``: ``prefix_cache.
    hit_rate_series``), as the engines report it and as the router predicted it (dashed)."""
    return alt.Chart(long, height=HEIGHT - 40).mark_line(point=True).encode(
        x=TIME, y=alt.Y("value:Q", title="prefix cache hit rate",
                        scale=alt.Scale(domain=[0, 1]), axis=alt.Axis(format="%")),
        color=alt.Color("series:N", title=None, scale=HIT_COLORS,
                        legend=alt.Legend(orient="bottom")),
        strokeDash=alt.StrokeDash("series:N", legend=None, scale=alt.Scale(
            domain=HIT_SERIES, range=[[1, 0], [6, 3]])),
        tooltip=[alt.Tooltip("time:T", format="%H:%M:%S"), "series:N",
                 alt.Tooltip("value:Q", format=".1%")])


DECISION_COLORS = alt.Scale(domain=list(DECISION_SERIES), range=["#4c78a8", "#72b7b2"])


def decision_mix(long: pd.DataFrame) -> alt.Chart:
    """Hand-off decisions per bucket (``time, decision, requests``: ``handoff.
    decision_series``), stacked: decided disaggregated under decided local."""
    return alt.Chart(long, height=HEIGHT - 40).mark_area(interpolate="step-after").encode(
        x=TIME, y=alt.Y("requests:Q", title="requests decided", stack="zero"),
        color=alt.Color("decision:N", title=None, scale=DECISION_COLORS,
                        legend=alt.Legend(orient="bottom")),
        tooltip=[alt.Tooltip("time:T", format="%H:%M:%S"), "decision:N",
                 alt.Tooltip("requests:Q", format=",d")])
