"""The prefix cache as the console shows it, from ``/api/v1/cache`` (``CachePublic``): the
cards, the state of each instance's block index in words, the hit-rate series of the chart,
and what the Overview says at a glance (a cache_aware pool routed by load because its index
is stale, predictions far from what the engines report). Pure: decisions as data, asserted
by the tests from tables; no Streamlit.

Rates are shares of prompt tokens: ``hit_rate`` as the engines report their cached tokens,
``predicted_hit_rate`` as the router expected them from the KV events, ``drift`` (predicted -
reported) / prompt tokens over the requests that have both (positive: the router expects
hits the engines do not give)."""

from __future__ import annotations

import pandas as pd

from dashboard.cards import Card
from dashboard.frames import ROLE_NAMES
from dashboard.timeline import Incident
from dashboard.ui.figures import fmt_bytes, fmt_share
from pdctl_api.schema import CachePublic, KvIndexPublic

NO_CACHE_DATA = ("No prefix-cache figures {within}: no request carries a prediction (no pool "
                 "routes `cache_aware`) or a report (the engines report no cached tokens).")
NO_CACHE_ROUTE = ("This controller does not answer `/api/v1/cache` (older than it): no "
                  "prefix-cache figures.")
REPORTED, PREDICTED = "reported (engines)", "predicted (router)"
CACHE_SUBJECT = "prefix cache"


def has_cache_data(c: CachePublic) -> bool:
    """Whether any request of the window carries a prediction or a report."""
    return c.requests > 0 and (c.predicted_tokens is not None or c.reported_tokens is not None)


def fmt_drift(x: float | None) -> str:
    """Signed, in points of prompt tokens: ``+3.0%`` the router expects more hits."""
    return "n/a" if x is None else f"{x:+.1%}"


def cache_cards(c: CachePublic) -> tuple[Card, ...]:
    """Hit rate (reported, predicted beside it), tokens saved, decode KV bytes saved (and
    moved), drift."""
    reported = "not reported" if c.hit_rate is None else fmt_share(c.hit_rate)
    predicted = ("no prediction" if c.predicted_hit_rate is None
                 else f"predicted {fmt_share(c.predicted_hit_rate)}")
    moved, saved = c.decode_kv_bytes_moved, c.decode_kv_bytes_saved
    shared = (saved or 0) + (moved or 0)
    saved_share = f" ({(saved or 0) / shared:.0%} of the prompts' KV)" if shared else ""
    source = "reported" if c.reported_tokens is not None else "predicted"
    return (
        Card("Prefix cache hit rate", reported, predicted,
                  f"prompt tokens the engines served from their prefix caches over the "
                  f"{c.prompt_tokens:,} prompt tokens of {c.requests:,} requests; predicted: "
                  "what the router expected from the engines' KV events"),
        Card("Prompt tokens saved", f"{c.tokens_saved:,}", source,
                  "prompt tokens not computed again because an engine held their prefix "
                  "(as the engines report them; the router's prediction where they report "
                  "none)"),
        Card("Decode KV saved", fmt_bytes(c.decode_kv_bytes_saved),
                  f"moved {fmt_bytes(moved)}",
                  "KV bytes decode instances did not pull over NIXL because they held those "
                  f"blocks already (predicted from the KV index){saved_share}; moved: the "
                  "KV pulled, modelled from the uncached prompt blocks"),
        Card("Prediction drift", fmt_drift(c.drift), drift_words(c.drift),
                  "(predicted - reported cached tokens) / prompt tokens, over the requests "
                  "with both: 0 the block index agrees with the engines; positive the router "
                  "expects hits the engines do not give"),
    )


def drift_words(drift: float | None) -> str:
    if drift is None:
        return "needs both numbers"
    if abs(drift) < 0.005:
        return "index agrees"
    return "router expects more" if drift > 0 else "router expects fewer"


def index_state(k: KvIndexPublic) -> str:
    """An instance's block index in words: ``healthy``, ``stale: why``, or no events."""
    if not k.watched:
        return "no events: publishes none (routed by load)"
    if k.healthy:
        return "healthy"
    if k.stale_reason in (None, "no events yet"):
        return "no events yet (routed by load)"
    return f"stale: {k.stale_reason} (routed by load)"


CACHE_TABLE = ("instance", "role", "index", "requests", "hit_rate", "predicted_hit_rate",
               "drift", "blocks", "events_per_s")


def cache_instances(c: CachePublic) -> pd.DataFrame:
    """A row per instance: its hit rates and drift, and its block index in words; the
    instances whose index is not healthy first, then by pool (prefill first) and id."""
    rows = [(i.instance, i.role.value, index_state(i.kv_index), i.requests, i.hit_rate,
             i.predicted_hit_rate, i.drift, i.kv_index.blocks, i.kv_index.events_per_s,
             i.kv_index.healthy, ROLE_NAMES.index(i.role.value)) for i in c.instances]
    df = pd.DataFrame(rows, columns=[*CACHE_TABLE, "healthy", "pool"])
    df = df.astype({"hit_rate": "float64", "predicted_hit_rate": "float64",
                    "drift": "float64"})
    return (df.sort_values(["healthy", "pool", "instance"], kind="stable")
            [list(CACHE_TABLE)].reset_index(drop=True))


def hit_rate_series(c: CachePublic) -> pd.DataFrame:
    """The chart's ``time, series, value``: reported and predicted hit rate per bucket
    (buckets without a figure left out)."""
    rows = [(b.t, name, value) for b in c.buckets
            for name, value in ((REPORTED, b.hit_rate), (PREDICTED, b.predicted_hit_rate))
            if value is not None]
    df = pd.DataFrame(rows, columns=["t", "series", "value"])
    df["time"] = pd.to_datetime(pd.Series(df["t"], dtype="float64"), unit="s", utc=True)
    return df[["time", "series", "value"]]


def policies_words(c: CachePublic) -> str:
    return f"routing: prefill `{c.prefill_policy}`, decode `{c.decode_policy}`"


# ---- at a glance: the Overview's health banner and incidents strip ---------------------------

def cache_health_lines(c: CachePublic | None) -> list[str]:
    """A short line per warning of the answer for the health banner (it turns amber): the
    warning's first clause (up to its first ``: ``), the strip below has it whole."""
    if c is None:
        return []
    return [f"{CACHE_SUBJECT}: {w.split(': ', 1)[0]} (see Incidents)" for w in c.warnings]


def cache_incidents(c: CachePublic | None) -> list[Incident]:
    """Each warning of the answer as an incident of the strip, in full, at the window's end
    (the index's state is as of now; the drift is the window's)."""
    if c is None:
        return []
    return [Incident(c.end, "warning", CACHE_SUBJECT, f"**Prefix cache**: {w}")
            for w in c.warnings]


def cache_headline(c: CachePublic | None) -> str | None:
    """One line for the Overview: the window's hit rate, predicted, tokens saved, drift; None
    without figures."""
    if c is None or not has_cache_data(c):
        return None
    return (f"Prefix cache: hit rate {fmt_share(c.hit_rate)} reported, "
            f"{fmt_share(c.predicted_hit_rate)} predicted · {c.tokens_saved:,} prompt tokens "
            f"saved · decode KV saved {fmt_bytes(c.decode_kv_bytes_saved)} · drift "
            f"{fmt_drift(c.drift)} (Pools has each instance)")
