"""The suite: every scenario ``python -m bench`` runs, in turn, then BENCHMARKS.md rewritten
from their results.

Each part's whole output goes to ``bench-results/<part>.log`` and its result (the scenario's
dataclass) to ``bench-results/<part>.json`` (git-ignored); its report, built from that result,
goes into BENCHMARKS.md with the machine, the commit and the run's date. A part that fails is
recorded as failed in BENCHMARKS.md and makes the suite exit 1.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from bench.processes import interrupt_on_signals
from bench.report import RESULTS_DIR, ROOT, machine_lines, write_json
from bench.scenario import Scenario

DOC = ROOT / "BENCHMARKS.md"


class _Tee:
    """A text stream writing to two."""

    def __init__(self, a: TextIO, b: TextIO) -> None:
        self.a, self.b = a, b

    def write(self, s: str) -> int:
        self.a.write(s)
        self.b.write(s)
        return len(s)

    def flush(self) -> None:
        self.a.flush()
        self.b.flush()

    def isatty(self) -> bool:
        return False


@contextmanager
def tee_output(log: Path) -> Iterator[None]:
    """What this process prints (stdout and stderr) also goes to ``log``."""
    with open(log, "w", buffering=1) as f:
        out, err = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = _Tee(out, f), _Tee(err, f)
        try:
            yield
        finally:
            sys.stdout, sys.stderr = out, err


@dataclass
class PartRun:
    """One part of ``python -m bench`` as it ran: its report text, or why it failed."""

    number: int  # the part's place in ``python -m bench``'s order
    name: str
    title: str
    about: str
    module: str
    seconds: float
    text: str  # the report, or the end of the output of a failed part
    failed: str | None = None


def run_part(number: int, part: Scenario[Any, Any], quick: bool) -> PartRun:
    """One part, its output echoed and logged; its result to JSON."""
    RESULTS_DIR.mkdir(exist_ok=True)
    log = RESULTS_DIR / f"{part.name}.log"
    print(f"\n===== {part.name}: python -m {part.alias}{' --quick' if quick else ''}",
          flush=True)
    t0 = time.monotonic()
    with tee_output(log):
        try:
            result = part.run(part.defaults(quick))
            text, failed = part.report(result), part.check(result)
        except Exception as exc:  # a failed part is reported; the others still run
            traceback.print_exc()
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
            return PartRun(number, part.name, part.title, part.about, part.alias,
                           time.monotonic() - t0, tail, f"{type(exc).__name__}: {exc}"[:300])
        print("\n" + text, flush=True)
        write_json(RESULTS_DIR / f"{part.name}.json", result)
        print(f"\nresults: {RESULTS_DIR / f'{part.name}.json'}; output: {log}", flush=True)
    return PartRun(number, part.name, part.title, part.about, part.alias,
                   time.monotonic() - t0, text, failed)


def commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                         capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                           capture_output=True, text=True).stdout.strip()
    return out.stdout.strip() + (" (with uncommitted changes)" if dirty else "")


def earlier_sections(text: str) -> tuple[str | None, dict[str, list[str]]]:
    """An earlier BENCHMARKS.md's run line and its sections by part title (each section's
    lines after its ``## N. title`` heading)."""
    run_line: str | None = None
    title: str | None = None
    sections: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line.startswith("- Run: ") and title is None and run_line is None:
            run_line = line.removeprefix("- Run: ")
        elif line.startswith("## ") and ". " in line:
            title = line.split(". ", 1)[1]
            sections[title] = []
        elif title is not None:
            sections[title].append(line)
    return run_line, sections


def benchmarks_md(parts: list[PartRun], started: dt.datetime,
                  load: tuple[float, float, float], quick: bool,
                  kept: dict[str, tuple[int, list[str]]] | None = None,
                  kept_from: str | None = None) -> str:
    """BENCHMARKS.md, with a section per part that ran; ``kept``: the sections of parts that
    did not run this time (``--only``), by title with their place in the order, as an earlier
    run (``kept_from``) wrote them."""
    kept = kept or {}
    out = [
        "# Benchmarks",
        "",
        "Written by `make bench` (`python -m bench`); do not edit by hand -- rerun it.",
        "",
        f"- Run: {started:%Y-%m-%d %H:%M} UTC, commit {commit()}"
        + (" (`--quick`: smoke-test sizes, not figures to quote)" if quick else "")
        + (f"; parts {', '.join(str(p.number) for p in parts)} only: the others are kept "
           f"from the run of {kept_from}" if kept else ""),
        *(f"- Machine: {m}" for m in machine_lines()),
        f"- Load average when it started: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}",
        "- Reproduce: `make bench` (creates `.bench/venv-router` with vllm-router 0.1.17 and "
        "`.bench/venv-guidellm` with guidellm 0.8.1 on the CPU build of torch, writes the lab "
        "model, runs every part, rewrites this file). Whole output per part in "
        "`bench-results/<part>.log`, raw results in `bench-results/<part>.json`.",
        "- Two cores run the client, the router and every engine: latency and rate move with "
        "anything else on the machine; ratios come from runs interleaved in one session, and "
        "CPU time per request is the steadiest figure.",
        "- Every percentile and median is the controller's definition (numpy "
        "`inverted_cdf`, nearest rank; `pdctl_api/stats.py`); quantiles from Prometheus "
        "histograms are Prometheus's `histogram_quantile` estimate.",
        "",
    ]
    sections: list[tuple[int, list[str]]] = [(n, [f"## {n}. {t}", *lines])
                                             for t, (n, lines) in kept.items()]
    for part in parts:
        verdict = "finished" if part.failed is None else f"FAILED ({part.failed})"
        sections.append((part.number, [
            f"## {part.number}. {part.title}", "", part.about, "",
            f"`python -m {part.module}`: {verdict} in {part.seconds / 60:.1f} min"
            + (f" (run {started:%Y-%m-%d %H:%M} UTC)." if kept else "."), "",
            "```text", part.text.strip(), "```", ""]))
    for _, lines in sorted(sections, key=lambda x: x[0]):
        out += lines
    return "\n".join(out).rstrip("\n") + "\n"


def run_suite(parts: list[Scenario[Any, Any]], only: list[str] | None, quick: bool) -> int:
    """Every part of ``parts`` (or those named in ``only``), then BENCHMARKS.md; the exit
    status: 1 when a part failed, 130 when interrupted (BENCHMARKS.md left as it was)."""
    started, load = dt.datetime.now(dt.UTC), os.getloadavg()
    runs: list[PartRun] = []
    try:
        with interrupt_on_signals():
            for number, part in enumerate(parts, 1):
                if not only or part.name in only:
                    runs.append(run_part(number, part, quick))
    except KeyboardInterrupt:
        print("\ninterrupted; every process started here has been stopped; BENCHMARKS.md "
              "left as it was", file=sys.stderr)
        return 130
    kept: dict[str, tuple[int, list[str]]] = {}
    kept_from = None
    if only and DOC.exists():  # the parts that did not run keep their sections
        kept_from, earlier = earlier_sections(DOC.read_text())
        ran = {r.title for r in runs}
        kept = {p.title: (n, earlier[p.title]) for n, p in enumerate(parts, 1)
                if p.title not in ran and p.title in earlier}
    DOC.write_text(benchmarks_md(runs, started, load, quick, kept, kept_from))
    failed = [r.name for r in runs if r.failed]
    verdict = f"failed: {', '.join(failed)}" if failed else "all parts finished"
    print(f"\nBENCHMARKS.md rewritten; {verdict}")
    return 1 if failed else 0
