"""The Planner page: its decisions, a recommendation applied and its settings changed, each
reviewed then confirmed; a planner without a profile or a pass."""

from __future__ import annotations

import json

from controller.models import Role
from tests.dashboard.fake import FakeController, planner_view
from tests.dashboard.page_helpers import Console, by_label, frame_with, no_exceptions, texts


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
    by_label(at.number_input, "TTFT p95 target (ms)").set_value(1500.0)
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
    specs = [json.loads(c.proto.spec) for c in at.get("vega_lite_chart")]
    sizes = [s for s in specs if s.get("encoding", {}).get("y", {}).get("field") == "instances"]
    assert sizes, "no pool-size chart"
    axis = sizes[0]["encoding"]["y"]["axis"]
    assert axis["tickMinStep"] == 1 and axis["format"] == "d"
