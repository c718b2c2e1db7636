"""The hand-off decision as the console shows it, from ``/api/v1/stats`` ``handoff``
(``HandoffPublic``), the ``/timeseries`` buckets' ``decided_*`` and the request records'
``decision``, ``decision_reason`` and ``kv_fallback``: the cards, the decision mix over time,
the silent fallbacks per pair, the latest decisions with their reasons, and what the Overview
says at a glance (a silent KV fallback, an idle prefill pool). Pure: decisions as data,
asserted by the tests from tables; no Streamlit.

A *silent fallback*: a request routed disaggregated whose decode engine computed the prompt
itself, the KV never arrived (its answer is right, its TTFT paid the prompt twice). An *idle
prefill pool*: disaggregation on, but the prefill pool served none of the window's requests
that should have gone through it."""

from __future__ import annotations

import pandas as pd

from dashboard.cards import Card
from dashboard.frames import FALLBACK_FLAG
from dashboard.timeline import Incident
from pdctl_api.schema import HandoffPublic, StatsPublic, TimeseriesPublic

HANDOFF_SUBJECT = "hand-off"
DECIDED_DISAGG, DECIDED_LOCAL = "decided disaggregated", "decided local"
DECISION_SERIES = (DECIDED_DISAGG, DECIDED_LOCAL)
NO_HANDOFF = ("This controller does not report its hand-off decisions (older than them): no "
              "decision mix, no silent-fallback watch.")
NO_DECISIONS = "No hand-off decisions {within}: no request was routed."
POLICY_WORDS = {
    "threshold": "disaggregated when the prompt has at least `disagg_min_prompt_tokens` tokens",
    "slo": "disaggregated when that is faster for the request's uncached tokens, the queues "
           "and the KV transfer (protecting the gap target)",
}


def handoff_of(stats: StatsPublic) -> HandoffPublic | None:
    """The window's hand-off report; None from an older controller."""
    return getattr(stats, "handoff", None)


def decided(h: HandoffPublic) -> int:
    return h.decided_disaggregated + h.decided_local


def share(part: int, whole: int) -> str:
    return f"{part / whole:.0%}" if whole else "n/a"


def policy_words(h: HandoffPublic) -> str:
    """``policy `slo`: disaggregated when ...`` (Controls changes it)."""
    return f"policy `{h.policy}`: {POLICY_WORDS.get(h.policy, 'the controller’s own rule')}"


def handoff_cards(h: HandoffPublic) -> tuple[Card, ...]:
    """Decided disaggregated and local (shares of the decided), served disaggregated, found
    no prefill instance, silent fallbacks."""
    n = decided(h)
    return (
        Card("Decided disaggregated", f"{h.decided_disaggregated:,}",
                    f"{share(h.decided_disaggregated, n)} of {n:,} decided",
                    "requests the hand-off decision sent through a prefill instance"),
        Card("Decided local", f"{h.decided_local:,}",
                    f"{share(h.decided_local, n)} of {n:,} decided",
                    "requests the decision kept on their decode instance (colocated)"),
        Card("Served disaggregated", f"{h.served_disaggregated:,}",
                    f"{share(h.served_disaggregated, h.decided_disaggregated)} of decided"
                    if h.decided_disaggregated else "none decided",
                    "requests that went through a prefill instance (a failed prefill hop is "
                    "served colocated although decided disaggregated)"),
        Card("No prefill instance", f"{h.no_prefill:,}",
                    "would have gone disaggregated" if h.no_prefill else None,
                    "requests that would have gone disaggregated but found no ready prefill "
                    "instance, served colocated"),
        Card("Silent KV fallbacks", f"{h.fallback_requests:,}",
                    f"{len(h.fallback_pairs)} pair{'s' if len(h.fallback_pairs) != 1 else ''}"
                    if h.fallback_requests else "none",
                    "requests routed disaggregated whose decode engine computed the prompt "
                    "itself: the KV never arrived (their TTFT paid the prompt twice)"),
    )


FALLBACK_TABLE = ("prefill", "decode", "requests")


