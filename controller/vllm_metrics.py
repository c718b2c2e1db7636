"""Reading a vLLM engine's ``/metrics`` page (Prometheus text): the one reader of it, for the
fleet's load polls and the profile sweep's counters. The simulated engine speaks the same
names."""

from __future__ import annotations

import contextlib
from collections.abc import Collection


def sum_series(text: str, names: Collection[str]) -> dict[str, float]:
    """The value of each of ``names`` found on the page, summed over its label sets (an
    engine may expose several, e.g. one per model or rank). Names absent from the page are
    absent from the result; comment lines and unreadable samples are skipped."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in names:
            with contextlib.suppress(ValueError, IndexError):
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def sum_labelled(text: str, name: str, label: str, value: str) -> float | None:
    """The sum of ``name``'s samples whose ``label`` is ``value`` (e.g. vLLM's
    ``vllm:prompt_tokens_by_source_total{source="local_compute"}``); None when none is on
    the page."""
    want = f'{label}="{value}"'
    total: float | None = None
    prefix = name + "{"
    for line in text.splitlines():
        if line.startswith(prefix) and want in line.split("}", 1)[0]:
            with contextlib.suppress(ValueError, IndexError):
                total = (total or 0.0) + float(line.rsplit(" ", 1)[1])
    return total
