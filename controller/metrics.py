"""Every Prometheus metric the controller exports, on a registry owned by the app."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from controller.models import RequestRecord
from pdctl_api.schema import PARTS

TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5,
                2.0, 3.0, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
PART_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
                0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 30.0)
ROUTING_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                   0.1, 0.25, 1.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2,
               0.3, 0.5, 1.0, 2.5)


# Inter-token gaps: 1 ms to about 10 s, each bucket 25 % wider than the one before, so that a
# quantile read back from the counts is within one bucket (25 %) of the true one.
# vLLM's request histograms' buckets: end-to-end seconds, and tokens in a 1-2-5 series.
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
               60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
TOKEN_BUCKETS = tuple(float(m * 10**e) for e in range(7) for m in (1, 2, 5))
GAP_BUCKETS = tuple(round(0.001 * 1.25**k, 6) for k in range(42))


NUMPY_FROM = 64  # gaps per request from which one numpy pass is cheaper than a loop


class GapHistogram(Collector):
    """``pdctl_itl_gap_seconds``: every gap between the chunks of every streamed answer.

    A request adds all its gaps at once when it ends (one numpy bincount, not an
    ``observe`` per token), and the planner reads quantiles of an interval from the difference
    of two ``snapshot``s."""

    NAME = "pdctl_itl_gap_seconds"

    def __init__(self, bounds: Sequence[float] = GAP_BUCKETS) -> None:
        self.bounds = np.asarray(bounds, dtype=float)
        self._bounds = [float(b) for b in bounds]
        self.counts = np.zeros(len(bounds) + 1, dtype=np.int64)
        self.sum = 0.0

    def observe_many(self, gaps: Sequence[float]) -> None:
        if not gaps:
            return
        if len(gaps) < NUMPY_FROM:  # a short answer: numpy's call overhead would dominate
            counts, bounds = self.counts, self._bounds
            for g in gaps:
                counts[bisect.bisect_left(bounds, g)] += 1
            self.sum += float(sum(gaps))
            return
        a = np.asarray(gaps, dtype=float)
        self.counts += np.bincount(np.searchsorted(self.bounds, a, side="left"),
                                   minlength=len(self.counts))
        self.sum += float(a.sum())

    def snapshot(self) -> np.ndarray:
        return self.counts.copy()

    def quantile(self, counts: np.ndarray, q: float) -> float | None:
        """The ``q`` quantile (seconds) of the gaps counted in ``counts`` (a snapshot, or
        the difference of two), interpolated within its bucket; None for no gaps."""
        total = int(counts.sum())
        if total == 0:
            return None
        cum = np.cumsum(counts)
        rank = q * total
        k = int(np.searchsorted(cum, rank, side="left"))
        if k >= len(self.bounds):
            return float(self.bounds[-1])
        lo = float(self.bounds[k - 1]) if k > 0 else 0.0
        below = int(cum[k - 1]) if k > 0 else 0
        inside = int(counts[k])
        frac = (rank - below) / inside if inside else 1.0
        return lo + (float(self.bounds[k]) - lo) * frac

    def collect(self) -> Iterator[HistogramMetricFamily]:
        cum = np.cumsum(self.counts)
        buckets = [(repr(float(b)), float(c)) for b, c in zip(self.bounds, cum, strict=False)]
        buckets.append(("+Inf", float(cum[-1])))
        yield HistogramMetricFamily(
            self.NAME, "Gaps between the chunks of streamed answers as the router relayed "
            "them: the inter-token latency clients feel, stalls included", buckets=buckets,
            sum_value=self.sum)


class AdmissionCollector(Collector):
    """Requests in flight in the controller and the admission limits, read at scrape time."""

    def __init__(self, inflight: Callable[[], int],
                 limits: Callable[[], tuple[int, int]],
                 prefill_waiting: Callable[[], int] = lambda: 0) -> None:
        self._inflight, self._limits = inflight, limits
        self._prefill_waiting = prefill_waiting

    def collect(self) -> Iterator[GaugeMetricFamily]:
        total, per_instance = self._limits()
        yield GaugeMetricFamily("pdctl_inflight_requests",
                                "Client requests in flight in the controller",
                                value=self._inflight())
        yield GaugeMetricFamily("pdctl_inflight_limit", "routing.max_inflight: more requests "
                                "in flight are refused with 429 (0: no limit)", value=total)
        yield GaugeMetricFamily("pdctl_inflight_per_instance_limit",
                                "routing.max_inflight_per_instance (0: no limit)",
                                value=per_instance)
        yield GaugeMetricFamily("pdctl_prefill_queue_waiting",
                                "Requests waiting in the router for a prefill slot "
                                "(routing.prefill_max_inflight)", value=self._prefill_waiting())


class StateCollector(Collector):
    """Whether the state directory takes writes, and the lifecycle writes it refused (their
    events were logged instead), read at scrape time."""

    def __init__(self, state: Callable[[], tuple[bool, int]]) -> None:
        self._state = state

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        writable, failed = self._state()
        yield GaugeMetricFamily("pdctl_state_writable", "1 while the state directory takes "
                                "writes; 0 after one failed (disk full, read-only) until one "
                                "succeeds: operators' changes are refused with 503",
                                value=int(writable))
        yield CounterMetricFamily("pdctl_state_write_failures", "Audit events and fleet state "
                                  "the state directory could not store (logged instead)",
                                  value=failed)


class IndexCollector(Collector):
    """The block index's state per instance, read at scrape time."""

    def __init__(self, states: Callable[[], Iterable[tuple[str, bool, int]]]) -> None:
        self._states = states

    def collect(self) -> Iterator[GaugeMetricFamily]:
        healthy = GaugeMetricFamily(
            "pdctl_kv_index_healthy", "1 when the controller's block index of the instance is "
            "up to date with its KV events; 0 when stale or when it publishes none (then "
            "cache-aware routing treats it by load)", labels=["instance"])
        blocks = GaugeMetricFamily("pdctl_kv_index_blocks", "Prefix blocks the block index "
                                   "holds for the instance", labels=["instance"])
        for inst, ok, n in self._states():
            healthy.add_metric([inst], 1.0 if ok else 0.0)
            blocks.add_metric([inst], float(n))
        yield healthy
        yield blocks


