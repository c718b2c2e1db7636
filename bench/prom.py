"""The benchmarks' one reader of Prometheus text (the controller's and the engines' /metrics).

``parse`` turns a page into samples (name, labels, value) with ``prometheus_client``'s own
parser; a ``Page`` sums samples by name and label filter, gathers histogram buckets, and
subtracts an earlier page. ``histogram_quantile`` estimates a quantile from cumulative
bucket counts the way Prometheus's ``histogram_quantile`` does (linear within the bucket;
a quantile in the ``+Inf`` bucket is the largest finite bound).

    page = prom.parse(text)
    page.sum("vllm:request_success_total")
    page.sum("vllm:prompt_tokens_by_source_total", source="external_kv_transfer")
    prom.histogram_quantile(after.buckets("pdctl_ttft_seconds", before), 0.99)
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


@dataclass
class Page:
    """One scrape: its samples, and the monotonic time it was asked for and answered."""

    samples: list[Sample] = field(default_factory=list)
    sent_at: float = math.nan
    answered_at: float = math.nan

    def select(self, name: str, **labels: str) -> Iterator[Sample]:
        """Samples called ``name`` whose labels include every ``labels`` item."""
        for s in self.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                yield s

    def sum(self, name: str, **labels: str) -> float:
        """Sum of the matching samples (0.0 when there are none)."""
        return sum(s.value for s in self.select(name, **labels))

    def has(self, name: str) -> bool:
        return any(s.name == name for s in self.samples)

    def by_label(self, name: str, *keys: str, **labels: str) -> dict[str, float]:
        """Sums of a metric grouped by the values of ``keys`` (joined with ``/``)."""
        out: dict[str, float] = {}
        for s in self.select(name, **labels):
            k = "/".join(s.labels.get(key, "?") for key in keys)
            out[k] = out.get(k, 0.0) + s.value
        return out

    def buckets(self, histogram: str, before: Page | None = None,
                **labels: str) -> dict[float, float]:
        """Cumulative bucket counts ``{le: count}`` of a histogram, summed over every other
        label; less the same buckets of ``before`` when given (the counts in between)."""
        out = self._buckets(histogram, labels)
        if before is not None:
            earlier = before._buckets(histogram, labels)
            out = {le: c - earlier.get(le, 0.0) for le, c in out.items()}
        return out

    def _buckets(self, histogram: str, labels: dict[str, str]) -> dict[float, float]:
        out: dict[float, float] = {}
        for s in self.select(histogram + "_bucket", **labels):
            if "le" in s.labels:
                le = float(s.labels["le"])
                out[le] = out.get(le, 0.0) + s.value
        return out

    def delta(self, before: Page | None, name: str, **labels: str) -> float:
        """How much a counter (summed) grew since ``before``."""
        return self.sum(name, **labels) - (before.sum(name, **labels) if before else 0.0)


def parse(text: str, sent_at: float = math.nan, answered_at: float = math.nan) -> Page:
    """A /metrics page, parsed."""
    samples = [Sample(s.name, dict(s.labels), float(s.value))
               for family in text_string_to_metric_families(text) for s in family.samples]
    return Page(samples, sent_at, answered_at)


def histogram_quantile(buckets: dict[float, float], q: float) -> float:
    """Prometheus's ``histogram_quantile`` over cumulative ``{le: count}``; NaN when empty."""
    les = sorted(buckets)
    if not les or buckets[les[-1]] <= 0:
        return math.nan
    rank = q * buckets[les[-1]]
    prev_le, prev_c = 0.0, 0.0
    for le in les:
        c = buckets[le]
        if c >= rank:
            if math.isinf(le):
                return prev_le
            if c == prev_c:
                return le
            return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
        prev_le, prev_c = le, c
    return prev_le


def histogram_count(buckets: dict[float, float]) -> float:
    """Observations in a histogram (its ``+Inf`` bucket)."""
    return buckets.get(math.inf, 0.0)
