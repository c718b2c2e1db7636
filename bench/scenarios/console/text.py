"""The console scenario's report: API calls per window, page renders, Chromium's loads."""

from __future__ import annotations

from bench import stats
from bench.report import fmt
from bench.scenarios.console.model import API_WINDOWS, SETTLED_MS, ConsoleResult


def console_report(res: ConsoleResult) -> str:
    lines = [f"SYNTHETIC data: {res.records:,} request records over the last 600 s, "
             f"{res.instances} instances, {res.events} events (built in {res.build_s} s)",
             "", "API calls of the live cards over HTTP: wall ms p50 / p90, CPU ms p50, "
             "response size"]
    for window in API_WINDOWS:
        lines.append(f"  window {window:g} s")
        for a in res.api:
            if a.window_s == window or (a.window_s is None and window == API_WINDOWS[0]):
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
