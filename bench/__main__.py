"""``python -m bench`` (``make bench``): every scenario in turn, then BENCHMARKS.md rewritten
from their results.

Runs, one after the other on an otherwise idle machine (each loads both cores):

1. ``bench.router``   router cost: pdctl vs vllm-router vs the client's own two hops,
                      engine-bound and router-bound
2. ``bench.lab``      the real CPU lab under guidellm: disaggregated vs colocated, and the
                      simulator's prediction of the same workload
3. ``bench.scale``    a 16P + 48D simulated 70B/H100 fleet at 1,000 requests/s
4. ``bench.console``  the console with 100k synthetic records and 120 instances
5. ``bench.ray_start`` 64 simulated instances started and stopped with the local and the Ray
                      launcher, and Ray's own CPU and memory (in a private network namespace:
                      root)
6. ``bench.planner``  the SLA planner in apply mode under a stepped load, and P/D against
                      colocated engines at equal accelerators

Each part's whole output goes to ``bench-results/<part>.log`` and its result (the scenario's
dataclass) to ``bench-results/<part>.json`` (git-ignored); its report, built from that result,
goes into BENCHMARKS.md with the machine, the commit and the run's date. A part that fails is
recorded as failed in BENCHMARKS.md and makes this command exit 1.

    .venv/bin/python -m bench [--only router lab scale console ray planner] [--quick]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from bench import console, lab, planner, ray_start, router, scale
from bench.fleet import interrupt_on_signals
from bench.report import ROOT, PartRun, benchmarks_md, write_json

RESULTS = ROOT / "bench-results"
DOC = ROOT / "BENCHMARKS.md"


def _router(quick: bool) -> tuple[Any, str, str | None]:
    res = router.run_router(router.Options.defaults(quick))
    return res, router.report(res), None


def _lab(quick: bool) -> tuple[Any, str, str | None]:
    o = lab.Options.defaults(quick)
    o.work = RESULTS / "lab-work"
    res = lab.run_lab(o)
    failed = [f"{name}: {s.error}" for name, s in res.setups.items() if s.error]
    return res, lab.report(res), "; ".join(failed) or None


def _scale(quick: bool) -> tuple[Any, str, str | None]:
    res = scale.run_scale(scale.Options.defaults(quick))
    return res, scale.report(res), scale.check(res)


def _console(quick: bool) -> tuple[Any, str, str | None]:
    res = console.run_console(console.Options.defaults(quick))
    return res, console.report(res), None


def _ray(quick: bool) -> tuple[Any, str, str | None]:
    res = ray_start.run_ray_start(ray_start.Options.defaults(quick))
    return res, ray_start.report(res), ray_start.check(res)


def _planner(quick: bool) -> tuple[Any, str, str | None]:
    res = planner.run_planner(planner.Options.defaults(quick))
    return res, planner.report(res), planner.check(res)


@dataclass(frozen=True)
class Part:
    name: str
    module: str
    title: str
    about: str
    execute: Callable[[bool], tuple[Any, str, str | None]]  # -> result, report, failure


PARTS = (
    Part("router", "bench.router", router.TITLE, router.ABOUT, _router),
    Part("lab", "bench.lab", lab.TITLE, lab.ABOUT, _lab),
    Part("scale", "bench.scale", scale.TITLE, scale.ABOUT, _scale),
    Part("console", "bench.console", console.TITLE, console.ABOUT, _console),
    Part("ray", "bench.ray_start", ray_start.TITLE, ray_start.ABOUT, _ray),
    Part("planner", "bench.planner", planner.TITLE, planner.ABOUT, _planner),
)


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


def run_part(number: int, part: Part, quick: bool) -> PartRun:
    """One part, its output echoed and logged; its result to JSON."""
    RESULTS.mkdir(exist_ok=True)
    log = RESULTS / f"{part.name}.log"
    print(f"\n===== {part.name}: python -m {part.module}{' --quick' if quick else ''}",
          flush=True)
    t0 = time.monotonic()
    with tee_output(log):
        try:
            result, text, failed = part.execute(quick)
        except Exception as exc:  # a failed part is reported; the others still run
            traceback.print_exc()
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
            return PartRun(number, part.name, part.title, part.about, part.module,
                           time.monotonic() - t0, tail, f"{type(exc).__name__}: {exc}"[:300])
        print("\n" + text, flush=True)
        write_json(RESULTS / f"{part.name}.json", result)
        print(f"\nresults: {RESULTS / f'{part.name}.json'}; output: {log}", flush=True)
    return PartRun(number, part.name, part.title, part.about, part.module, time.monotonic() - t0,
                   text, failed)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="+", choices=[p.name for p in PARTS],
                    help="run these parts only (BENCHMARKS.md then holds only them)")
    ap.add_argument("--quick", action="store_true", help="each part's smoke-test size")
    args = ap.parse_args(argv)
    started, load = dt.datetime.now(dt.UTC), os.getloadavg()
    runs: list[PartRun] = []
    try:
        with interrupt_on_signals():
            for number, part in enumerate(PARTS, 1):
                if not args.only or part.name in args.only:
                    runs.append(run_part(number, part, args.quick))
    except KeyboardInterrupt:
        print("\ninterrupted; every process started here has been stopped; BENCHMARKS.md "
              "left as it was", file=sys.stderr)
        return 130
    DOC.write_text(benchmarks_md(runs, started, load, args.quick) + "\n")
    failed = [r.name for r in runs if r.failed]
    verdict = f"failed: {', '.join(failed)}" if failed else "all parts finished"
    print(f"\nBENCHMARKS.md rewritten; {verdict}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
