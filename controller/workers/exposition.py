"""``/metrics`` of a controller with router workers: the brain's families with every
worker's samples added in (counters and histogram buckets add up across processes, as do
the in-flight gauges the workers report)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample


class Merged:
    """A registry-like view (``collect``) for ``generate_latest``."""

    def __init__(self, registry: CollectorRegistry, samples: dict[str, list[list[Any]]]
                 ) -> None:
        self._registry, self._samples = registry, samples

    def collect(self) -> Iterator[Metric]:
        for fam in self._registry.collect():
            extra = self._samples.get(fam.name)
            if extra:
                fam.samples = _added(fam.samples, extra)
            yield fam


def _added(own: list[Sample], extra: list[list[Any]]) -> list[Sample]:
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
