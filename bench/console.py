"""How fast the console refreshes with 100k recorded requests and 120 instances.

The records and instances are SYNTHETIC: the controller app is built in-process (no reconcile
loop, no engines), its RequestLog is filled with 100,000 generated RequestRecords spread over
the last 10 minutes (about 167 requests/s), its fleet registry with 120 ready instances
(40 prefill x TP4, 80 decode x TP2) and its audit log with 500 events; it is served by
uvicorn in a thread. Then:

1. the API calls each live card makes are timed over HTTP (median and p90 of several tries,
   ``bench.stats``) for several windows: 60 s (~10k records), 300 s (~50k) and 900 s (all
   100k);
2. each page is rendered with Streamlit's AppTest against that server (script run, API calls,
   DataFrames and chart specs; the browser's drawing is not included), caches cleared first;
3. when Chromium is installed (``/usr/bin/chromium``; ``--no-browser`` skips it): the console
   is started with ``streamlit_argv`` (a ``bench.fleet`` process) and each page is loaded in
   Chromium until its charts are drawn, ``--rounds`` times in turn (median and max), and the
   Pools page with 120 instances is saved to ``artifacts/screenshots/pools-120.png``; then a
   refresh in place of the Overview, Transfer and Pools pages (live refresh paused, the
   window switched between 5 and 15 min: every card refetched and redrawn) until the page
   stops changing.

    .venv/bin/python -m bench.console [--quick] [--no-browser] [--records N] [--tries N]
        [--rounds N]
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import random
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn

from bench import stats
from bench.fleet import Fleet, free_port, healthy, interrupt_on_signals, wait_until
from bench.report import ROOT, fmt, write_json
from controller.api.app import create_app
from controller.api.state import AppState
from controller.config import Settings
from controller.launchers.base import Launched, Launcher, LaunchSpec
from controller.models import Instance, RequestPath, RequestRecord, Role
from dashboard.client import ControllerClient
from dashboard.config import RECENT_LIMIT, step_for
from pdctl_api import profiles

TITLE = "Console: 100k synthetic records, 120 instances"
ABOUT = ("The controller app in-process with SYNTHETIC state (100,000 request records over the "
         "last 10 minutes, 40 prefill + 80 decode ready instances, 500 audit events): the API "
         "calls behind the console's live cards over HTTP, each page rendered with "
         "Streamlit's AppTest, and each page loaded in Chromium until its charts are drawn.")

CHROMIUM = Path("/usr/bin/chromium")
PAGES = ["overview", "transfer", "pools", "controls", "advisor", "events"]
PREFILL, DECODE = 40, 80
REFRESHED = ("overview", "transfer", "pools")  # the pages with the most to draw
CHARTS = {"overview": 5, "transfer": 4, "pools": 1, "controls": 0, "advisor": 1, "events": 0}
WINDOWS = (60.0, 300.0, 900.0)


@dataclass
class Options:
    records: int = 100_000
    tries: int = 7
    browser: bool = True  # when Chromium is installed
    rounds: int = 5  # visits of each page in Chromium

    @staticmethod
    def defaults(quick: bool) -> Options:
        return Options(records=20_000, tries=3, rounds=2) if quick else Options()


@dataclass
class ApiTiming:
    call: str
    window_s: float | None
    wall_ms_p50: float
    wall_ms_p90: float
    cpu_ms_p50: float  # this process: server and client both run here
    kb: float


@dataclass
class PageTiming:
    page: str
    wall_ms_p50: float
    wall_ms_max: float
    cpu_ms_p50: float


@dataclass
class ConsoleResult:
    options: Options
    records: int
    instances: int
    events: int
    build_s: float
    api: list[ApiTiming] = field(default_factory=list)
    pages: list[PageTiming] = field(default_factory=list)
    browser_ms: dict[str, list[float]] = field(default_factory=dict)  # page -> each visit
    browser_skipped: str | None = None
    screenshot: str | None = None


class NoLauncher(Launcher):
    """Starts nothing: the benchmark's instances are synthetic."""

    name = "bench"

    async def start(self, spec: LaunchSpec) -> Launched:
        raise RuntimeError("the benchmark starts no instances")

    async def stop(self, launched: Launched, grace_s: float = 5.0) -> None:
        return None


