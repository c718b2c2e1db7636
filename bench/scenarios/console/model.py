"""The console scenario's options, sizes and results: API call timings, page renders, the
browser's page loads."""

from __future__ import annotations

from dataclasses import dataclass, field

CONSOLE_PAGES = ["overview", "transfer", "pools", "controls", "advisor", "events"]
SYNTHETIC_PREFILL, SYNTHETIC_DECODE = 40, 80
API_WINDOWS = (60.0, 300.0, 900.0)
SETTLED_MS = 800  # no change to the page for this long: the refresh is drawn


@dataclass
class ConsoleOptions:
    records: int = 100_000
    tries: int = 7
    browser: bool = True  # when Chromium is installed
    rounds: int = 5  # visits of each page in Chromium

    @staticmethod
    def defaults(quick: bool) -> ConsoleOptions:
        return ConsoleOptions(records=20_000, tries=3, rounds=2) if quick else ConsoleOptions()


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
    options: ConsoleOptions
    records: int
    instances: int
    events: int
    build_s: float
    api: list[ApiTiming] = field(default_factory=list)
    pages: list[PageTiming] = field(default_factory=list)
    browser_ms: dict[str, list[float]] = field(default_factory=dict)  # page -> each visit
    browser_skipped: str | None = None
    screenshot: str | None = None
