"""``pdctl``: the command line. Server verbs (lab, controller, engine-sim) and thin clients of
the REST API (status, scale, tp, kv-mode, route)."""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
from collections.abc import Callable

from controller.cli import clients, console, fault, make_model, plan, profile, replay, serve

EPILOG = """\
examples:
  pdctl lab --backend sim                  simulated 1 prefill + 1 decode fleet on :8080
  pdctl status                             pools, instances and load of the running controller
  pdctl scale decode 3 --wait              resize the decode pool and wait until it converges
  pdctl tp decode 4                        rolling TP change of the decode pool
  pdctl kv-mode prefill push               rolling change to KV push (NixlPushConnector)
  pdctl route disagg_min_prompt_tokens=1024 decode_policy=round_robin
  pdctl profile --backend sim --model llama-3-70b --hardware h100-sxm --tp 4
                                           measure an engine for the SLA planner
  pdctl replay trace.jsonl --limit 200 --time-scale 0.1
                                           replay a Mooncake/Azure trace, summary per class
  pdctl plan trace.jsonl --model llama-3.1-70b --accelerator h100-sxm --budget 32
                                           search layouts for a trace (simulated), best first
  pdctl fault kill-prefill --reference     rehearse a fault under load, judge what clients saw
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pdctl", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
        description="Control plane for prefill/decode-disaggregated LLM serving.")
    p.add_argument("--version", action="version", version=f"pdctl {package_version()}")
    sub = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    serve.add_lab_parser(sub)
    serve.add_controller_parser(sub)
    serve.add_engine_sim_parser(sub)
    make_model.add_make_model_parser(sub)
    profile.add_profile_parser(sub)
    console.add_dashboard_parser(sub)
    clients.add_parsers(sub)
    replay.add_replay_parser(sub)
    plan.add_plan_parser(sub)
    fault.add_fault_parser(sub)
    return p


def package_version() -> str:
    """The installed pdctl's version (``pyproject.toml``); "unknown" when run uninstalled."""
    try:
        return importlib.metadata.version("pdctl")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    run: Callable[[argparse.Namespace], int] = args.run
    try:
        return run(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
