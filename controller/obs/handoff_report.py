"""The window's hand-off, as ``/stats`` reports it: the decisions' mix, the silent fallbacks
the watch found (``controller.obs.kv_fallback``), and a prefill pool that served nothing
while disaggregation was on. Pure: records and the watch's summary in, a dict out."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from controller.models import RequestPath, RequestRecord
from controller.router.handoff import NO_PREFILL

IDLE_MIN = 5  # requests that should have used the prefill pool before its silence alarms


def handoff_report(records: Iterable[RequestRecord], policy: str, prefill_wanted: int,
                   fallback: dict[str, Any], window_s: float) -> dict[str, Any]:
    decided = {"disaggregated": 0, "local": 0}
    served = no_prefill = 0
    for r in records:
        if r.decision in decided:
            decided[r.decision] += 1
        served += r.path is RequestPath.DISAGGREGATED
        no_prefill += r.decision_reason == NO_PREFILL
    should = decided["disaggregated"] + no_prefill
    idle = prefill_wanted > 0 and should >= IDLE_MIN and served == 0
    alerts: list[str] = []
    if idle:
        alerts.append(f"the prefill pool served none of the {should} requests of the last "
                      f"{window_s:g} s that should have gone through it"
                      + (f" ({no_prefill} found no ready prefill instance)" if no_prefill
                         else ""))
    for pair in fallback.get("fallback_pairs", []):
        alerts.append(f"{pair['requests']} requests routed {pair['prefill']} -> "
                      f"{pair['decode']} were computed on {pair['decode']}: the KV never "
                      "arrived (silent fallback)")
    return {"policy": policy, "decided_disaggregated": decided["disaggregated"],
            "decided_local": decided["local"], "served_disaggregated": served,
            "no_prefill": no_prefill, **fallback, "prefill_idle": idle, "alerts": alerts}
