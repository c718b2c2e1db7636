"""Reading the console's pages under Streamlit's AppTest: widgets by label, the text of
elements, the tables and charts a page drew; and a quarantined pool on the fake controller."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

import pandas as pd
import pyarrow as pa
from streamlit.testing.v1 import AppTest

from controller.fleet.guard import Quarantine
from controller.models import Role
from dashboard.ui import timerange
from tests.dashboard.fake import FakeController

Console = Callable[..., AppTest]
PAGES = ["overview", "transfer", "pools", "controls", "advisor", "planner", "events"]


def by_label(widgets: Sequence[Any], label: str) -> Any:
    found = [w for w in widgets if w.label == label]
    assert found, f"no widget {label!r} among {[w.label for w in widgets]}"
    return found[0]


def texts(elements: Sequence[Any]) -> str:
    return "\n".join(str(e.value) for e in elements)


def no_exceptions(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


def frame_with(at: AppTest, column: str) -> Any:
    found = [d.value for d in at.dataframe if column in d.value.columns]
    assert found, f"no table with a {column!r} column"
    return found[0]


def marks(spec: Any) -> list[Any]:
    """Every mark of a Vega-Lite spec, layers included."""
    out = [spec["mark"]] if "mark" in spec else []
    for layer in spec.get("layer", []):
        out += marks(layer)
    return out


def chart_edges(chart: Any) -> tuple[float, float]:
    """The start and end (unix s) of the invisible layer that spans a time chart's axis."""
    spec = json.loads(chart.proto.spec)
    edge = next(layer for layer in spec["layer"]
                if layer.get("mark") == {"type": "point", "opacity": 0})
    data = next(d.data.data for d in chart.proto.datasets if d.name == edge["data"]["name"])
    times = pa.ipc.open_stream(data).read_pandas()["time"]
    return float(times.iloc[0].timestamp()), float(times.iloc[1].timestamp())


def chart_frames(chart: Any) -> list[pd.DataFrame]:
    """The data of every dataset a chart carries (Streamlit sends them as Arrow)."""
    return [pa.ipc.open_stream(d.data.data).read_pandas() for d in chart.proto.datasets]


def choose_range(at: AppTest, around: float, minutes: int = 2) -> datetime:
    """In the sidebar, the custom range of ``minutes`` from the whole minute a minute before
    ``around`` (unix s); its start."""
    by_label(at.selectbox, "Window").set_value(timerange.CUSTOM).run()
    start = datetime.fromtimestamp(around - 60).replace(second=0, microsecond=0)
    by_label(at.date_input, "Day").set_value(start.date())
    by_label(at.time_input, "From").set_value(start.time())
    by_label(at.time_input, "To").set_value((start + timedelta(minutes=minutes)).time()).run()
    return start


def quarantine_decode(fake: FakeController, remaining_s: float = 95.0) -> None:
    fake.quarantine[Role.DECODE] = Quarantine(time.time() + remaining_s, 3,
                                              "process exited with status -4 (SIGILL)")