def synthetic_records(n: int, span_s: float, rng: random.Random) -> Iterator[RequestRecord]:
    m = profiles.model("llama-3-70b")
    now = time.time()
    for k in range(n):
        prompt = int(rng.lognormvariate(7.0, 1.0)) + 1
        disagg = prompt >= 512
        parts = {"queue_ms": rng.expovariate(1 / 3), "prefill_ms": 0.05 * prompt + 5,
                 "transfer_ms": (0.0066 * prompt + 10) if disagg else 0.0,
                 "decode_sched_ms": rng.uniform(5, 15) if disagg else 0.0,
                 "overhead_ms": rng.uniform(1, 6)}
        yield RequestRecord(
            id=f"synthetic-{k}", started_at=now - span_s + span_s * k / n,
            endpoint="/v1/completions",
            path=RequestPath.DISAGGREGATED if disagg else RequestPath.COLOCATED,
            status="ok" if k % 200 else "error", stream=bool(k % 2), prompt_tokens=prompt,
            output_tokens=rng.randint(16, 512),
            prefill_instance=f"prefill-{k % PREFILL + 1}" if disagg else None,
            decode_instance=f"decode-{PREFILL + k % DECODE + 1}",
            ttft_ms=sum(parts.values()), itl_ms=rng.uniform(20, 40), e2e_ms=2000.0,
            kv_bytes=profiles.kv_bytes(m, prompt, 16) if disagg else 0,
            queue_ms=parts["queue_ms"], prefill_ms=parts["prefill_ms"],
            transfer_ms=parts["transfer_ms"], decode_sched_ms=parts["decode_sched_ms"],
            overhead_ms=parts["overhead_ms"])


def fill(st: AppState, records: int, rng: random.Random) -> None:
    for rec in synthetic_records(records, 600.0, rng):
        st.requests.add(rec)
    registry = st.fleet.registry
    n = 0
    for role, count, tp in ((Role.PREFILL, PREFILL, 4), (Role.DECODE, DECODE, 2)):
        for _ in range(count):
            n += 1
            inst = Instance(id=f"{role.value}-{n}", role=role, tp=tp,
                            url=f"http://10.0.{n // 8}.{n % 8}:8000",
                            created_at=time.monotonic(), running=float(rng.randint(0, 64)),
                            waiting=float(rng.randint(0, 6)), kv_usage=rng.random())
            registry.add(inst, "synthetic", actor="bench")
            registry.mark_ready(inst)
    for k in range(500):
        st.store.record("bench", "instance.ready", f"decode-{k}", "starting", "ready",
                        "synthetic event")


@contextlib.contextmanager
def serve(state_dir: Path, records: int) -> Iterator[tuple[str, AppState]]:
    settings = Settings.model_validate({
        "backend": "sim", "hardware": {"nodes": 64},
        "pools": {"prefill": {"size": PREFILL, "tp": 4}, "decode": {"size": DECODE, "tp": 2}},
        "controller": {"state_dir": str(state_dir), "request_buffer": max(100, records)}})
    app = create_app(settings, NoLauncher())
    st: AppState = app.state.pdctl
    fill(st, records, random.Random(4))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="off",
                                           log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", st
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        st.store.close()


def _size(x: Any) -> int:
    """Bytes of an API answer as JSON (typed models) or as text."""
    if isinstance(x, list):
        return sum(_size(v) for v in x)
    dump = getattr(x, "model_dump_json", None)
    return len(dump()) if callable(dump) else len(str(x))


def timed(fn: Callable[[], Any], tries: int) -> tuple[float, float, float, int]:
    """p50 and p90 wall milliseconds, p50 CPU milliseconds of this process (server and
    client both run here, so CPU time is what the call costs, whatever else the machine is
    doing), and the answer's size in bytes."""
    wall, cpu_ms, size = [], [], 0
    for _ in range(tries):
        t, c = time.perf_counter(), time.process_time()
        size = _size(fn())
        wall.append((time.perf_counter() - t) * 1e3)
        cpu_ms.append((time.process_time() - c) * 1e3)
    p50, p90 = stats.quantiles(wall, (0.5, 0.9))
    return p50, p90, stats.median(cpu_ms), size


