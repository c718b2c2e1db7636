"""The console's numbers and controls an operator must be able to trust, in a real browser
(Debian's Chromium, Playwright) against a simulated controller under load:

1. draining an instance from the Controls page works while the load changes the instances'
   figures between two reruns (the choice used to reset, every time under load);
2. the Overview's request rate is the rate that arrives, not diluted by the part of the window
   before the controller started;
3. a scaled simulation says so on every page, and the Transfer page compares bandwidth with
   the link in modelled time (it showed several times the link's ceiling).

Then problems 7 and 8 of the same issue: the Pools page shows live instances only (stopped
ones leave the grid and the table's default view) and opens an instance with its events and
log; the Controls page offers only the TPs the controller accepts, shows the accelerators
used and free, reviews a routing change (with a preview of a threshold change from the recent
prompts) before sending it, and records the operator's name as the actor.

Each test saves screenshots to ``artifacts/screenshots/``.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.harness import ControllerProc, Load, start_controller
from tests.integration.test_console_browser import (
    DRAWN,
    SHOTS,
    chromium,
    console,
    console_at,
)

__all__ = ["console"]  # the fixture, on this module's controller

pytestmark = pytest.mark.slow
SCALE = 0.2  # the harness's sim.time_scale


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[ControllerProc]:
    ctl = start_controller(tmp_path, {"pools": {"decode": {"size": 2}}})
    try:
        yield ctl
    finally:
        ctl.stop()


def browser(tmp_path: Path, color_scheme: str = "light"
            ) -> contextlib.AbstractContextManager[Any]:
    """Chromium with the operating system's ``color_scheme`` (``light`` or ``dark``)."""
    return chromium(tmp_path, 1100, color_scheme=color_scheme)


def open_page(page: Any, console_url: str, name: str) -> None:
    from playwright.sync_api import expect

    page.goto(f"{console_url}/{name}")  # /overview too: the default page is also at /
    expect(page.locator("h1").first).to_have_text(name.capitalize(), timeout=30_000)
    expect(page.get_by_text("Page not found")).to_have_count(0)


def shoot(page: Any, name: str) -> None:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    # Streamlit scrolls inside its own container, so a full-page shot stops at the viewport:
    # a tall viewport shows the whole page.
    size = page.viewport_size
    page.set_viewport_size({"width": 1400, "height": 3000})
    page.wait_for_timeout(1_500)  # charts re-laid out
    with contextlib.suppress(PlaywrightTimeout):
        page.locator('[data-testid="stStatusWidget"]').wait_for(state="hidden", timeout=5_000)
    page.screenshot(path=SHOTS / f"{name}.png", full_page=True)
    page.set_viewport_size(size)


def metric(page: Any, label: str) -> str:
    """The value of the metric card whose label starts with ``label``."""
    card = page.locator('[data-testid="stMetric"]').filter(
        has=page.locator('[data-testid="stMetricLabel"]',
                         has_text=re.compile(f"^{re.escape(label)}")))
    return str(card.first.locator('[data-testid="stMetricValue"]').inner_text())


def open_select(page: Any, label: str) -> None:
    """Open the select box labelled ``label``: its options are then listed."""
    box = page.get_by_role("combobox", name=label, exact=True)
    box.click()
    if box.get_attribute("aria-expanded") != "true":  # a click does not always open it
        box.press("ArrowDown")


def choose(page: Any, label: str, option: str | re.Pattern[str]) -> None:
    """Pick ``option`` in the select box labelled ``label``."""
    open_select(page, label)
    page.get_by_role("option", name=option, exact=isinstance(option, str)).click()


def operator(page: Any, name: str) -> None:
    """The operator's name in the sidebar: the audit log names the console's changes by it."""
    field = page.get_by_role("textbox", name="Operator", exact=True)
    field.fill(name)
    field.press("Enter")
    page.wait_for_timeout(500)


def review_change(page: Any, field: str, value: str, review: str, confirm: str) -> None:
    """Type ``value`` in the number field ``field``, press the ``review`` button and see the
    change's confirmation (titled ``confirm``) shown."""
    from playwright.sync_api import expect

    box = page.get_by_role("spinbutton", name=field)
    box.fill(value)
    box.press("Tab")
    page.get_by_role("button", name=review).click()
    expect(page.get_by_text(confirm)).to_be_visible(timeout=15_000)


