"""What a replay measured: one ``ReplayRow`` per request, summaries per prompt-length class and
overall, as a table for people and as JSON.

Classes are by the trace's prompt length (``input_length``, before any cut to the context):
``<2k``, ``2k-8k``, ``8k-32k``, ``>=32k`` tokens (k = 1,024). Percentiles are
``pdctl_api.stats`` (nearest rank). A request's inter-token gap p99 is over its own streamed
gaps; a class's gap p99 is the p99 of its requests' own p99s (as the controller's request log
does). Goodput: the ok requests whose TTFT is within the TTFT target and whose own gap p99 is
within the gap target (a one-token answer has no gaps and meets the gap target). The cache hit
rate is the engines' ``usage.prompt_tokens_details.cached_tokens`` over the prompt tokens of
the requests that reported it. The send lag (how late each request left against its
schedule) says whether the client kept the trace's pace.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from pdctl_api.stats import quantiles

CLASSES: tuple[tuple[str, int, int | None], ...] = (
    ("<2k", 0, 2048), ("2k-8k", 2048, 8192), ("8k-32k", 8192, 32768), (">=32k", 32768, None))
NO_CACHE_REPORT = "n/a: the engines do not report cached tokens"


@dataclass(slots=True)
class ReplayRow:
    """One request of the run. ``ok`` False carries ``reason``; times are milliseconds."""

    index: int  # position in the run (0 = first sent)
    line: int  # the trace file's line
    trace_s: float  # the request's trace time
    due_s: float  # when it was due, from the run's start
    input_length: int  # the trace's prompt tokens
    prompt_tokens: int  # sent
    max_tokens: int  # asked
    clamped: bool
    ok: bool = False
    reason: str | None = None  # a failure's kind (alike failures alike)
    detail: str | None = None  # a failure's own message
    request_id: str | None = None
    sent_s: float | None = None  # when it was sent, from the run's start
    ttft_ms: float | None = None
    e2e_ms: float | None = None
    gap_p99_ms: float | None = None
    gap_max_ms: float | None = None
    gaps: int = 0
    output_chunks: int = 0
    completion_tokens: int | None = None  # the engine's usage
    cached_tokens: int | None = None  # the engine's usage.prompt_tokens_details


def class_of(input_length: int) -> str:
    for name, low, high in CLASSES:
        if input_length >= low and (high is None or input_length < high):
            return name
    raise ValueError(f"no class for {input_length}")


def rounded_quantiles(values: list[float], qs: tuple[float, ...]) -> list[float | None]:
    """``pdctl_api.stats.quantiles`` to the microsecond of a ms value; Nones without values."""
    got = quantiles(values, qs)
    return [None] * len(qs) if got is None else [round(v, 3) for v in got]


def met(row: ReplayRow, ttft_ms: float, gap_ms: float) -> bool:
    """The row counts toward goodput."""
    return (row.ok and row.ttft_ms is not None and row.ttft_ms <= ttft_ms
            and (row.gap_p99_ms is None or row.gap_p99_ms <= gap_ms))


def summarize(rows: list[ReplayRow], ttft_ms: float, gap_ms: float, wall_s: float | None = None
              ) -> dict[str, Any]:
    """The summary of ``rows``: counts, failures by reason, TTFT p50/p90/p99, gap p99,
    end-to-end p50/p99, goodput (count, share, and rate over ``wall_s``), cache hits."""
    ok = [r for r in rows if r.ok]
    ttft = [r.ttft_ms for r in ok if r.ttft_ms is not None]
    gaps = [r.gap_p99_ms for r in ok if r.gap_p99_ms is not None]
    e2e = [r.e2e_ms for r in ok if r.e2e_ms is not None]
    good = sum(met(r, ttft_ms, gap_ms) for r in rows)
    reported = [r for r in ok if r.cached_tokens is not None]
    prompt = sum(r.prompt_tokens for r in reported)
    lag = [max(0.0, r.sent_s - r.due_s) * 1e3 for r in rows if r.sent_s is not None]
    t50, t90, t99 = rounded_quantiles(ttft, (0.5, 0.9, 0.99))
    e50, e99 = rounded_quantiles(e2e, (0.5, 0.99))
    return {
        "requests": len(rows), "ok": len(ok), "failed": len(rows) - len(ok),
        "failed_by_reason": dict(Counter(r.reason or "unknown" for r in rows if not r.ok)
                                 .most_common()),
        "clamped": sum(r.clamped for r in rows),
        "ttft_ms": {"p50": t50, "p90": t90, "p99": t99},
        "gap_p99_ms": rounded_quantiles(gaps, (0.99,))[0],
        "e2e_ms": {"p50": e50, "p99": e99},
        "goodput": {"requests": good,
                    "share": round(good / len(rows), 4) if rows else None,
                    "per_s": round(good / wall_s, 3) if wall_s else None},
        "cache_hit_rate": (round(sum(r.cached_tokens or 0 for r in reported) / prompt, 4)
                           if prompt else None),
        "cache_reported_by": len(reported),
        "send_lag_ms": dict(zip(("p99", "max"), rounded_quantiles(lag, (0.99, 1.0)), strict=True)),
    }


def by_class(rows: list[ReplayRow], ttft_ms: float, gap_ms: float, wall_s: float | None = None
             ) -> dict[str, dict[str, Any]]:
    """``summarize`` per prompt-length class (every class, empty ones included) and ``all``."""
    out = {name: summarize([r for r in rows if class_of(r.input_length) == name], ttft_ms,
                           gap_ms, wall_s) for name, _, _ in CLASSES}
    out["all"] = summarize(rows, ttft_ms, gap_ms, wall_s)
    return out


def _fmt_ms(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f}" if v >= 100 else f"{v:.1f}"


def render(summaries: dict[str, dict[str, Any]], ttft_ms: float, gap_ms: float) -> str:
    """The summaries as a text table, then failures, goodput and the cache hit rate."""
    head = (f"{'class':<8} {'reqs':>5} {'ok':>5} {'failed':>6} {'clamped':>7} "
            f"{'TTFT p50':>9} {'p90':>8} {'p99':>8} {'gap p99':>8} {'e2e p50':>8} "
            f"{'p99':>8} {'goodput':>8}")
    lines = [head + "   (ms; classes by the trace's prompt tokens)"]
    for name, s in summaries.items():
        t, e, g = s["ttft_ms"], s["e2e_ms"], s["goodput"]
        share = "-" if g["share"] is None else f"{g['share']:.1%}"
        lines.append(f"{name:<8} {s['requests']:>5} {s['ok']:>5} {s['failed']:>6} "
                     f"{s['clamped']:>7} {_fmt_ms(t['p50']):>9} {_fmt_ms(t['p90']):>8} "
                     f"{_fmt_ms(t['p99']):>8} {_fmt_ms(s['gap_p99_ms']):>8} {_fmt_ms(e['p50']):>8} "
                     f"{_fmt_ms(e['p99']):>8} {share:>8}")
    total = summaries["all"]
    for reason, n in total["failed_by_reason"].items():
        lines.append(f"failed: {n} x {reason}")
    g = total["goodput"]
    rate = "" if g["per_s"] is None else f", {g['per_s']:.2f} req/s"
    lines.append(f"goodput (TTFT <= {ttft_ms:g} ms and own gap p99 <= {gap_ms:g} ms): "
                 f"{g['requests']} of {total['requests']}{rate}")
    lag = total["send_lag_ms"]
    if lag["max"] is not None:
        lines.append(f"sent behind the trace's schedule: p99 {_fmt_ms(lag['p99'])} ms, "
                     f"max {_fmt_ms(lag['max'])} ms")
    hit = total["cache_hit_rate"]
    lines.append("engine-reported cache hit rate: " + (
        NO_CACHE_REPORT if hit is None else
        f"{hit:.1%} of the prompt tokens ({total['cache_reported_by']} requests reported)"))
    return "\n".join(lines)


def result_json(meta: dict[str, Any], rows: list[ReplayRow], summaries: dict[str, dict[str, Any]]
                ) -> dict[str, Any]:
    """The whole result: the run's settings, the summaries, one object per request."""
    return {**meta, "classes": {n: {"min_tokens": lo, "max_tokens": hi}
                                for n, lo, hi in CLASSES},
            "summary": summaries, "requests": [asdict(r) for r in rows]}