def card_calls(c: ControllerClient, window: float
               ) -> list[tuple[str, bool, Callable[[], Any]]]:
    """(name, depends on the window, call) of every live card's API call."""
    return [
        ("routing (banner, every page)", False, c.routing),
        (f"stats?window_s={window:g}", True, lambda: c.stats(window)),
        (f"timeseries?window_s={window:g}&step_s={step_for(window):g}", True,
         lambda: c.timeseries(window, step_for(window))),
        (f"requests?limit={RECENT_LIMIT} (Overview)", False, lambda: c.requests(RECENT_LIMIT)),
        ("requests?limit=500 (Transfer)", False, lambda: c.requests(500)),
        ("cluster (120 instances)", False, c.cluster),
        ("advisor (600 s, every 10 s)", False, c.advisor),
        ("events?limit=100", False, lambda: c.events(100)),
    ]


def bench_api(url: str, token: str, tries: int) -> list[ApiTiming]:
    c = ControllerClient(url, token, timeout_s=60)
    out: list[ApiTiming] = []
    try:
        for window in WINDOWS:
            for name, windowed, fn in card_calls(c, window):
                if not windowed and window != WINDOWS[0]:
                    continue
                p50, p90, cpu_ms, size = timed(fn, tries)
                out.append(ApiTiming(name, window if windowed else None, p50, p90, cpu_ms,
                                     size / 1e3))
    finally:
        c.close()
    return out


def bench_pages(url: str, state_dir: Path, tries: int) -> list[PageTiming]:
    logging.disable(logging.WARNING)  # bare-mode caching notes, access lines
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    from dashboard import ui
    from dashboard.config import ConsoleConfig

    at = AppTest.from_file(str(ROOT / "dashboard" / "app.py"), default_timeout=120)
    at.session_state[ui.CONFIG_KEY] = ConsoleConfig(url, state_dir)
    at.run()  # warm-up: imports
    out = []
    for page in PAGES:
        at.switch_page(f"views/{page}.py")
        times, cpu_ms = [], []
        for _ in range(tries):
            st.cache_data.clear()
            t, c = time.perf_counter(), time.process_time()
            at.run()
            times.append((time.perf_counter() - t) * 1e3)
            cpu_ms.append((time.process_time() - c) * 1e3)
            if at.exception:
                raise RuntimeError(f"page {page}: {[e.value for e in at.exception]}")
        out.append(PageTiming(page, stats.median(times), max(times), stats.median(cpu_ms)))
    return out


def bench_browser(url: str, state_dir: Path, work: Path, rounds: int
                  ) -> tuple[dict[str, list[float]], str]:
    """Load every page in Chromium, ``rounds`` times in turn; milliseconds per page (each
    round's), and the screenshot's path."""
    from playwright.sync_api import sync_playwright

    from controller.cli.console import console_env, streamlit_argv

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    shots = ROOT / "artifacts" / "screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    out: dict[str, list[float]] = {}
    with Fleet(work) as fleet:
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
            drawn = ('[data-testid="stVegaLiteChart"] canvas, '
                     '[data-testid="stVegaLiteChart"] svg')
            t = time.perf_counter()
            page.goto(base)
            page.locator(drawn).nth(CHARTS["overview"] - 1).wait_for(timeout=60_000)
            out["first load (overview)"] = [(time.perf_counter() - t) * 1e3]
            for round_ in range(rounds):
                for name in [*PAGES[1:], PAGES[0]]:
                    t = time.perf_counter()
                    page.get_by_role("link", name=name.capitalize()).click()
                    page.locator("h1", has_text=name.capitalize()).wait_for(timeout=60_000)
                    if CHARTS[name]:
                        page.locator(drawn).nth(CHARTS[name] - 1).wait_for(timeout=60_000)
                    else:
                        page.locator('[data-testid="stDataFrame"], [data-testid="stForm"]'
                                     ).first.wait_for(timeout=60_000)
                    out.setdefault(name, []).append((time.perf_counter() - t) * 1e3)
                    if name == "pools" and round_ == 0:
                        page.wait_for_timeout(1000)
                        page.screenshot(path=shots / "pools-120.png", full_page=True)
            refresh_in_place(page, drawn, rounds, out)
            ctx.close()
    return out, str(shots / "pools-120.png")


SETTLED_MS = 800  # no change to the page for this long: the refresh is drawn

WATCH = """() => { window.__pdctlLast = 0;
  new MutationObserver(() => { window.__pdctlLast = performance.now(); }).observe(
    document.querySelector('[data-testid="stMain"]'),
    {subtree: true, childList: true, attributes: true, characterData: true}); }"""


