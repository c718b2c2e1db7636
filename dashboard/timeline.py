"""What happened to the cluster, as the time charts mark it and the Overview's incidents strip
tells it: changes to the configuration, and each instance's failure, drain and (re)start, from
the audit log. Pure functions: tests assert the marks and incidents from tables.

A mark's ``kind`` is one of ``MARK_COLORS``: ``change`` (pools, routing, targets, planner),
``failed``, ``drain``, ``start`` (an instance started: a scale-up, or the replacement of one
that failed or drained, which its label names)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

import pandas as pd

from dashboard.frames import PART_LABELS, PARTS, change_in_words
from dashboard.ui.figures import clock, fmt_ms
from pdctl_api.schema import EventPublic, StatsPublic

CONFIG_KINDS = ("pool.update", "routing.update", "targets.update", "planner.update")
MARK_KINDS = {**dict.fromkeys(CONFIG_KINDS, "change"), "instance.failed": "failed",
              "instance.restarted": "failed",
              "instance.draining": "drain", "instance.starting": "start"}
MARK_COLORS = {"change": "#54a24b", "failed": "#e45756", "drain": "#f58518",
               "start": "#4c78a8"}
MarkKind = Literal["change", "failed", "drain", "start"]


def pool_of(instance_id: str) -> str:
    """``decode-3`` -> ``decode`` (the controller names instances after their pool)."""
    return instance_id.rsplit("-", 1)[0]


def _replacements(events: list[EventPublic]) -> dict[int, str]:
    """Event id of each ``instance.starting`` -> the instance it replaces: the oldest failure
    or drain of the same pool not yet replaced (events oldest first)."""
    gone: dict[str, list[str]] = {}
    out: dict[int, str] = {}
    for e in events:
        if e.kind in ("instance.failed", "instance.draining"):
            gone.setdefault(pool_of(e.target), []).append(e.target)
        elif e.kind == "instance.starting" and gone.get(pool_of(e.target)):
            out[e.id] = gone[pool_of(e.target)].pop(0)
    return out


def _label(e: EventPublic, replaces: str | None) -> str:
    if e.kind == "instance.failed":
        return f"{e.target} failed: {e.detail or 'no reason recorded'}"
    if e.kind == "instance.restarted":
        return f"{e.target} restarted in place: {e.detail or ''}".rstrip(": ")
    if e.kind == "instance.draining":
        return f"{e.target} draining by {e.actor}: {e.detail or ''}".rstrip(": ")
    if e.kind == "instance.starting":
        why = f" (replaces {replaces})" if replaces else f" ({e.detail})" if e.detail else ""
        return f"{e.target} starting{why}"
    return f"{e.kind} {e.target} by {e.actor}: {change_in_words(e.before, e.after)}"


def change_marks(events: Iterable[EventPublic], since: float, until: float = math.inf
                 ) -> pd.DataFrame:
    """The marks in ``[since, until]`` (unix s) for the time charts: ``time, kind, label``,
    oldest first (the audit log reads newest first)."""
    ordered = sorted(events, key=lambda e: (e.ts, e.id))
    replaced = _replacements(ordered)
    rows = [(e.ts, MARK_KINDS[e.kind], _label(e, replaced.get(e.id))) for e in ordered
            if e.kind in MARK_KINDS and since <= e.ts <= until]
    df = pd.DataFrame(rows, columns=["ts", "kind", "label"])
    df["time"] = pd.to_datetime(pd.Series(df["ts"], dtype="float64"), unit="s", utc=True)
    return df[["time", "kind", "label"]].reset_index(drop=True)


def config_changes(marks: pd.DataFrame) -> pd.DataFrame:
    """The configuration changes among ``marks`` (what the before/after table compares)."""
    return marks[marks["kind"] == "change"].reset_index(drop=True)


# ---- the incidents strip --------------------------------------------------------------------

Severity = Literal["error", "warning"]


@dataclass(frozen=True)
class Incident:
    """One line of the Overview's incidents strip: what, about what, since when."""

    at: float  # unix s: when it happened or began
    severity: Severity
    subject: str  # an instance, a pool, an alert's name, a TTFT part
    text: str  # in words, with the figures


