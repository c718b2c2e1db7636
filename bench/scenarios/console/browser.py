"""The console scenario in Chromium: the console started as a process, each page loaded from
the sidebar until its charts are drawn, round after round, the Pools page's screenshot, and a
refresh in place (live refresh paused, the window switched) until the page stops changing."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from bench.fleet import free_port, healthy
from bench.processes import ProcessFleet, wait_until
from bench.report import ROOT
from bench.scenarios.console.model import CONSOLE_PAGES, SETTLED_MS

CHROMIUM = Path("/usr/bin/chromium")
REFRESHED = ("overview", "transfer", "pools")  # the pages with the most to draw
CHARTS = {"overview": 5, "transfer": 4, "pools": 1, "controls": 0, "advisor": 1, "events": 0}
DRAWN = '[data-testid="stVegaLiteChart"] canvas, [data-testid="stVegaLiteChart"] svg'
SCREENSHOT = ROOT / "artifacts" / "screenshots" / "pools-120.png"

WATCH = """() => { window.__pdctlLast = 0;
  new MutationObserver(() => { window.__pdctlLast = performance.now(); }).observe(
    document.querySelector('[data-testid="stMain"]'),
    {subtree: true, childList: true, attributes: true, characterData: true}); }"""


def time_browser(url: str, state_dir: Path, work: Path, rounds: int
                 ) -> tuple[dict[str, list[float]], str]:
    """Load every page in Chromium, ``rounds`` times in turn; milliseconds per page (each
    round's), and the screenshot's path."""
    from playwright.sync_api import sync_playwright

    from controller.cli.console import console_env, streamlit_argv

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    out: dict[str, list[float]] = {}
    with ProcessFleet(work) as fleet:
        fleet.start("console", streamlit_argv(url, state_dir, port),
                    console_env(url, state_dir))
        wait_until("the console", lambda: healthy(base, "/_stcore/health"), 60, fleet)
        with sync_playwright() as pw, tempfile.TemporaryDirectory() as profile:
            ctx = pw.chromium.launch_persistent_context(
                profile, executable_path=str(CHROMIUM), headless=True,
                viewport={"width": 1400, "height": 1000},
                args=["--headless", "--no-sandbox", "--disable-gpu",
                      "--disable-background-networking", "--disable-component-update",
                      "--no-first-run"])
            page = ctx.new_page()
            t = time.perf_counter()
            page.goto(base)
            page.locator(DRAWN).nth(CHARTS["overview"] - 1).wait_for(timeout=60_000)
            out["first load (overview)"] = [(time.perf_counter() - t) * 1e3]
            visit_pages(page, rounds, out)
            refresh_in_place(page, rounds, out)
            ctx.close()
    return out, str(SCREENSHOT)


def visit_pages(page: Any, rounds: int, out: dict[str, list[float]]) -> None:
    """Each page from the sidebar until it is drawn, ``rounds`` times in turn (the Pools
    page's screenshot on the first); milliseconds under the page's name."""
    for round_ in range(rounds):
        for name in [*CONSOLE_PAGES[1:], CONSOLE_PAGES[0]]:
            t = time.perf_counter()
            page.get_by_role("link", name=name.capitalize()).click()
            page.locator("h1", has_text=name.capitalize()).wait_for(timeout=60_000)
            if CHARTS[name]:
                page.locator(DRAWN).nth(CHARTS[name] - 1).wait_for(timeout=60_000)
            else:
                page.locator('[data-testid="stDataFrame"], [data-testid="stForm"]'
                             ).first.wait_for(timeout=60_000)
            out.setdefault(name, []).append((time.perf_counter() - t) * 1e3)
            if name == "pools" and round_ == 0:
                page.wait_for_timeout(1000)
                page.screenshot(path=SCREENSHOT, full_page=True)


def refresh_in_place(page: Any, rounds: int, out: dict[str, list[float]]) -> None:
    """A refresh of the page the operator is on: live refresh paused (no timer reruns), the
    window switched between 5 and 15 min (every card refetched and redrawn in place, up to
    all 100k records); timed from the choice to the page's last change (no further change
    for SETTLED_MS). Results under ``refresh <page>``."""
    page.get_by_text("Live", exact=True).click()
    for name in REFRESHED:
        page.get_by_role("link", name=name.capitalize()).click()
        page.locator(DRAWN).nth(CHARTS[name] - 1).wait_for(timeout=60_000)
        page.wait_for_timeout(2_000)
        page.evaluate(WATCH)
        for k in range(2 * rounds):
            page.get_by_role("combobox", name="Window", exact=True).click()
            option = page.get_by_role("option", name="15 min" if k % 2 == 0 else "5 min",
                                      exact=True)
            option.wait_for()
            start = page.evaluate("performance.now()")
            option.click()
            while True:
                page.wait_for_timeout(100)
                now, last = page.evaluate("[performance.now(), window.__pdctlLast]")
                if last > start and now - last > SETTLED_MS:
                    break
            out.setdefault(f"refresh {name}", []).append(last - start)
