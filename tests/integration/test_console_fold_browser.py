"""The Controls page in a real browser (Debian's Chromium, Playwright) against a simulated
controller: the confirmation of a reviewed change appears where the operator is looking, even
when the "Review …" button they pressed sat at the bottom of the window (it appeared below the
fold: they had to scroll to find it). Saves a screenshot to ``artifacts/screenshots/``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.integration.harness import ControllerProc
from tests.integration.test_cockpit_browser import browser, choose, open_page
from tests.integration.test_console_browser import SHOTS, console, controller

__all__ = ["console", "controller"]  # the fixtures

pytestmark = pytest.mark.slow

CONFIRM_TITLE = re.compile(r"^Confirm( a disruptive change)? — ")


def test_the_confirmation_shows_where_the_review_button_was_pressed(
        controller: ControllerProc, console: str, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    victim = controller.get("/instances?role=decode")[0]["id"]
    reviews = (("decode size", "2", "Review decode change"),
               (None, victim, "Review drain"),
               ("disaggregate from prompt tokens", "300", "Review routing change"),
               ("TTFT p95 target (ms)", "900", "Review targets change"))
    with browser(tmp_path) as page:  # 1400 x 1100, as the other browser tests
        open_page(page, console, "controls")
        for field, value, review in reviews:
            if field is None:
                choose(page, "instance", re.compile(f"^{re.escape(value)} "))
            else:
                box = page.get_by_role("spinbutton", name=field)
                box.fill(value)
                box.press("Tab")
            button = page.get_by_role("button", name=review)
            # The operator scrolled just far enough to see the button: at the window's bottom.
            button.evaluate("b => b.scrollIntoView({block: 'end'})")
            expect(button).to_be_in_viewport(ratio=0.9)
            button.click()
            title = page.get_by_text(CONFIRM_TITLE)
            expect(title).to_have_count(1, timeout=15_000)
            expect(title).to_be_in_viewport(timeout=5_000)
            expect(page.get_by_role("button", name="Confirm change")).to_be_in_viewport(
                ratio=0.9)  # all of it: sub-pixel edges aside
            if review == "Review targets change":  # what the operator sees: the window
                page.screenshot(path=SHOTS / "controls-confirm-in-view.png")
            page.get_by_role("button", name="Cancel", exact=True).click()
            expect(title).to_have_count(0, timeout=15_000)
    # Every change was cancelled: none was sent.
    assert controller.get("/cluster")["pools"]["decode"]["desired"]["size"] == 1
    assert controller.get("/events", kind="targets.update") == []
    assert controller.get("/events", kind="routing.update") == []