class Metrics:
    """The controller's metrics; ``model_name``: the served model's public name, the label of
    the request histograms (as vLLM's ``model_name``)."""

    def __init__(self, model_name: str = "") -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("pdctl_requests", "Client requests by path and status",
                                ["path", "status"], registry=r)
        self.ttft = Histogram("pdctl_ttft_seconds", "Client-visible time to first token",
                              ["path"], buckets=TTFT_BUCKETS, registry=r)
        self.component = Histogram("pdctl_ttft_component_seconds",
                                   "TTFT parts: queue, prefill, transfer, decode_sched, overhead",
                                   ["component"], buckets=PART_BUCKETS, registry=r)
        self.itl = Histogram("pdctl_itl_seconds", "Mean inter-token latency per request",
                             buckets=ITL_BUCKETS, registry=r)
        self.kv_bytes = Counter("pdctl_kv_transfer_bytes", "KV cache bytes moved prefill->decode",
                                registry=r)
        self.kv_seconds = Histogram("pdctl_kv_transfer_seconds", "KV transfer time per request",
                                    buckets=PART_BUCKETS, registry=r)
        self.routing_decision = Histogram(
            "pdctl_routing_decision_seconds",
            "Request arrival to its first hop sent: parsing, token counting, instance choice",
            buckets=ROUTING_BUCKETS, registry=r)
        self.kv_releases = Counter(
            "pdctl_kv_releases", "KV handles the router had freed without reading them, by "
            "reason (client_gone, decode_unavailable, late) and result (ok, failed)",
            ["reason", "result"], registry=r)
        self.kv_stuck_reads = Counter(
            "pdctl_kv_stuck_reads", "Disaggregated streaming decode hops (and push-mode decode "
            "hops, which always stream) aborted and served colocated because no token came "
            "within kv.late_hop_share of the lease: their KV read or write was stuck", registry=r)
        self.kv_suspect = Counter(
            "pdctl_kv_suspect_requests", "Requests whose decode hop read KV blocks that the "
            "prefill engine reported as already freed (output may be wrong)", registry=r)
        self.admission_refused = Counter(
            "pdctl_admission_refused", "Client requests answered 429 by admission control "
            "(routing.max_inflight, routing.max_inflight_per_instance)", registry=r)
        # The ecosystem's request histograms (vLLM's e2e_request_latency_seconds,
        # request_prompt_tokens, request_generation_tokens), of the requests that completed.
        self.e2e = Histogram("pdctl_e2e_request_latency_seconds", "Client-visible end-to-end "
                             "request latency", ["model_name"], buckets=E2E_BUCKETS,
                             registry=r).labels(model_name)
        self.prompt_tokens = Histogram("pdctl_request_prompt_tokens", "Prompt tokens per "
                                       "request", ["model_name"], buckets=TOKEN_BUCKETS,
                                       registry=r).labels(model_name)
        self.output_tokens = Histogram("pdctl_request_generation_tokens", "Generated tokens "
                                       "per request", ["model_name"], buckets=TOKEN_BUCKETS,
                                       registry=r).labels(model_name)
        self._parts = [(f"{name}_ms", self.component.labels(name)) for name in PARTS]
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        self.gaps = GapHistogram()
        r.register(self.gaps)
        self.prefix_cache_tokens = Counter(
            "pdctl_prefix_cache_tokens", "Prompt tokens of the requests each instance computed "
            "(kind=prompt), of those the router predicted it held in its prefix cache "
            "(kind=predicted, from the engines' KV events) and of those the engine reported "
            "served from it (kind=reported); drift: predicted against reported",
            ["instance", "kind"], registry=r)
        self.handoff = Counter(
            "pdctl_handoff_decisions", "Hand-off decisions (routing.disagg_policy) by policy "
            "and decision (disaggregated, local)", ["policy", "decision"], registry=r)
        self.kv_fallback = Counter(
            "pdctl_kv_fallback_requests", "Requests routed disaggregated whose decode engine "
            "computed the prompt itself (the KV never arrived: silent fallback), by prefill "
            "and decode instance", ["prefill", "decode"], registry=r)
        self.planner_recommended = Gauge(
            "pdctl_planner_recommended_instances", "The SLA planner's recommended pool size "
            "(advisory and apply modes; absent when the planner is off)", ["role"], registry=r)

    def attach_state(self, state: Callable[[], tuple[bool, int]]) -> None:
        self.registry.register(StateCollector(state))

    def attach_admission(self, inflight: Callable[[], int],
                         limits: Callable[[], tuple[int, int]],
                         prefill_waiting: Callable[[], int] = lambda: 0) -> None:
        self.registry.register(AdmissionCollector(inflight, limits, prefill_waiting))

    def child(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, looked up once: ``labels`` takes a lock each call."""
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def observe(self, rec: RequestRecord, gaps: Sequence[float] | None = None) -> None:
        self.child(self.requests, rec.path.value, rec.status).inc()
        if rec.status != "ok":
            return
        if gaps:
            self.gaps.observe_many(gaps)
        self.child(self.ttft, rec.path.value).observe(rec.ttft_ms / 1e3)
        self.e2e.observe(rec.e2e_ms / 1e3)
        self.prompt_tokens.observe(rec.prompt_tokens)
        self.output_tokens.observe(rec.output_tokens)
        for attr, child in self._parts:
            child.observe(getattr(rec, attr) / 1e3)
        if rec.itl_ms > 0:
            self.itl.observe(rec.itl_ms / 1e3)
        if rec.kv_bytes:
            self.kv_bytes.inc(rec.kv_bytes)
            self.kv_seconds.observe(rec.transfer_ms / 1e3)
        if rec.cached_tokens_predicted is not None or rec.cached_tokens is not None:
            self._observe_cache(rec)

    def _observe_cache(self, rec: RequestRecord) -> None:
        inst = rec.prefill_instance if rec.path.value == "disaggregated" else rec.decode_instance
        if inst is None:
            return
        tokens = self.prefix_cache_tokens
        tokens.labels(inst, "prompt").inc(rec.prompt_tokens)
        if rec.cached_tokens_predicted is not None:
            tokens.labels(inst, "predicted").inc(rec.cached_tokens_predicted)
        if rec.cached_tokens is not None:
            tokens.labels(inst, "reported").inc(rec.cached_tokens)

    def attach_kv_index(self, states: Callable[[], Iterable[tuple[str, bool, int]]]) -> None:
        """Per-instance gauges of the KV block index: ``states()`` yields (instance,
        up to date, blocks held)."""
        self.registry.register(IndexCollector(states))


# ---- one /metrics over several processes (router workers, ``controller.workers``) -------

Samples = dict[str, list[list[Any]]]  # family name -> [sample name, labels, value]


def samples_of(registry: CollectorRegistry) -> Samples:
    """A process's metric samples by family, ``_created`` timestamps left out (they do not
    add up across processes)."""
    out: Samples = {}
    for fam in registry.collect():
        rows = [[s.name, s.labels, s.value] for s in fam.samples
                if not s.name.endswith("_created")]
        if rows:
            out[fam.name] = rows
    return out


class Merged:
    """``/metrics`` of a controller with router workers: a registry-like view (``collect``,
    for ``generate_latest``) of the controller's families with every worker's samples added
    in -- counters and histogram buckets add up across processes, as do the in-flight gauges
    the workers report."""

    def __init__(self, registry: CollectorRegistry, samples: Samples) -> None:
        self._registry, self._samples = registry, samples

    def collect(self) -> Iterator[Metric]:
        for fam in self._registry.collect():
            extra = self._samples.get(fam.name)
            if extra:
                fam.samples = _added(fam.samples, extra)
            yield fam


def _added(own: list[Sample], extra: list[list[Any]]) -> list[Sample]:
    """``own`` with ``extra``'s values added by name and labels."""
    more: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for name, labels, value in extra:
        key = (name, tuple(sorted(labels.items())))
        more[key] = more.get(key, 0.0) + value
    out = []
    for s in own:
        key = (s.name, tuple(sorted(s.labels.items())))
        add = more.pop(key, None)
        out.append(s if add is None else s._replace(value=s.value + add))
    # Label sets only workers have seen: after the brain's own, each histogram's samples
    # in the order the workers sent them.
    out.extend(Sample(name, dict(labels), value) for (name, labels), value in more.items())
    return out
