"""Where a request's time-to-first-token went, and the request's record: pure functions over
the router's own timestamps and the engines' per-request metrics (``account``).

Parts (milliseconds), always summing exactly to ``ttft_ms``:

- ``queue_ms``: the wait before an engine scheduled the request -- the prefill engine's
  ``queue_time_ms`` on the disaggregated path, the decode engine's on the colocated path --
  plus the wait in the router's prefill queue (``routing.prefill_max_inflight``).
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

from controller.models import RequestPath, RequestRecord
from pdctl_api import profiles
from pdctl_api.stats import quantiles


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
    router_queue_ms: float = 0.0


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
    parts[0] += max(0.0, o.router_queue_ms)
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


@dataclass(frozen=True)
class KvCosts:
    """What turns a prompt into KV bytes and a modelled transfer time."""

    model: profiles.ModelProfile | None  # None: the architecture is unknown (KV bytes 0)
    block_size: int
    link: profiles.LinkProfile


@dataclass(slots=True)  # one per request: not frozen, whose __init__ costs twice as much
class Measured:
    """Everything the router measured of one finished request. Times are ``perf_counter``
    seconds except ``started_at`` (unix time)."""

    rid: str
    endpoint: str
    stream: bool
    path: RequestPath
    status: str  # "ok" | "error" | "cancelled"
    error: str | None
    started_at: float
    t0: float  # arrival
    decode_sent: float  # the (last) decode hop went out
    first_at: float | None  # the first streamed chunk arrived (streaming only)
    end: float
    counted_prompt_tokens: int  # the router's own count, when the engine reports no usage
    response: dict[str, Any] | None  # the final JSON answer, or the stream's last event
    prefill_instance: str | None  # the prefill that answered (disaggregated path)
    decode_instance: str | None
    prefill_times: EngineTimes | None = None
    prefill_wall_ms: float = 0.0
    router_queue_ms: float = 0.0  # waited in the router for a prefill slot
    decode_recent_xfer_ms: float = 0.0  # the decode engine's recent mean NIXL transfer time
    retries: int = 0
    kv_handle: str | None = None
    gaps: list[float] | None = None  # seconds between the streamed chunks
    cached_predicted: int | None = None  # the prefill instance's, by the index
    prefill_cached: int | None = None  # the prefill engine's report
    decode_cached_predicted: int | None = None  # the decode instance's, by the index


def cached_tokens(usage: Any) -> int | None:
    """``usage.prompt_tokens_details.cached_tokens`` of an engine's answer (vLLM reports it
    with ``--enable-prompt-tokens-details``), or None."""
    if not isinstance(usage, dict):
        return None
    details = usage.get("prompt_tokens_details")
    n = details.get("cached_tokens") if isinstance(details, dict) else None
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else None


def gap_summary(gaps: list[float] | None) -> tuple[float, float, int]:
    """(p99 gap ms, worst gap ms, gaps) of one streamed answer; zeros without gaps."""
    if not gaps:
        return 0.0, 0.0, 0
    p99, worst = quantiles(gaps, (0.99, 1.0)) or (0.0, 0.0)  # one sort for both
    return round(p99 * 1e3, 3), round(worst * 1e3, 3), len(gaps)


def account(m: Measured, costs: KvCosts) -> RequestRecord:
    """The request's record: its TTFT parts (``breakdown``), tokens and KV bytes."""
    response = m.response or {}
    usage = response.get("usage") or {}
    decode_times = EngineTimes.parse(response.get("metrics"))
    prompt_tokens = int(usage.get("prompt_tokens") or m.counted_prompt_tokens)
    disagg = m.path is RequestPath.DISAGGREGATED
    # No KV moved when the prefill never answered (cancelled during its hop, say); the
    # blocks the decode instance held already (by the index) are not pulled.
    kv_bytes = (profiles.kv_bytes(costs.model, prompt_tokens - (m.decode_cached_predicted or 0),
                                  costs.block_size)
                if disagg and m.prefill_instance is not None and costs.model is not None
                else 0)
    # The prompt was computed by the prefill engine (disaggregated) or the decode engine.
    if disagg:
        predicted, reported = m.cached_predicted, m.prefill_cached
    else:
        predicted, reported = m.decode_cached_predicted, cached_tokens(usage)
    if m.first_at is not None:
        ttft = (m.first_at - m.t0) * 1e3
        to_first = (m.first_at - m.decode_sent) * 1e3
    else:
        # Non-streaming: the client sees no first token; derive it from when the decode hop
        # was sent plus the decode engine's own queue + first-token time.
        engine = (decode_times.queue_ms + decode_times.ttft_ms) if decode_times else 0.0
        to_first = engine or (m.end - m.decode_sent) * 1e3
        ttft = (m.decode_sent - m.t0) * 1e3 + to_first
    transfer_model_ms = (m.decode_recent_xfer_ms if m.decode_recent_xfer_ms > 0
                         else profiles.transfer_seconds(kv_bytes, costs.link) * 1e3)
    b = breakdown(Observation(
        ttft_ms=ttft, disaggregated=disagg, prefill=m.prefill_times,
        prefill_wall_ms=m.prefill_wall_ms, decode=decode_times,
        decode_wall_to_first_ms=to_first, transfer_model_ms=transfer_model_ms,
        router_queue_ms=m.router_queue_ms))
    gap_p99, gap_max, n_gaps = gap_summary(m.gaps)
    return RequestRecord(
        id=m.rid, started_at=m.started_at, endpoint=m.endpoint, path=m.path, status=m.status,
        stream=m.stream, prompt_tokens=prompt_tokens,
        output_tokens=int(usage.get("completion_tokens") or 0),
        prefill_instance=m.prefill_instance, decode_instance=m.decode_instance,
        queue_ms=b.queue_ms, prefill_ms=b.prefill_ms, transfer_ms=b.transfer_ms,
        decode_sched_ms=b.decode_sched_ms, overhead_ms=b.overhead_ms, ttft_ms=b.ttft_ms,
        itl_ms=decode_times.itl_ms if decode_times else 0.0,
        e2e_ms=round((m.end - m.t0) * 1e3, 3), kv_bytes=kv_bytes, retries=m.retries,
        error=m.error, kv_handle=m.kv_handle, gap_p99_ms=gap_p99, gap_max_ms=gap_max,
        gaps=n_gaps, cached_tokens_predicted=predicted, cached_tokens=reported,
        decode_cached_tokens_predicted=m.decode_cached_predicted if disagg else None)
