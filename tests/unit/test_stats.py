"""The one percentile definition: nearest rank, the same on every path."""

from __future__ import annotations

import numpy as np
import pytest

from pdctl_api.stats import column_quantiles, quantile, quantiles

QS = (0.0, 0.01, 0.1, 0.25, 0.5, 0.9, 0.95, 0.99, 0.999, 1.0)


def test_nearest_rank_never_interpolates() -> None:
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.0  # the lower middle, not 2.5
    assert quantile([5.0], 0.99) == 5.0
    assert quantile([], 0.5) is None and quantiles((), QS) is None
    assert quantile(np.array([]), 0.5) is None


@pytest.mark.parametrize("n", [1, 2, 3, 7, 10, 99, 100, 101, 333, 512, 513, 2000])
def test_the_short_path_equals_numpy(n: int) -> None:
    rng = np.random.default_rng(n)
    values = rng.exponential(size=n).round(3).tolist()  # ties included
    want = [float(x) for x in np.quantile(np.array(values), QS, method="inverted_cdf")]
    assert quantiles(values, QS) == want
    assert quantiles(np.array(values), QS) == want
    assert quantiles(iter(values), QS) == want
    cols = column_quantiles(np.array([values, values]).T, QS)
    assert cols[:, 0].tolist() == want and cols[:, 1].tolist() == want
