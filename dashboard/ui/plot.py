"""A chart on the page: ``chart`` draws an Altair chart built by ``dashboard.charts`` without
Altair's validation of the whole spec on every refresh."""

from __future__ import annotations

import functools
from typing import Any


def chart(where: Any, spec: Any, **kwargs: Any) -> None:
    """``where.altair_chart(spec)``, skipping Altair's JSON-schema validation of the whole
    spec, which Streamlit asks for (``to_dict()``) at every refresh (with ``altair_speed``:
    0.92 of the render time on the Transfer and Pools pages, measured in BENCHMARKS.md part
    4). The chart builders' specs are validated by their unit tests (``tests/dashboard``)."""
    object.__setattr__(spec, "to_dict", functools.partial(type(spec).to_dict, spec,
                                                          validate=False))
    where.altair_chart(spec, **kwargs)
