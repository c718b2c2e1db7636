"""The Planner page in a real browser (Debian's Chromium, Playwright) against a simulated
controller under load with the planner in advisory mode: the recommendation is applied
through the page's review (the controller's dry run and its what-if prediction on the recent
traffic) and confirmation, the prediction is then shown against what was measured once the
pools converged, and a target is changed from the page; the changes land in the controller
and its audit log as the console's."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.harness import ControllerProc, Load, start_controller
from tests.integration.test_console_browser import SHOTS, chromium, console

__all__ = ["console"]  # the fixture, on this module's controller

pytestmark = pytest.mark.slow


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[ControllerProc]:
    # min_prefill 2: the planner recommends a second prefill instance whatever the load, so
    # that the page has a recommendation to apply (its sizing is tested elsewhere).
    ctl = start_controller(tmp_path, {"planner": {
        "mode": "advisory", "interval_s": 2.0, "min_requests": 3, "min_prefill": 2}})
    try:
        yield ctl
    finally:
        ctl.stop()


def test_planner_page_applies_a_recommendation_and_changes_a_target(
        controller: ControllerProc, console: str, tmp_path: Path) -> None:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import expect

    with Load(controller.url, workers=2) as load, chromium(tmp_path, 1200) as page:
        page.goto(f"{console}/planner")
        expect(page.locator("h1").first).to_have_text("Planner", timeout=30_000)
        expect(page.get_by_text("sim-llama-3-70b-h100-sxm-tp4").first).to_be_visible()
        review = page.get_by_role("button", name="Review the recommendation")
        review.wait_for(timeout=60_000)
        page.locator('[data-testid="stVegaLiteChart"]').first.wait_for(timeout=30_000)
        assert controller.get("/cluster")["pools"]["prefill"]["desired"]["size"] == 1
        review.click()
        expect(page.get_by_text("Confirm — apply the planner's recommendation")
               ).to_be_visible(timeout=15_000)
        expect(page.get_by_text("start a prefill instance at TP 4").first).to_be_visible()
        # the what-if: the load so far played on 1 and on 2 prefill instances
        prediction = page.locator(".st-key-pdctl-prediction")
        expect(prediction).to_contain_text("Predicted on the last", timeout=15_000)
        expect(prediction).to_contain_text("→ 2xTP4 prefill")
        expect(prediction).to_contain_text("accelerator-hours for that traffic")
        prediction.screenshot(path=SHOTS / "whatif-review.png")
        assert controller.get("/cluster")["pools"]["prefill"]["desired"]["size"] == 1
        page.get_by_role("button", name="Confirm", exact=True).click()
        expect(page.get_by_text("recommendation applied")).to_be_visible(timeout=15_000)
        controller.wait(
            lambda: controller.get("/cluster")["pools"]["prefill"]["desired"]["size"] == 2,
            10, "desired prefill size 2")
        # once converged, the prediction against the requests served since
        hindsight = page.locator(".st-key-pdctl-hindsight")
        expect(hindsight).to_contain_text("measured on the requests served since the change "
                                          "converged", timeout=90_000)
        expect(hindsight).to_contain_text("within the TTFT target: predicted")
        hindsight.screenshot(path=SHOTS / "whatif-measured.png")
        whatif = controller.get("/whatif")
        assert whatif["status"] == "measured" and whatif["forecast"]["proposed"]["prefill"][
            "count"] == 2
        assert {c["figure"] for c in whatif["comparison"]} >= {"ttft", "queue", "prefill"}

        ttft = page.get_by_role("spinbutton", name="Planner TTFT p95 target (ms)")
        ttft.fill("1500")
        ttft.press("Tab")
        page.get_by_role("button", name="Review change").click()
        expect(page.get_by_text("ttft_ms: 2000.0 → 1500.0")).to_be_visible(timeout=15_000)
        page.get_by_role("button", name="Confirm", exact=True).click()
        expect(page.get_by_text("planner settings changed")).to_be_visible(timeout=15_000)
        controller.wait_converged(timeout=60)
        with contextlib.suppress(PlaywrightTimeout):
            page.locator('[data-testid="stStatusWidget"]').wait_for(state="hidden",
                                                                    timeout=5_000)
        page.screenshot(path=SHOTS / "planner.png", full_page=True)
    assert not load.result.failures, load.result.failures[:5]
    assert controller.get("/planner")["ttft_ms"] == 1500.0
    pools = controller.get("/events", kind="pool.update")
    assert {e["actor"] for e in pools} == {"pdctl-console"}
    assert {"size": 2, "tp": 4, "kv_mode": "pull"} in [e["after"] for e in pools
                                                  if e["target"] == "prefill"]
    changed = controller.get("/events", kind="planner.update")[0]
    assert changed["actor"] == "pdctl-console" and changed["after"]["ttft_ms"] == 1500.0