def number(text: str) -> float:
    m = re.search(r"-?[\d.]+", text.replace(",", ""))
    assert m is not None, text
    return float(m.group(0))


def test_an_instance_is_drained_from_the_console_under_load(
        controller: ControllerProc, console: str, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    victim = controller.get("/instances?role=decode")[0]["id"]
    with Load(controller.url, workers=8, long_only=True) as load, browser(tmp_path) as page:
        open_page(page, console, "controls")
        operator(page, "alice")
        choose(page, "instance", re.compile(f"^{re.escape(victim)} "))
        # Several live refreshes pass with the load changing every instance's figures.
        page.wait_for_timeout(4_000)
        page.get_by_role("button", name="Review drain").click()
        expect(page.get_by_text(f"Confirm a disruptive change — drain {victim}")
               ).to_be_visible(timeout=15_000)
        shoot(page, "controls-drain-review")
        page.get_by_role("button", name="Confirm change").click()
        expect(page.get_by_text(f"{victim} is draining")).to_be_visible(timeout=15_000)
        controller.wait(lambda: controller.get(f"/instances/{victim}")["state"]
                        in ("draining", "stopped"), 15, f"{victim} draining")
        controller.wait_converged(timeout=60)
        res = load.stop()
    assert res.failures == [], res.failures[:5]
    drained = [e for e in controller.get("/events?kind=instance.draining")
               if e["target"] == victim]
    assert drained and drained[0]["actor"] == "pdctl-console/alice", drained


def test_the_request_rate_is_what_arrives_while_the_controller_is_younger_than_the_window(
        controller: ControllerProc, console: str, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    with Load(controller.url, workers=3) as load, browser(tmp_path) as page:
        started = time.monotonic()
        open_page(page, console, "overview")  # the default window is 5 min
        page.wait_for_timeout(12_000)
        expect(page.locator('[data-testid="stMetric"]').first).to_be_visible()
        shown = number(metric(page, "Request rate"))
        elapsed = time.monotonic() - started
        arrived = load.result.ok / elapsed  # what the client completed, per second
        shoot(page, "overview-young-controller")
        load.stop()
    # The controller started seconds before the load: the 5-min window is mostly before it.
    assert 0.6 * arrived <= shown <= 1.6 * arrived, (shown, arrived)


def test_scaled_time_is_said_on_every_page_and_bandwidth_is_compared_in_modelled_time(
        controller: ControllerProc, console: str, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    banner = f"Simulated time runs {1 / SCALE:g}x faster than the modelled hardware"
    with Load(controller.url, workers=4, long_only=True) as load, browser(tmp_path) as page:
        page.wait_for_timeout(3_000)
        for name in ("overview", "pools", "controls", "advisor", "planner", "events",
                     "transfer"):
            open_page(page, console, name)
            expect(page.get_by_text(banner)).to_be_visible(timeout=15_000)
        page.wait_for_timeout(6_000)  # transfers in the window
        share = metric(page, "Of the ceiling")
        achieved = number(metric(page, "Bandwidth (controller, modelled)"))
        shoot(page, "transfer-scaled-time")
        res = load.stop()
    assert res.failures == [], res.failures[:5]
    assert achieved > 0
    assert 0 < number(share) <= 100, share  # the link is never beaten in modelled time


def test_pools_show_live_instances_and_open_one_with_its_events_and_log(
        controller: ControllerProc, console: str, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    with Load(controller.url, workers=4, long_only=True) as load:
        time.sleep(2.0)
        controller.api("PATCH", "/pools/decode", {"size": 1}).raise_for_status()
        controller.wait_converged(timeout=60)
        res = load.stop()
    assert res.failures == [], res.failures[:5]
    decode = controller.get("/instances?role=decode")
    [stopped] = [i["id"] for i in decode if i["state"] == "stopped"]
    [live] = [i["id"] for i in decode if i["state"] == "ready"]
    with browser(tmp_path) as page:
        open_page(page, console, "pools")
        expect(page.get_by_text("Live instances only: 1 stopped or failed instance is in the "
                                "table below.")).to_be_visible(timeout=15_000)
        table = page.locator('[data-testid="stDataFrame"]').first
        expect(table).to_be_visible()
        expect(page.get_by_text("2 of 3 instances")).to_be_visible()  # stopped: not listed
        choose(page, "instance", live)
        expect(page.get_by_text("The tail of its engine's log")).to_be_visible(timeout=15_000)
        expect(page.get_by_text("decode hop for KV handle").first).to_be_visible()
        expect(page.get_by_text("Its events")).to_be_visible()
        expect(page.get_by_text("Its requests", exact=True)).to_be_visible()
        assert int(metric(page, "Requests")) > 0  # the load went through it
        shoot(page, "pools-instance")
        page.get_by_role("button", name="Review drain (restart)").click()  # reviewed first
        expect(page.get_by_text(f"Confirm a disruptive change — drain {live}")).to_be_visible(
            timeout=15_000)
        assert controller.get(f"/instances/{live}")["state"] == "ready"
        page.get_by_role("button", name="Confirm change").click()
        expect(page.get_by_text(f"{live} is draining")).to_be_visible(timeout=15_000)
    assert stopped != live
    assert controller.get(f"/instances/{live}")["state"] in ("draining", "stopped")
    controller.wait_converged(timeout=60)  # the pool started a replacement: a restart
    ready = [i["id"] for i in controller.get("/instances?role=decode") if i["state"] == "ready"]
    assert len(ready) == 1 and ready != [live]


def test_controls_offer_valid_tps_show_capacity_and_review_a_routing_change(
        controller: ControllerProc, console: str, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    with Load(controller.url, workers=3) as load, browser(tmp_path) as page:
        page.wait_for_timeout(3_000)  # recent requests for the threshold preview
        open_page(page, console, "controls")
        operator(page, "bob")
        expect(page.get_by_text(re.compile(r"^Accelerators: 8 used of 32 \(4 nodes x 8 "
                                           r"h100-sxm\), 24 free$"))).to_be_visible()
        open_select(page, "decode TP")
        options = page.get_by_role("option")
        expect(options).to_have_count(3)  # only what the controller would accept
        assert options.all_inner_texts() == ["2", "4", "8"]
        page.keyboard.press("Escape")
        review_change(page, "disaggregate from prompt tokens", "100000",
                      "Review routing change", "Confirm — routing: disagg_min_prompt_tokens")
        expect(page.get_by_text(re.compile(r"of the last \d+ requests, \d+ \(\d+%\) had "
                                           "prompts of 256-99999 tokens"))).to_be_visible()
        assert controller.get("/routing")["disagg_min_prompt_tokens"] == 256  # not yet sent
        shoot(page, "controls-routing-review")
        page.get_by_role("button", name="Confirm change").click()
        expect(page.get_by_text("routing updated")).to_be_visible(timeout=15_000)
        res = load.stop()
    assert res.failures == [], res.failures[:5]
    assert controller.get("/routing")["disagg_min_prompt_tokens"] == 100000
    [event] = controller.get("/events?kind=routing.update")
    assert event["actor"] == "pdctl-console/bob", event


def test_transfer_page_shows_each_path_apart_pairs_and_transfer_over_time(
        controller: ControllerProc, console: str, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    with Load(controller.url, workers=4) as load, browser(tmp_path) as page:  # mixed paths
        page.wait_for_timeout(4_000)
        open_page(page, console, "transfer")
        expect(page.get_by_text("By path", exact=True)).to_be_visible(timeout=15_000)
        expect(page.get_by_text("KV transfer percentiles over time")).to_be_visible()
        page.locator(DRAWN).nth(3).wait_for(timeout=30_000)
        shown = metric(page, "KV transfer p50 · p99 (disaggregated)")
        shoot(page, "transfer-by-path")
        res = load.stop()
    assert res.failures == [], res.failures[:5]
    by_path = controller.get("/stats?window_s=300")["by_path"]
    disagg, coloc = by_path["disaggregated"], by_path["colocated"]
    assert disagg["requests"] > 0 and coloc["requests"] > 0
    p50 = number(shown.split("·")[0])
    # The disaggregated requests' own transfer, not a mean that counts colocated ones as 0.
    assert p50 > 0 and abs(p50 - disagg["transfer_ms"]["p50"]) <= 0.5 * p50 + 1, (
        shown, disagg["transfer_ms"])


def test_overview_health_follows_the_targets_the_operator_sets(
        controller: ControllerProc, console: str, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    # One clock: at sim.time_scale 0.2 the targets hold the modelled gaps (wall / 0.2), which
    # carry this 2-core machine's relay overhead x5: a gap target the simulated fleet meets.
    controller.api("PATCH", "/targets", {"gap_p99_ms": 5000}).raise_for_status()
    with Load(controller.url, workers=3, streaming=True) as load, browser(tmp_path) as page:
        page.wait_for_timeout(3_000)
        open_page(page, console, "overview")
        expect(page.get_by_text("Healthy", exact=True)).to_be_visible(timeout=20_000)
        for card in ("Inter-token gap p99", "Worst gap p99", "Output tokens", "Error rate"):
            expect(page.locator('[data-testid="stMetricLabel"]').filter(
                has_text=re.compile(f"^{re.escape(card)}$"))).to_have_count(1)
        assert metric(page, "Inter-token gap p99").endswith("ms")  # streamed: gaps measured
        # A target the fleet cannot meet, set from Controls like any change.
        open_page(page, console, "controls")
        operator(page, "carol")
        review_change(page, "TTFT p95 target (ms)", "1", "Review targets change",
                      "Confirm — targets: ttft_p95_ms")
        page.get_by_role("button", name="Confirm change").click()
        expect(page.get_by_text("targets updated")).to_be_visible(timeout=15_000)
        open_page(page, console, "overview")
        expect(page.get_by_text("Target broken", exact=True)).to_be_visible(timeout=20_000)
        broken = re.compile(r"TTFT p95 [\d,.]+ ms \(modelled\) > 1 ms")  # one clock
        expect(page.get_by_text(broken)).to_be_visible()
        page.locator(DRAWN).nth(4).wait_for(timeout=30_000)
        shoot(page, "overview-target-broken")
        res = load.stop()
    assert res.failures == [], res.failures[:5]
    event = controller.get("/events?kind=targets.update")[0]  # the newest
    assert event["actor"] == "pdctl-console/carol" and event["after"] == {"ttft_p95_ms": 1.0}


def test_a_change_is_marked_on_the_charts_and_compared_before_and_after(
        controller: ControllerProc, console: str, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    with Load(controller.url, workers=3) as load, browser(tmp_path) as page:
        time.sleep(6.0)
        controller.api("PATCH", "/routing", {"decode_policy": "round_robin"},
                       ).raise_for_status()
        time.sleep(6.0)  # traffic on both sides of the change
        open_page(page, console, "overview")
        expect(page.get_by_text("Last change: before and after")).to_be_visible(
            timeout=20_000)
        expect(page.get_by_text(re.compile(r"^routing.update routing by api: "
                                           r"decode_policy \S+ → round_robin at "))
               ).to_be_visible()
        table = page.locator('[data-testid="stDataFrame"]').filter(
            has=page.get_by_text("before"))
        expect(table.first).to_be_visible()
        page.locator(DRAWN).nth(4).wait_for(timeout=30_000)
        shoot(page, "overview-last-change")
        res = load.stop()
    assert res.failures == [], res.failures[:5]


def test_a_console_with_the_viewer_token_reads_everything_and_changes_nothing(
        controller: ControllerProc, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    wrong = tmp_path / "wrong-token"
    wrong.write_text("not-the-token\n")
    viewer = (controller.state_dir / "viewer-token").read_text().strip()
    with console_at(controller, tmp_path, {"PDCTL_TOKEN_FILE": str(wrong)}) as url, \
            browser(tmp_path) as page:
        page.goto(url)  # a wrong token: said, and mended in place, not a blank page
        expect(page.get_by_text("refused the API token")).to_be_visible(timeout=30_000)
        shoot(page, "overview-wrong-token")
        page.get_by_label("API token for this session", exact=True).fill(viewer)
        page.get_by_role("button", name="Use this token").click()
        expect(page.locator("h1").first).to_have_text("Overview", timeout=20_000)
        expect(page.get_by_text("viewer token: read only")).to_be_visible(timeout=20_000)
        expect(page.locator('[data-testid="stMetric"]').first).to_be_visible()
        page.get_by_role("link", name="Controls").click()  # in-app: the session keeps it
        expect(page.locator("h1").first).to_have_text("Controls", timeout=20_000)
        expect(page.get_by_text("This console holds the viewer token")).to_be_visible(
            timeout=15_000)
        expect(page.get_by_role("button", name="Review decode change")).to_have_count(0)
        shoot(page, "controls-viewer")
    before = controller.get("/cluster")["pools"]
    r = httpx.patch(f"{controller.url}/api/v1/pools/decode", json={"size": 3},
                    headers={"Authorization": "Bearer " + (
                        controller.state_dir / "viewer-token").read_text().strip()})
    assert r.status_code == 403 and controller.get("/cluster")["pools"] == before


def test_a_request_is_found_by_its_id(controller: ControllerProc, console: str,
                                      tmp_path: Path) -> None:
    from playwright.sync_api import expect

    r = httpx.post(f"{controller.url}/v1/completions", timeout=30,
                   headers={"X-Request-Id": "find-me-123"},
                   json={"model": "llama-3-70b", "prompt": "hello there", "max_tokens": 4})
    assert r.status_code == 200, r.text
    with browser(tmp_path) as page:
        open_page(page, console, "overview")
        box = page.get_by_role("textbox", name="Find a request by id", exact=True)
        box.fill("find-me-123")
        page.get_by_role("button", name="Find", exact=True).click()
        expect(page.get_by_text(re.compile(r"^find-me-123 · colocated · ok · started "))
               ).to_be_visible(timeout=15_000)
        box.fill("not-a-request")
        page.get_by_role("button", name="Find", exact=True).click()
        expect(page.get_by_text("no request 'not-a-request' among the last")).to_be_visible(
            timeout=15_000)
        shoot(page, "overview-find-request")
        choose(page, "Window", "Custom range")  # an absolute range: first the last 15 min
        expect(page.get_by_text(re.compile(
            r"^\d\d:\d\d:\d\d → \d\d:\d\d:\d\d \(15 min, a fixed range\)"))).to_be_visible(
            timeout=15_000)
        expect(page.get_by_label("From", exact=True)).to_be_visible()
        expect(page.get_by_text("No requests in the range")).to_have_count(0)  # it holds one
        shoot(page, "overview-custom-range")


def luminance(css_rgb: str) -> float:
    """Relative brightness 0..1 of a CSS ``rgb(r, g, b)``."""
    r, g, b = (float(v) for v in re.findall(r"[\d.]+", css_rgb)[:3])
    return (0.2126 * r + 0.7152 * g + 0.0722 * b) / 255


def test_the_console_follows_a_dark_system_theme(controller: ControllerProc, console: str,
                                                 tmp_path: Path) -> None:
    """Dark mode is Streamlit's (the system's setting, or the menu's Light/Dark/System): the
    pages, their charts and the instance grid must stay readable in it."""
    from playwright.sync_api import expect

    with Load(controller.url, workers=3) as load, browser(tmp_path, "dark") as page:
        page.wait_for_timeout(4_000)
        for name, charts in (("overview", 6), ("transfer", 5), ("pools", 4)):
            open_page(page, console, name)
            expect(page.locator(DRAWN)).to_have_count(charts, timeout=30_000)
            app = page.locator('[data-testid="stApp"]')
            assert luminance(app.evaluate("e => getComputedStyle(e).backgroundColor")) < 0.2
            title = page.locator("h1").first
            assert luminance(title.evaluate("e => getComputedStyle(e).color")) > 0.8
            shoot(page, f"{name}-dark")
    assert load.result.ok > 0 and not load.result.failures, load.result.failures[:3]
