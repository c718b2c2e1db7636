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
   is started with ``streamlit_argv`` (a ``bench.processes`` process) and each page is loaded in
   Chromium until its charts are drawn, ``--rounds`` times in turn (median and max), and the
   Pools page with 120 instances is saved to ``artifacts/screenshots/pools-120.png``; then a
   refresh in place of the Overview, Transfer and Pools pages (live refresh paused, the
   window switched between 5 and 15 min: every card refetched and redrawn) until the page
   stops changing.

    .venv/bin/python -m bench console [--quick] [--no-browser] [--records N] [--tries N]
        [--rounds N]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from bench.scenario import Scenario
from bench.scenarios.console.browser import CHROMIUM, time_browser
from bench.scenarios.console.model import ConsoleOptions, ConsoleResult
from bench.scenarios.console.synthetic import serve_synthetic_controller
from bench.scenarios.console.text import console_report
from bench.scenarios.console.timing import time_api_calls, time_pages


class ConsoleScenario(Scenario[ConsoleOptions, ConsoleResult],
                      name="console", alias="bench.console"):
    """Console: 100k synthetic records, 120 instances

    The controller app in-process with SYNTHETIC state (100,000 request records over the last
    10 minutes, 40 prefill + 80 decode ready instances, 500 audit events): the API calls behind
    the console's live cards over HTTP, each page rendered with Streamlit's AppTest, and each
    page loaded in Chromium until its charts are drawn."""

    def add_options(self, ap: argparse.ArgumentParser) -> None:
        ap.add_argument("--records", type=int,
                        help="request records (default 100000; quick 20000)")
        ap.add_argument("--tries", type=int, help="tries per API call (default 7; quick 3)")
        ap.add_argument("--no-browser", action="store_true", help="skip the Chromium part")
        ap.add_argument("--rounds", type=int,
                        help="visits of each page in Chromium (default 5)")
        ap.add_argument("--quick", action="store_true", help="fewer records and tries")

    def options(self, args: argparse.Namespace) -> ConsoleOptions:
        o = ConsoleOptions.defaults(args.quick)
        o.records = args.records or o.records
        o.tries = args.tries or o.tries
        o.browser = not args.no_browser
        o.rounds = args.rounds or o.rounds
        return o

    def defaults(self, quick: bool) -> ConsoleOptions:
        return ConsoleOptions.defaults(quick)

    def run(self, options: ConsoleOptions) -> ConsoleResult:
        o = options
        with tempfile.TemporaryDirectory(prefix="pdctl-bench-console-") as tmp:
            state_dir = Path(tmp) / "state"
            t = time.perf_counter()
            with serve_synthetic_controller(state_dir, o.records) as (url, st):
                res = ConsoleResult(o, len(st.requests), len(st.fleet.registry), 500,
                                    round(time.perf_counter() - t, 1))
                print(f"SYNTHETIC data: {res.records:,} request records over the last 600 s, "
                      f"{res.instances} instances, {res.events} events (built in "
                      f"{res.build_s} s); controller at {url}", flush=True)
                res.api = time_api_calls(url, st.token, o.tries)
                res.pages = time_pages(url, state_dir, max(3, o.tries // 2))
                if not o.browser:
                    res.browser_skipped = "--no-browser"
                elif not CHROMIUM.exists():
                    res.browser_skipped = f"no {CHROMIUM}"
                else:
                    res.browser_ms, res.screenshot = time_browser(
                        url, state_dir, Path(tmp) / "logs", o.rounds)
        return res

    def report(self, result: ConsoleResult) -> str:
        return console_report(result)
