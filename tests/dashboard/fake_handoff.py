"""The hand-off on the fake controller: request records with their decision and why, silent
KV fallbacks, a prefill pool that served nothing, and ``/stats`` ``handoff`` as the
controller's own ``handoff_report`` shapes it (the fallbacks per pair taken from the records
the fake flags, where the controller's watch finds them in the engines' counters)."""

from __future__ import annotations

from typing import Any

from controller.models import RequestPath, RequestRecord
from controller.obs.handoff_report import handoff_report
from controller.router.handoff import NO_PREFILL, by_threshold

REQUEST_FIELDS = ("decision", "decision_reason", "kv_fallback")
BUCKET_FIELDS = ("decided_disaggregated", "decided_local")


def with_handoff(records: list[RequestRecord], fallbacks: int = 0, min_tokens: int = 512
                 ) -> list[RequestRecord]:
    """The records with the ``threshold`` decision each took (its path), the newest
    ``fallbacks`` disaggregated ones flagged as silent KV fallbacks."""
    for r in records:
        d = by_threshold(r.prompt_tokens, min_tokens, True)
        r.decision, r.decision_reason = d.name, d.reason
    disagg = [r for r in records if r.path is RequestPath.DISAGGREGATED]
    for r in disagg[len(disagg) - fallbacks:] if fallbacks else []:
        r.kv_fallback = True
    return records


def idle_prefill(records: list[RequestRecord], min_tokens: int = 512) -> list[RequestRecord]:
    """The records as a fleet whose prefill pool served none: every prompt that should have
    gone disaggregated found no ready prefill instance and was served on its decode
    instance."""
    for r in with_handoff(records, 0, min_tokens):
        if r.prompt_tokens >= min_tokens:
            r.decision, r.decision_reason = "local", NO_PREFILL
            r.path, r.prefill_instance, r.kv_handle = RequestPath.COLOCATED, None, None
            r.kv_bytes, r.transfer_ms = 0, 0.0
    return records


def fallback_summary(records: list[RequestRecord]) -> dict[str, Any]:
    """What ``KvFallbackWatch.summary`` reports, from the flagged records."""
    pairs: dict[tuple[str, str], int] = {}
    for r in records:
        if r.kv_fallback:
            key = (r.prefill_instance or "", r.decode_instance or "")
            pairs[key] = pairs.get(key, 0) + 1
    return {"fallback_requests": sum(pairs.values()),
            "fallback_pairs": [{"prefill": p, "decode": d, "requests": n}
                               for (p, d), n in sorted(pairs.items())]}


def handoff_view(records: list[RequestRecord], policy: str, prefill_wanted: int,
                 window_s: float) -> dict[str, Any]:
    """``/stats`` ``handoff`` over the window's records."""
    return handoff_report(records, policy, prefill_wanted, fallback_summary(records), window_s)


def strip_legacy(requests: list[dict[str, Any]], buckets: list[dict[str, Any]]) -> None:
    """An older controller: no decision on the records, none counted per bucket."""
    for r in requests:
        for f in REQUEST_FIELDS:
            r.pop(f, None)
    for b in buckets:
        for f in BUCKET_FIELDS:
            b.pop(f, None)
