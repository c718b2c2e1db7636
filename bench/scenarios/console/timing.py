"""The console scenario's server-side timings: the API calls behind the live cards over HTTP,
and each page rendered with Streamlit's AppTest (no browser)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import stats
from bench.report import ROOT
from bench.scenarios.console.model import API_WINDOWS, CONSOLE_PAGES, ApiTiming, PageTiming
from dashboard.client import ControllerClient
from dashboard.config import RECENT_LIMIT, step_for


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
    p50, p90 = stats.quantiles_or_nan(wall, (0.5, 0.9))
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


def time_api_calls(url: str, token: str, tries: int) -> list[ApiTiming]:
    c = ControllerClient(url, token, timeout_s=60)
    out: list[ApiTiming] = []
    try:
        for window in API_WINDOWS:
            for name, windowed, fn in card_calls(c, window):
                if not windowed and window != API_WINDOWS[0]:
                    continue
                p50, p90, cpu_ms, size = timed(fn, tries)
                out.append(ApiTiming(name, window if windowed else None, p50, p90, cpu_ms,
                                     size / 1e3))
    finally:
        c.close()
    return out


def time_pages(url: str, state_dir: Path, tries: int) -> list[PageTiming]:
    logging.disable(logging.WARNING)  # bare-mode caching notes, access lines
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    from dashboard.config import ConsoleConfig
    from dashboard.ui.session import CONFIG_KEY

    at = AppTest.from_file(str(ROOT / "dashboard" / "app.py"), default_timeout=120)
    at.session_state[CONFIG_KEY] = ConsoleConfig(url, state_dir)
    at.run()  # warm-up: imports
    out = []
    for page in CONSOLE_PAGES:
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