def instance_incidents(events: Iterable[EventPublic], since: float, until: float = math.inf
                       ) -> list[Incident]:
    """Every failure and restart in place in the window, with its reason and, once it is ready,
    its replacement (failures); pools quarantined. Newest first. A failure stays for the whole
    window, replaced or not."""
    ordered = sorted(events, key=lambda e: (e.ts, e.id))
    replaced = _replacements(ordered)
    by_replacement = {v: k for k, v in replaced.items()}  # failed id -> starting event id
    starting = {e.id: e.target for e in ordered if e.kind == "instance.starting"}
    ready_at = {e.target: e.ts for e in ordered if e.kind == "instance.ready"}
    out = []
    for e in ordered:
        if not since <= e.ts <= until:
            continue
        if e.kind == "instance.failed":
            new = starting.get(by_replacement.get(e.target, -1))
            after = ("; no replacement yet" if new is None else
                     f"; replaced by {new}, ready at {clock(ready_at[new])}" if new in ready_at
                     else f"; replacement {new} starting")
            out.append(Incident(e.ts, "error", e.target, f"**{e.target} failed** at "
                                f"{clock(e.ts)}: {e.detail or 'no reason recorded'}{after}"))
        elif e.kind == "instance.restarted":
            out.append(Incident(e.ts, "warning", e.target, f"**{e.target} restarted in "
                                f"place** at {clock(e.ts)}: {e.detail or ''}"))
        elif e.kind == "pool.quarantined":
            out.append(Incident(e.ts, "error", f"{e.target} pool",
                                f"**{e.target} pool quarantined** at {clock(e.ts)}: "
                                f"{e.detail or ''}"))
    return sorted(out, key=lambda i: -i.at)


def alert_incidents(alerts: Iterable[dict[str, Any]]) -> list[Incident]:
    """Prometheus's firing alerts (``/api/v1/alerts`` rows: ``labels``, ``activeAt`` unix s,
    ``value``), each with its value and since when."""
    out = []
    for a in alerts:
        labels = a.get("labels") or {}
        name = str(labels.get("alertname", "?"))
        at = float(a.get("activeAt") or 0.0)
        value = _number(a.get("value"))
        shown = "" if value is None else f" (value {value:.4g})"
        sev: Severity = "warning" if labels.get("severity") in ("warning", "info") else "error"
        out.append(Incident(at, sev, name, f"**Prometheus alert {name}** firing since "
                            f"{clock(at)}{shown}, severity {labels.get('severity', '?')}"))
    return out


def _number(value: Any) -> float | None:
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


@dataclass(frozen=True)
class PartGrowth:
    part: str  # a PARTS name
    before_ms: float
    now_ms: float

    @property
    def grew_ms(self) -> float:
        return self.now_ms - self.before_ms


GREW_SHARE = 0.1  # a part "grew" when its mean rose by a tenth of the previous mean TTFT
GREW_MIN_MS = 1.0  # ... and by a millisecond at least


def grew_most(now: StatsPublic, before: StatsPublic) -> PartGrowth | None:
    """The TTFT part whose mean grew most against the previous window of the same length;
    None when either window has no request or no part grew by ``GREW_SHARE`` of the previous
    mean TTFT (and ``GREW_MIN_MS``): noise is not an incident."""
    if now.requests == 0 or before.requests == 0:
        return None
    growth = [PartGrowth(p, before.components_ms.part(p).mean, now.components_ms.part(p).mean)
              for p in PARTS]
    top = max(growth, key=lambda g: g.grew_ms)
    enough = max(GREW_MIN_MS, GREW_SHARE * before.ttft_ms.mean)
    return top if top.grew_ms >= enough else None


def growth_incident(g: PartGrowth, window_s: float, at: float) -> Incident:
    """A grown part in words (the strip's clue to where TTFT went, not an alarm)."""
    return Incident(at, "warning", PART_LABELS[g.part],
                    f"**{PART_LABELS[g.part]} grew most**: mean {fmt_ms(g.now_ms)} against "
                    f"{fmt_ms(g.before_ms)} in the previous {window_s:g} s "
                    f"(+{fmt_ms(g.grew_ms)})")
