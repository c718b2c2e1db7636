"""How fast the console refreshes with 100k recorded requests and 120 instances.

The records and instances are SYNTHETIC: the controller app is built in-process (no reconcile
loop, no engines), its RequestLog is filled with 100,000 generated RequestRecords spread over
the last 10 minutes (about 167 requests/s), its cluster with 120 ready Instance objects
(40 prefill x TP4, 80 decode x TP2) and its audit log with 500 events; it is served by uvicorn
in a thread. Then:

1. the API calls each live card makes are timed over HTTP (median and p90 of several tries)
   for several windows: 60 s (~10k records), 300 s (~50k) and 900 s (all 100k);
2. each page is rendered with Streamlit's AppTest against that server (script run, API calls,
   DataFrames and chart specs; the browser's drawing is not included), caches cleared first;
3. with ``--browser`` (needs /usr/bin/chromium): the console is started with
   ``streamlit_argv`` and each page is loaded in Chromium until its charts are drawn, and the
   Pools page with 120 instances is saved to ``artifacts/screenshots/pools-120.png``.

Run: ``.venv/bin/python scripts/bench_console.py [--browser] [--records N]``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import uvicorn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from controller import profiles  # noqa: E402
from controller.api.app import create_app  # noqa: E402
from controller.api.state import AppState  # noqa: E402
from controller.config import Settings  # noqa: E402
from controller.launchers.base import Launched, Launcher, LaunchSpec  # noqa: E402
from controller.models import (  # noqa: E402
    Instance,
    InstanceState,
    RequestPath,
    RequestRecord,
    Role,
)
from controller.reconciler import PoolTarget  # noqa: E402
from dashboard.client import ControllerClient  # noqa: E402
from dashboard.config import RECENT_LIMIT, step_for  # noqa: E402

PAGES = ["overview", "transfer", "pools", "controls", "advisor", "events"]
PREFILL, DECODE = 40, 80
CHARTS = {"overview": 5, "transfer": 3, "pools": 1, "controls": 0, "advisor": 1, "events": 0}


class NoLauncher(Launcher):
    """Starts nothing: the bench's instances are synthetic."""

    name = "bench"

    async def start(self, spec: LaunchSpec) -> Launched:
        raise RuntimeError("the bench starts no instances")

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
            kv_bytes=profiles.kv_bytes(m, prompt, 16) if disagg else 0, **parts)


def fill(st: AppState, records: int, rng: random.Random) -> None:
    for rec in synthetic_records(records, 600.0, rng):
        st.requests.add(rec)
    n = 0
    for role, count, tp in ((Role.PREFILL, PREFILL, 4), (Role.DECODE, DECODE, 2)):
        for _ in range(count):
            n += 1
            inst = Instance(id=f"{role.value}-{n}", role=role, tp=tp,
                            url=f"http://10.0.{n // 8}.{n % 8}:8000", state=InstanceState.READY,
                            created_at=time.monotonic(), ready_at=time.monotonic(),
                            inflight=rng.randint(0, 8), running=float(rng.randint(0, 64)),
                            waiting=float(rng.randint(0, 6)), kv_usage=rng.random())
            st.cluster.instances[inst.id] = inst
    st.cluster.targets = {Role.PREFILL: PoolTarget(PREFILL, 4), Role.DECODE: PoolTarget(DECODE, 2)}
    st.cluster._refresh_membership()  # bench only: the loop that normally does this is off
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


def timed(fn: Callable[[], Any], tries: int) -> tuple[float, float, float, int]:
    """Median and p90 wall milliseconds, median CPU milliseconds of this process (server and
    client both run here, so CPU time is what the call costs, whatever else the machine is
    doing), and the response size in bytes."""
    wall, cpu, size = [], [], 0
    for _ in range(tries):
        t, c = time.perf_counter(), time.process_time()
        size = len(str(fn()))
        wall.append((time.perf_counter() - t) * 1e3)
        cpu.append((time.process_time() - c) * 1e3)
    wall.sort()
    return (statistics.median(wall), wall[min(len(wall) - 1, int(0.9 * len(wall)))],
            statistics.median(cpu), size)


def card_calls(c: ControllerClient, window: float) -> dict[str, Callable[[], Any]]:
    return {
        "routing (banner, every page)": c.routing,
        f"stats?window_s={window:g}": lambda: c.stats(window),
        f"timeseries?window_s={window:g}&step_s={step_for(window):g}":
            lambda: c.timeseries(window, step_for(window)),
        f"requests?limit={RECENT_LIMIT} (Overview)": lambda: c.requests(RECENT_LIMIT),
        "requests?limit=500 (Transfer)": lambda: c.requests(500),
        "cluster (120 instances)": c.cluster,
        "advisor (600 s, every 10 s)": c.advisor,
        "events?limit=100": lambda: c.events(100),
    }


