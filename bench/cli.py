"""The benchmarks' one command line: ``python -m bench`` runs the suite (every scenario in
turn, then BENCHMARKS.md rewritten), ``python -m bench <scenario> [options]`` runs one
scenario alone; ``python -m bench.<module>`` (the scenarios' old modules) is the same as
``python -m bench <scenario>``.

Run alone, a scenario prints its report, writes its result to ``--json`` (default
``bench-results/<scenario>.json``) and exits 1 when its check finds a failure, 2 when it
could not run (a process that exited, something never ready, a missing peer) and 130 when
interrupted; everything it started is stopped in every case.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from bench.processes import FleetError, interrupt_on_signals
from bench.report import RESULTS_DIR, write_json
from bench.scenario import Scenario
from bench.scenarios import SCENARIOS
from bench.suite import run_suite

SUITE = [s for s in SCENARIOS if s.in_suite]


def _paragraphs(doc: str) -> tuple[str, str | None]:
    """A docstring's first paragraph (the description) and the rest (the epilog)."""
    first, _, rest = doc.strip("\n").partition("\n\n")
    return first, rest or None


def bench_parser() -> argparse.ArgumentParser:
    """The suite's options, and a sub-command per scenario with its own."""
    about, _ = _paragraphs(__doc__ or "")
    ap = argparse.ArgumentParser(
        prog="python -m bench", description=about,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="suite order: " + ", ".join(s.name for s in SUITE) + "; tools (not in the "
               "suite): " + ", ".join(s.name for s in SCENARIOS if not s.in_suite))
    ap.add_argument("--only", dest="suite_only", nargs="+", choices=[s.name for s in SUITE],
                    help="run these parts only (BENCHMARKS.md: their sections rewritten, the "
                         "others kept from the earlier run)")
    ap.add_argument("--quick", dest="suite_quick", action="store_true",
                    help="each part's smoke-test size")
    sub = ap.add_subparsers(dest="scenario", metavar="SCENARIO",
                            help="run one scenario alone (its --help for its options)")
    for s in SCENARIOS:
        description, epilog = _paragraphs(s.doc)
        p = sub.add_parser(s.name, help=s.title, description=description, epilog=epilog,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        s.add_options(p)
        p.add_argument("--json", type=Path, default=RESULTS_DIR / f"{s.name}.json",
                       help=f"the result as JSON (default: bench-results/{s.name}.json)")
    return ap


def run_alone(scenario: Scenario[Any, Any], args: argparse.Namespace) -> int:
    """One scenario from the command line: its report printed, its result to ``args.json``;
    the exit status."""
    try:
        with interrupt_on_signals():
            result = scenario.run_from(args)
    except FleetError as exc:
        print(f"{scenario.alias}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted; every process started here has been stopped", file=sys.stderr)
        return 130
    if result is None:
        return 0
    print("\n" + scenario.report(result))
    write_json(args.json, result)
    print(f"results: {args.json}")
    why = scenario.check(result)
    if why:
        print(f"ERROR: {why}", file=sys.stderr)
        return 1
    return 0


def run_command(argv: list[str] | None = None) -> int:
    """``python -m bench [...]``: the suite, or one scenario; the exit status."""
    args = bench_parser().parse_args(argv)
    if args.scenario is None:
        return run_suite(SUITE, args.suite_only, args.suite_quick)
    return run_alone(next(s for s in SCENARIOS if s.name == args.scenario), args)


def run_alias(name: str) -> int:
    """``python -m bench.<module> [options]``: ``python -m bench <name> [options]``."""
    return run_command([name, *sys.argv[1:]])
