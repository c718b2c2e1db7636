"""Where a request's time-to-first-token went: a pure function over the router's own
timestamps and the engines' per-request metrics.

Parts (milliseconds), always summing exactly to ``ttft_ms``:

- ``queue_ms``: the engine's wait before it scheduled the request -- the prefill engine's
  ``queue_time_ms`` on the disaggregated path, the decode engine's on the colocated path.
- ``prefill_ms``: scheduled -> first token on the engine that computed the prompt
  (``time_to_first_token_ms``).
- ``transfer_ms``: the KV pull on the decode engine. Taken from the engine when it reports it
  (the simulator's ``kv_transfer_ms``); otherwise the modelled transfer time of the prompt's
  KV bytes over the configured link, capped by the decode engine's queue time (vLLM counts the
  wait for remote KV inside ``queue_time_ms``).
- ``decode_sched_ms``: the decode engine's queue time minus the transfer, plus its own
  scheduled -> first token time.
- ``overhead_ms``: the rest: the router's own work, HTTP hops, retries, and the time between
  the prefill answer and the decode hop.

When an engine sends no metrics, the hop's wall time seen by the router stands in for its
engine-side part. Should the engine-reported parts exceed the router-measured TTFT (clock
granularity), they are scaled down together so the sum still holds and overhead is 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EngineTimes:
    """An engine's per-request ``metrics`` (vLLM ``--enable-per-request-metrics``)."""

    queue_ms: float
    ttft_ms: float
    itl_ms: float
    kv_transfer_ms: float | None

    @classmethod
    def parse(cls, metrics: Any) -> EngineTimes | None:
        if not isinstance(metrics, dict):
            return None
        try:
            kv = metrics.get("kv_transfer_ms")
            return cls(
                queue_ms=float(metrics.get("queue_time_ms") or 0.0),
                ttft_ms=float(metrics.get("time_to_first_token_ms") or 0.0),
                itl_ms=float(metrics.get("mean_itl_ms") or 0.0),
                kv_transfer_ms=None if kv is None else float(kv),
            )
        except (TypeError, ValueError):
            return None


@dataclass(frozen=True)
class Breakdown:
    queue_ms: float
    prefill_ms: float
    transfer_ms: float
    decode_sched_ms: float
    overhead_ms: float
    ttft_ms: float

    def parts(self) -> dict[str, float]:
        return {"queue": self.queue_ms, "prefill": self.prefill_ms,
                "transfer": self.transfer_ms, "decode_sched": self.decode_sched_ms,
                "overhead": self.overhead_ms}


@dataclass(frozen=True)
class Observation:
    """What the router saw of one request."""

    ttft_ms: float
    disaggregated: bool
    prefill: EngineTimes | None = None
    prefill_wall_ms: float = 0.0
    decode: EngineTimes | None = None
    decode_wall_to_first_ms: float = 0.0
    transfer_model_ms: float = 0.0


def _disaggregated(o: Observation) -> tuple[float, float, float, float]:
    p, d = o.prefill, o.decode
    queue = p.queue_ms if p else 0.0
    prefill = p.ttft_ms if p else o.prefill_wall_ms
    if d is not None and d.kv_transfer_ms is not None:
        transfer = d.kv_transfer_ms
    elif d is not None:
        transfer = min(o.transfer_model_ms, d.queue_ms)
    else:
        transfer = min(o.transfer_model_ms, o.decode_wall_to_first_ms)
    if d is not None:
        sched = max(0.0, d.queue_ms - transfer) + d.ttft_ms
    else:
        sched = max(0.0, o.decode_wall_to_first_ms - transfer)
    return queue, prefill, transfer, sched


def _colocated(o: Observation) -> tuple[float, float, float, float]:
    d = o.decode
    if d is None:
        return 0.0, o.decode_wall_to_first_ms, 0.0, 0.0
    return d.queue_ms, d.ttft_ms, 0.0, 0.0


def breakdown(o: Observation) -> Breakdown:
    parts = [max(0.0, x) for x in (_disaggregated(o) if o.disaggregated else _colocated(o))]
    ttft = max(0.0, o.ttft_ms)
    total = sum(parts)
    if total > ttft and total > 0:
        parts = [x * ttft / total for x in parts]
    parts = [round(x, 3) for x in parts]
    ttft = round(ttft, 3)
    excess = sum(parts) - ttft
    if excess > 0:  # rounding pushed the scaled parts past the TTFT: trim the largest
        k = parts.index(max(parts))
        parts[k] = round(max(0.0, parts[k] - excess), 3)
    overhead = max(0.0, ttft - sum(parts))
    q, pf, tr, sc = parts
    # Recompute ttft from the rounded parts so that the invariant holds exactly.
    return Breakdown(q, pf, tr, sc, overhead, q + pf + tr + sc + overhead)