def bench_api(url: str, token: str, tries: int) -> None:
    c = ControllerClient(url, token, timeout_s=60)
    print("\nAPI calls of the live cards over HTTP: wall ms median / p90, CPU ms median, "
          "response size")
    seen = set()
    for window in (60.0, 300.0, 900.0):
        print(f"  window {window:g} s")
        for name, fn in card_calls(c, window).items():
            if name in seen:
                continue
            if "window" not in name:
                seen.add(name)
            med, p90, cpu, size = timed(fn, tries)
            print(f"    {name:48s} {med:8.1f} / {p90:8.1f} {cpu:8.1f}  {size / 1e3:8.1f} kB")
    c.close()


def bench_pages(url: str, state_dir: Path, tries: int) -> None:
    logging.disable(logging.WARNING)  # bare-mode caching notes, access lines
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    from dashboard import ui
    from dashboard.config import ConsoleConfig

    print("\nPage render with AppTest, window 5 min: wall ms median / max, CPU ms median "
          "(console + controller; caches cleared; no browser drawing)")
    at = AppTest.from_file(str(ROOT / "dashboard" / "app.py"), default_timeout=120)
    at.session_state[ui.CONFIG_KEY] = ConsoleConfig(url, state_dir)
    at.run()  # warm-up: imports
    for page in PAGES:
        at.switch_page(f"views/{page}.py")
        times, cpu = [], []
        for _ in range(tries):
            st.cache_data.clear()
            t, c = time.perf_counter(), time.process_time()
            at.run()
            times.append((time.perf_counter() - t) * 1e3)
            cpu.append((time.process_time() - c) * 1e3)
            assert not at.exception, [e.value for e in at.exception]
        print(f"  {page:10s} {statistics.median(times):8.1f} / {max(times):8.1f} "
              f"{statistics.median(cpu):8.1f}")


def bench_browser(url: str, state_dir: Path) -> None:
    from playwright.sync_api import sync_playwright

    from dashboard.launch import console_env, streamlit_argv

    port = 18000 + os.getpid() % 1000
    env = {**os.environ, **console_env(url, state_dir)}
    proc = subprocess.Popen(streamlit_argv(url, state_dir, port), env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    shots = ROOT / "artifacts" / "screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    try:
        for _ in range(300):
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{base}/_stcore/health", timeout=1).status_code == 200:
                    break
            time.sleep(0.1)
        print("\nChromium (ms): open the console, then go to each page from the sidebar "
              "until its charts are drawn")
        with sync_playwright() as pw, tempfile.TemporaryDirectory() as profile:
            ctx = pw.chromium.launch_persistent_context(
                profile, executable_path="/usr/bin/chromium", headless=True,
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
            print(f"  {'first load':10s} {(time.perf_counter() - t) * 1e3:8.0f}  (overview)")
            for name in [*PAGES[1:], PAGES[0]]:
                t = time.perf_counter()
                page.get_by_role("link", name=name.capitalize()).click()
                page.locator("h1", has_text=name.capitalize()).wait_for(timeout=60_000)
                if CHARTS[name]:
                    page.locator(drawn).nth(CHARTS[name] - 1).wait_for(timeout=60_000)
                else:
                    page.locator('[data-testid="stDataFrame"], [data-testid="stForm"]'
                                 ).first.wait_for(timeout=60_000)
                print(f"  {name:10s} {(time.perf_counter() - t) * 1e3:8.0f}")
                if name == "pools":
                    page.wait_for_timeout(1000)
                    page.screenshot(path=shots / "pools-120.png", full_page=True)
            ctx.close()
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=100_000)
    p.add_argument("--tries", type=int, default=7)
    p.add_argument("--browser", action="store_true", help="also load each page in Chromium")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        state_dir = Path(tmp) / "state"
        t = time.perf_counter()
        with serve(state_dir, args.records) as (url, st):
            print(f"SYNTHETIC data: {len(st.requests):,} request records over the last 600 s, "
                  f"{len(st.cluster.instances)} instances, 500 events "
                  f"(built in {time.perf_counter() - t:.1f} s); controller at {url}")
            bench_api(url, st.token, args.tries)
            bench_pages(url, state_dir, max(3, args.tries // 2))
            if args.browser:
                bench_browser(url, state_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