def refresh_in_place(page: Any, drawn: str, rounds: int, out: dict[str, list[float]]) -> None:
    """A refresh of the page the operator is on: live refresh paused (no timer reruns), the
    window switched between 5 and 15 min (every card refetched and redrawn in place, up to
    all 100k records); timed from the choice to the page's last change (no further change
    for SETTLED_MS). Results under ``refresh <page>``."""
    page.get_by_text("Live", exact=True).click()
    for name in REFRESHED:
        page.get_by_role("link", name=name.capitalize()).click()
        page.locator(drawn).nth(CHARTS[name] - 1).wait_for(timeout=60_000)
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


def run_console(o: Options) -> ConsoleResult:
    with tempfile.TemporaryDirectory(prefix="pdctl-bench-console-") as tmp:
        state_dir = Path(tmp) / "state"
        t = time.perf_counter()
        with serve(state_dir, o.records) as (url, st):
            res = ConsoleResult(o, len(st.requests), len(st.fleet.registry), 500,
                                round(time.perf_counter() - t, 1))
            print(f"SYNTHETIC data: {res.records:,} request records over the last 600 s, "
                  f"{res.instances} instances, {res.events} events (built in "
                  f"{res.build_s} s); controller at {url}", flush=True)
            res.api = bench_api(url, st.token, o.tries)
            res.pages = bench_pages(url, state_dir, max(3, o.tries // 2))
            if not o.browser:
                res.browser_skipped = "--no-browser"
            elif not CHROMIUM.exists():
                res.browser_skipped = f"no {CHROMIUM}"
            else:
                res.browser_ms, res.screenshot = bench_browser(
                    url, state_dir, Path(tmp) / "logs", o.rounds)
    return res


def report(res: ConsoleResult) -> str:
    lines = [f"SYNTHETIC data: {res.records:,} request records over the last 600 s, "
             f"{res.instances} instances, {res.events} events (built in {res.build_s} s)",
             "", "API calls of the live cards over HTTP: wall ms p50 / p90, CPU ms p50, "
             "response size"]
    for window in WINDOWS:
        lines.append(f"  window {window:g} s")
        for a in res.api:
            if a.window_s == window or (a.window_s is None and window == WINDOWS[0]):
                lines.append(f"    {a.call:48s} {a.wall_ms_p50:8.1f} / {a.wall_ms_p90:8.1f} "
                             f"{a.cpu_ms_p50:8.1f}  {a.kb:8.1f} kB")
    lines += ["", "Page render with AppTest, window 5 min: wall ms p50 / max, CPU ms p50 "
              "(console + controller; caches cleared; no browser drawing)"]
    lines += [f"  {p.page:10s} {p.wall_ms_p50:8.1f} / {p.wall_ms_max:8.1f} {p.cpu_ms_p50:8.1f}"
              for p in res.pages]
    if res.browser_skipped:
        lines += ["", f"Chromium: skipped ({res.browser_skipped})"]
    else:
        lines += ["", "Chromium (ms, median / max of the visits): open the console, then go "
                  "to each page from the sidebar until its charts are drawn, round after round; "
                  "then 'refresh': live refresh paused, the window switched 5 <-> 15 min, until "
                  f"the page stops changing (none for {SETTLED_MS} ms)"]
        lines += [f"  {k:22s} {fmt(stats.median(v), '8.0f')} / {fmt(max(v), '8.0f')}"
                  for k, v in res.browser_ms.items()]
        lines.append(f"  screenshot of Pools: {res.screenshot}")
    return "\n".join(lines)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--records", type=int, help="request records (default 100000; quick 20000)")
    ap.add_argument("--tries", type=int, help="tries per API call (default 7; quick 3)")
    ap.add_argument("--no-browser", action="store_true", help="skip the Chromium part")
    ap.add_argument("--rounds", type=int, help="visits of each page in Chromium (default 5)")
    ap.add_argument("--quick", action="store_true", help="fewer records and tries")


def options_from(args: argparse.Namespace) -> Options:
    o = Options.defaults(args.quick)
    o.records = args.records or o.records
    o.tries = args.tries or o.tries
    o.browser = not args.no_browser
    o.rounds = args.rounds or o.rounds
    return o


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.console",
                                 description=__doc__.split("\n\n")[0])
    add_arguments(ap)
    ap.add_argument("--json", type=Path, default=ROOT / "bench-results" / "console.json")
    args = ap.parse_args(argv)
    try:
        with interrupt_on_signals():
            res = run_console(options_from(args))
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    print("\n" + report(res))
    write_json(args.json, res)
    print(f"results: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
