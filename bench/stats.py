"""Percentiles for the benchmarks' results: pdctl's one definition (``pdctl_api.stats``,
nearest rank), with NaN where there are no samples.

NaN rather than None because the results carry it through arithmetic (a TTFT in ms is a
quantile times 1e3), print it as ``n/a`` and write it to JSON as null. Quantiles of
Prometheus histograms are another thing -- estimated from bucket counts, as Prometheus's
``histogram_quantile`` does -- and live in ``bench.prom``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from pdctl_api import stats


def quantile_or_nan(values: Iterable[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``; NaN without samples."""
    got = stats.quantile(values, q)
    return math.nan if got is None else got


def quantiles_or_nan(values: Iterable[float], qs: Sequence[float]) -> list[float]:
    """Several quantiles of one sample set (sorted once); NaNs without samples."""
    got = stats.quantiles(values, qs)
    return [math.nan] * len(qs) if got is None else got


def median(values: Iterable[float]) -> float:
    """The p50 (for an even count, the lower middle sample); NaN without samples."""
    return quantile_or_nan(values, 0.5)


def weighted_expand(values: Iterable[float], weights: Iterable[int]) -> list[float]:
    """Each value repeated ``weight`` times: a per-token distribution from per-request
    means (a request's mean inter-token latency counts once per gap it averages)."""
    return [v for v, w in zip(values, weights, strict=True) for _ in range(max(0, w))]
