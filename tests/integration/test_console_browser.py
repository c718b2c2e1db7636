"""The console in a real browser: Debian's Chromium driven by Playwright, against a simulated
controller under load. Sees live TTFT parts on the Overview, changes the decode pool from the
Controls page (1 -> 2, confirmed) and checks the controller converges; screenshots every page
to ``artifacts/screenshots/``."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controller.cli.console import console_env, streamlit_argv
from tests.integration.harness import (
    ControllerProc,
    Load,
    free_port,
    start_controller,
    wait_healthy,
)

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run"]
SHOTS = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"
CHARTS = {"transfer": 4, "pools": 3, "advisor": 1, "events": 0}  # Vega-Lite charts per page
DRAWN = '[data-testid="stVegaLiteChart"] canvas, [data-testid="stVegaLiteChart"] svg'

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(CHROMIUM).exists() and shutil.which("chromium") is None,
                       reason="Debian's chromium is not installed (make browser)"),
]


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[ControllerProc]:
    ctl = start_controller(tmp_path)
    try:
        yield ctl
    finally:
        ctl.stop()


@contextlib.contextmanager
def console_at(controller: ControllerProc, tmp_path: Path,
               extra_env: dict[str, str] | None = None) -> Iterator[str]:
    """A console process on ``controller``, its URL once it answers; stopped afterwards."""
    port = free_port()
    log_path = tmp_path / f"console-{port}.log"
    env = {**os.environ, **console_env(controller.url, controller.state_dir),
           **(extra_env or {})}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(streamlit_argv(controller.url, controller.state_dir, port),
                                stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, 60, "/_stcore/health", proc, log_path)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def console(controller: ControllerProc, tmp_path: Path) -> Iterator[str]:
    with console_at(controller, tmp_path) as url:
        yield url


@contextlib.contextmanager
def chromium(tmp_path: Path, height: int, **options: Any) -> Iterator[Any]:
    """A page of Debian's Chromium, 1400 px wide and ``height`` high, in a profile under
    ``tmp_path`` (``options``: more of Playwright's context options); closed afterwards.
    Makes ``SHOTS`` for the page's screenshots."""
    from playwright.sync_api import sync_playwright

    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=CHROMIUM, headless=True,
            args=CHROMIUM_ARGS, viewport={"width": 1400, "height": height}, **options)
        try:
            yield ctx.new_page()
        finally:
            ctx.close()


def ms(text: str) -> float:
    m = re.match(r"([\d.]+) ms", text.strip())
    return float(m.group(1)) if m else 0.0


def test_console_in_chromium(controller: ControllerProc, console: str, tmp_path: Path) -> None:
    from playwright.sync_api import Page, expect
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    def metric(page: Page, label: str) -> float:
        card = page.locator('[data-testid="stMetric"]').filter(
            has=page.locator('[data-testid="stMetricLabel"]', has_text=re.compile(
                f"^{re.escape(label)}$")))
        return ms(card.first.locator('[data-testid="stMetricValue"]').inner_text())

    def shoot(page: Page, name: str) -> None:
        # Between two live refreshes, so that no card is greyed out as "updating".
        with contextlib.suppress(PlaywrightTimeout):
            page.locator('[data-testid="stStatusWidget"]').wait_for(state="hidden",
                                                                    timeout=5_000)
        page.screenshot(path=SHOTS / f"{name}.png", full_page=True)

    def visit(page: Page, name: str) -> None:
        page.goto(f"{console}/{'' if name == 'overview' else name}")  # default page is /
        expect(page.locator("h1").first).to_have_text(name.capitalize(), timeout=30_000)
        page.wait_for_load_state("networkidle")
        expect(page.get_by_text("Page not found")).to_have_count(0)

    with Load(controller.url, workers=3) as load, chromium(tmp_path, 1000) as page:
        visit(page, "overview")
        parts = ("prefill", "KV transfer", "decode scheduling")
        deadline = time.monotonic() + 30
        while not all(metric(page, p) > 0 for p in parts):
            assert time.monotonic() < deadline, {p: metric(page, p) for p in parts}
            page.wait_for_timeout(500)
        expect(page.locator(DRAWN)).to_have_count(6, timeout=30_000)
        shoot(page, "overview")

        for name, charts in CHARTS.items():
            visit(page, name)
            if charts:
                page.locator(DRAWN).nth(charts - 1).wait_for(timeout=30_000)
            else:
                page.locator('[data-testid="stDataFrame"]').first.wait_for(timeout=30_000)
            shoot(page, name)

        visit(page, "controls")
        size = page.get_by_label("decode size")
        size.fill("2")
        size.press("Tab")
        page.get_by_role("button", name="Review decode change").click()
        confirm = page.get_by_role("button", name="Confirm change")
        expect(page.get_by_text("decode pool: 1 x TP2 → 2 x TP2").first).to_be_visible()
        assert controller.get("/cluster")["pools"]["decode"]["desired"]["size"] == 1
        confirm.click()
        expect(page.get_by_text("sent, the pool is converging")).to_be_visible()
        controller.wait(
            lambda: controller.get("/cluster")["pools"]["decode"]["desired"]["size"] == 2,
            10, "desired decode size 2")
        controller.wait_converged(timeout=60)
        expect(page.get_by_text("desired 2 x TP2 · KV pull · converged")).to_be_visible(
            timeout=15_000)
        page.wait_for_timeout(1000)  # progress bars animate
        shoot(page, "controls")
    assert not load.result.failures, load.result.failures[:5]
    events = controller.get("/events?kind=pool.update")
    assert events[0]["actor"] == "pdctl-console"
    assert events[0]["after"] == {"size": 2, "tp": 2, "kv_mode": "pull"}
