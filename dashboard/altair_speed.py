"""Altair's ``from_dict`` builds a table of every schema class (about 2,300, each hashed
through ``json.dumps``) on every call, and each encoding given as a shorthand string
(``"time:T"``), a value or a condition goes through it: about 10 ms apiece when profiled
(with ``ui.plot.chart``: 0.92 of the render time on the Transfer and Pools pages, BENCHMARKS.md
part 4). The table depends only on the classes, so it is built once per set of classes here.
Upstream has the same change as a draft (vega/altair#3547); where a later Altair no longer
has ``_FromDict`` this does nothing.
No Streamlit import."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from altair.utils import schemapi

_TABLES: dict[frozenset[type], Any] = {}
ORIGINAL: Callable[..., None] | None = None


def install() -> bool:
    """Make ``_FromDict`` reuse its table; False where this Altair has no such class."""
    global ORIGINAL
    cls = getattr(schemapi, "_FromDict", None)
    if cls is None or not hasattr(cls, "hash_schema"):
        return False
    if ORIGINAL is not None:
        return True
    ORIGINAL = original = cls.__init__

    def __init__(self: Any, wrapper_classes: Iterable[type], /) -> None:
        classes = tuple(wrapper_classes)
        key = frozenset(classes)
        table = _TABLES.get(key)
        if table is None:
            original(self, classes)
            _TABLES[key] = self.class_dict
        else:
            self.class_dict = table

    cls.__init__ = __init__
    return True
