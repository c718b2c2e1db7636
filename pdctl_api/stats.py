"""pdctl's one percentile definition, shared by the controller, the console, the CLI and the
benchmarks: nearest rank (numpy's ``inverted_cdf``): the smallest sample with at least ``q``
of the samples at or below it, never an interpolated value. A median is the p50 (for an even
count, the lower middle sample).

Quantiles estimated from Prometheus histogram buckets (``histogram_quantile``) are another
thing and are named so where they are used."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Final, Literal

import numpy as np

METHOD: Final[Literal["inverted_cdf"]] = "inverted_cdf"


def _array(values: Iterable[float] | np.ndarray) -> np.ndarray:
    if isinstance(values, np.ndarray):
        return values.astype(float, copy=False)
    return np.fromiter(values, dtype=float)


SHORT = 512  # a list up to this long is sorted in Python: numpy's call costs ~40 us


def quantiles(values: Iterable[float] | np.ndarray, qs: Sequence[float]) -> list[float] | None:
    """The ``qs`` quantiles (each 0..1) of one sample set, sorted once; None without
    samples."""
    if isinstance(values, Sequence) and len(values) <= SHORT:
        # The same definition as numpy's inverted_cdf, index ceil(n*q) - 1 computed with the
        # same float product (tests/unit/test_stats.py holds the two paths equal).
        if not values:
            return None
        s, n = sorted(values), len(values)
        return [float(s[min(n - 1, max(0, math.ceil(n * q) - 1))]) for q in qs]
    a = _array(values)
    if a.size == 0:
        return None
    return [float(x) for x in np.quantile(a, list(qs), method=METHOD)]


def quantile(values: Iterable[float] | np.ndarray, q: float) -> float | None:
    """The ``q`` quantile (0..1) of ``values``; None without samples."""
    got = quantiles(values, (q,))
    return None if got is None else got[0]


def column_quantiles(columns: np.ndarray, qs: Sequence[float]) -> np.ndarray:
    """The ``qs`` quantiles of every column of a non-empty 2-D array at once: shape
    ``(len(qs), columns)``."""
    return np.quantile(columns, list(qs), axis=0, method=METHOD)


def mean(values: Iterable[float]) -> float:
    """The arithmetic mean; 0.0 without samples."""
    vals = list(values)
    return sum(vals) / len(vals) if vals else 0.0
