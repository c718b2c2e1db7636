"""The Planner page: its decisions, a recommendation applied and its settings changed, each
reviewed then confirmed; a planner without a profile or a pass."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from controller.models import Role
from tests.dashboard.fake import FakeController, planner_pass, planner_view
from tests.dashboard.page_helpers import (
    Console,
    by_label,
    chart_edges,
    chart_frames,
    frame_with,
    no_exceptions,
    texts,
)


def test_planner_page_shows_decisions_and_applies_a_recommendation(
        console: Console, fake: FakeController) -> None:
    at = console(fake, "planner")
    no_exceptions(at)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["prefill (now → recommended)"] == "1 → 2"
    table = frame_with(at, "reasons")
    assert list(table["prefill"]) == ["1 → 2", "1 → 1"]  # newest first
    assert list(table["outcome"]) == ["recommended", "no change"]
    by_label(at.button, "Review the recommendation").click().run()
    no_exceptions(at)
    assert [c[1] for c in fake.dry_runs()] == ["/api/v1/pools/prefill?dry_run=true"]
    assert fake.changes() == []  # reviewed, not sent
    assert "Confirm — apply the planner's recommendation" in texts(at.warning)
    by_label(at.button, "Confirm").click().run()
    no_exceptions(at)
    assert fake.changes() == [("PATCH", "/api/v1/pools/prefill", {"size": 2})]
    assert fake.targets[Role.PREFILL].size == 2


def test_planner_settings_are_reviewed_then_sent(console: Console,
                                                 fake: FakeController) -> None:
    at = console(fake, "planner")
    by_label(at.number_input, "Planner TTFT p95 target (ms)").set_value(1500.0)
    by_label(at.selectbox, "Mode").set_value("apply")
    by_label(at.button, "Review change").click().run()
    no_exceptions(at)
    assert fake.changes() == []
    pending = texts(at.warning)
    assert "ttft_ms: 2000.0 → 1500.0" in texts(at.markdown)
    assert "planner settings" in pending
    by_label(at.button, "Confirm").click().run()
    assert fake.changes() == [("PATCH", "/api/v1/planner",
                               {"mode": "apply", "ttft_ms": 1500.0})]
    assert fake.planner["mode"] == "apply"


def test_planner_page_without_a_profile_or_a_pass(console: Console,
                                                  fake: FakeController) -> None:
    fake.planner = {**planner_view(history=[], mode="off"),
                    "problem": "no performance profile for sim-x-tp3: `pdctl profile` ...",
                    "profiles": {"prefill": None, "decode": None}, "next_at": None}
    at = console(fake, "planner")
    no_exceptions(at)
    assert "The planner cannot run: no performance profile" in texts(at.warning)
    assert "No decision yet" in texts(at.caption)
    assert not [b for b in at.button if b.label == "Review the recommendation"]


def test_pool_sizes_are_drawn_on_whole_instance_ticks(console: Console,
                                                      fake: FakeController) -> None:
    """Instances come whole: the pool-size chart's axis has no fractional ticks."""
    at = console(fake, "planner")
    no_exceptions(at)
    specs = [layer for c in at.get("vega_lite_chart")
             for layer in layers(json.loads(c.proto.spec))]
    sizes = [s for s in specs if s.get("encoding", {}).get("y", {}).get("field") == "instances"]
    assert sizes, "no pool-size chart"
    axis = sizes[0]["encoding"]["y"]["axis"]
    assert axis["tickMinStep"] == 1 and axis["format"] == "d"


def test_the_planner_names_its_own_itl_apart_from_the_gap_target(
        console: Console, fake: FakeController) -> None:
    """Controls sets an inter-token gap p99 target (each streamed request's own gap p99); the
    planner draws the p95 of every gap in its interval against its own ITL target: no figure
    of the Planner page is called a gap p95."""
    at = console(fake, "planner")
    no_exceptions(at)
    labels = [w.label for w in at.number_input]
    assert "Planner ITL p95 target (ms)" in labels
    assert not [label for label in labels if "gap" in label.lower()]
    drawn = {m for c in at.get("vega_lite_chart") for df in chart_frames(c)
             if "metric" in df.columns for m in df["metric"]}
    assert drawn == {"TTFT p95 (planner)", "ITL p95 (planner)"}
    itl = by_label(at.number_input, "Planner ITL p95 target (ms)")
    assert "not the Controls page's inter-token gap p99 target" in itl.proto.help


def layers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """A Vega-Lite spec and every layer in it, at any depth."""
    return [spec, *(x for layer in spec.get("layer", []) for x in layers(layer))]


def test_the_planner_charts_cover_the_window_with_its_marks(console: Console,
                                                            fake: FakeController) -> None:
    """One scope per page: the passes of the sidebar's window, on its axis, with the
    cluster's changes and failures marked (the page drew its last 60 passes, unmarked)."""
    now = time.time()
    fake.planner = planner_view(history=[planner_pass(now - 900, (1, 1), (1, 2), 9.0),
                                         planner_pass(now - 20, (1, 1), (1, 1), 2.0)])
    fake.audit = [{"id": 1, "ts": now - 30, "actor": "controller", "kind": "instance.failed",
                   "target": "decode-1", "before": "ready", "after": "failed",
                   "detail": "process exited with status -9 (SIGKILL)"}]
    at = console(fake, "planner")
    no_exceptions(at)
    assert "The 1 passes in the last 300 s" in texts(at.caption)
    charts = at.get("vega_lite_chart")
    assert charts and all(chart_edges(c)[1] - chart_edges(c)[0] == pytest.approx(300, abs=2)
                          for c in charts)
    assert all(any("failed" in set(df.get("kind", [])) for df in chart_frames(c))
               for c in charts)
    assert "decode-1 failed: process exited with status -9 (SIGKILL)" in texts(at.caption)


def test_a_tp_recommendation_is_reviewed_with_its_prediction_then_sent(
        console: Console, fake: FakeController) -> None:
    now = time.time()
    fake.planner = planner_view([planner_pass(
        now - 10, (1, 1), (1, 1), 2.0, tp_advice={"role": "prefill", "size": 1, "tp": 8},
        reasons=["TP: recommend prefill 1 x TP8: 97.0% within target on 10 accelerators"])],
        mode="apply")
    at = console(fake, "planner")
    no_exceptions(at)
    assert not [b for b in at.button if b.label == "Review the recommendation"]
    by_label(at.button, "Review the TP recommendation (prefill 1 x TP8)").click().run()
    no_exceptions(at)
    assert [c[1] for c in fake.dry_runs()] == ["/api/v1/pools/prefill?dry_run=true"]
    assert fake.predictions() == [{"prefill": {"size": 1, "tp": 8}}]
    assert fake.changes() == []
    assert "Confirm — apply the planner's TP recommendation" in texts(at.warning)
    shown = texts(at.markdown)
    assert "**prefill** → 1 x TP8: a rolling replacement" in shown
    assert "Predicted on the last 300 requests" in shown
    by_label(at.button, "Confirm").click().run()
    no_exceptions(at)
    assert fake.changes() == [("PATCH", "/api/v1/pools/prefill", {"size": 1, "tp": 8})]
    assert fake.targets[Role.PREFILL].tp == 8