def fallback_pairs(h: HandoffPublic) -> pd.DataFrame:
    """A row per prefill -> decode pair with silent fallbacks in the window, most first."""
    df = pd.DataFrame([(p.prefill, p.decode, p.requests) for p in h.fallback_pairs],
                      columns=list(FALLBACK_TABLE))
    return df.sort_values("requests", ascending=False, kind="stable").reset_index(drop=True)


def decision_series(ts: TimeseriesPublic) -> pd.DataFrame:
    """The stacked chart's ``time, decision, requests``: decided disaggregated and local per
    bucket (0 from an older controller, whose buckets have no ``decided_*``)."""
    rows = [(b.t, name, int(getattr(b, key, 0) or 0)) for b in ts.buckets
            for name, key in ((DECIDED_DISAGG, "decided_disaggregated"),
                              (DECIDED_LOCAL, "decided_local"))]
    df = pd.DataFrame(rows, columns=["t", "decision", "requests"])
    df["time"] = pd.to_datetime(pd.Series(df["t"], dtype="float64"), unit="s", utc=True)
    return df[["time", "decision", "requests"]]


def has_decisions(ts: TimeseriesPublic) -> bool:
    return any(getattr(b, "decided_disaggregated", 0) or getattr(b, "decided_local", 0)
               for b in ts.buckets)


DECISION_TABLE = ("fallback", "id", "decision", "decision_reason", "path", "prompt_tokens",
                  "ttft_ms", "prefill_instance", "decode_instance")


def latest_decisions(requests: pd.DataFrame, limit: int = 10) -> pd.DataFrame:
    """The newest ``limit`` requests (a ``frames.requests_frame``) with a decision, newest
    first: the decision, its reason, the path it took, a silent fallback flagged."""
    if "decision" not in requests:
        return pd.DataFrame(columns=list(DECISION_TABLE))
    df = requests[requests["decision"] != ""].iloc[::-1].head(limit)
    out = df.assign(fallback=df["kv_fallback"].map(lambda v: FALLBACK_FLAG if v else ""))
    return out[list(DECISION_TABLE)].reset_index(drop=True)


# ---- at a glance: the Overview's health banner and incidents strip ---------------------------

def handoff_health_lines(stats: StatsPublic) -> list[str]:
    """A short line per alert of the window's hand-off for the health banner (it turns amber):
    the alert's first clause, the strip below has it whole."""
    h = handoff_of(stats)
    if h is None:
        return []
    return [f"{HANDOFF_SUBJECT}: {a.split(': ', 1)[0]} (see Incidents)" for a in alerts_of(h)]


def alerts_of(h: HandoffPublic) -> list[str]:
    """The report's alerts; one of our own where it flags a fallback or an idle pool without
    a sentence (a controller that sends the flags only)."""
    if h.alerts:
        return list(h.alerts)
    out = []
    if h.prefill_idle:
        out.append("the prefill pool served none of the window's requests that should have "
                   "gone through it")
    if h.fallback_requests:
        out.append(f"{h.fallback_requests} requests routed disaggregated were computed on "
                   "their decode instance: the KV never arrived (silent fallback)")
    return out


def handoff_incidents(stats: StatsPublic, at: float) -> list[Incident]:
    """Each alert of the window's hand-off as an incident of the strip, in full, at ``at`` (the
    window's end: the report is the window's)."""
    h = handoff_of(stats)
    if h is None:
        return []
    return [Incident(at, "warning", HANDOFF_SUBJECT, f"**Hand-off**: {a}") for a in alerts_of(h)]


def handoff_headline(stats: StatsPublic) -> str | None:
    """One line for the Overview: the policy and the decision mix; None without decisions or
    from an older controller."""
    h = handoff_of(stats)
    if h is None or not decided(h):
        return None
    n = decided(h)
    fallbacks = (f" · {h.fallback_requests:,} silent KV fallbacks" if h.fallback_requests
                 else "")
    return (f"Hand-off (`{h.policy}`): {share(h.decided_disaggregated, n)} decided "
            f"disaggregated, {share(h.decided_local, n)} local of {n:,} · "
            f"{h.served_disaggregated:,} served disaggregated{fallbacks} (Transfer has the "
            "decisions)")
