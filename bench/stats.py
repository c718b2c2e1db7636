"""The benchmarks' one percentile definition, and the summaries built on it.

Every percentile and median in ``bench`` is the controller's: numpy's ``inverted_cdf`` (the
nearest-rank definition: the smallest sample with at least ``q`` of the samples at or below
it; never an interpolated value), as ``controller.requests_log.percentiles`` computes the
p50/p90/p99 the API and the console show. A median is its p50 (for an even count, the lower
middle sample, not the mean of the two). No samples give NaN.

Quantiles of Prometheus histograms are another thing -- estimated from bucket counts, as
Prometheus's ``histogram_quantile`` does -- and live in ``bench.prom``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Final, Literal

import numpy as np

from controller.requests_log import percentiles as _controller_percentiles

METHOD: Final[Literal["inverted_cdf"]] = "inverted_cdf"  # controller.requests_log's


def quantile(values: Iterable[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``; NaN without samples."""
    a = np.fromiter(values, dtype=float)
    if a.size == 0:
        return math.nan
    return float(np.quantile(a, q, method=METHOD))


def quantiles(values: Iterable[float], qs: Sequence[float]) -> list[float]:
    """Several quantiles of one sample set (sorted once)."""
    a = np.fromiter(values, dtype=float)
    if a.size == 0:
        return [math.nan] * len(qs)
    return [float(x) for x in np.quantile(a, list(qs), method=METHOD)]


def median(values: Iterable[float]) -> float:
    """The p50 of ``quantile``."""
    return quantile(values, 0.5)


def summary(values: Iterable[float]) -> dict[str, float]:
    """p50, p90, p99, mean and max, exactly as the controller's request statistics compute
    them (``controller.requests_log.percentiles``); NaN for no samples (the controller
    reports zeros)."""
    a = np.fromiter(values, dtype=float)
    if a.size == 0:
        return dict.fromkeys(("p50", "p90", "p99", "mean", "max"), math.nan)
    return _controller_percentiles(a)


def weighted_expand(values: Iterable[float], weights: Iterable[int]) -> list[float]:
    """Each value repeated ``weight`` times: a per-token distribution from per-request
    means (a request's mean inter-token latency counts once per gap it averages)."""
    return [v for v, w in zip(values, weights, strict=True) for _ in range(max(0, w))]
