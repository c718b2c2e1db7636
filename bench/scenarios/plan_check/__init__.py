"""Plan check: ``pdctl plan``'s recommended layout and the seed's rule-of-thumb layout, both
predicted discrete-event and both measured on the live simulated fleet with ``pdctl replay``.

The rule of thumb (the domain notes): 1 prefill : 3 decode accelerators, prefill TP4, decode
TP2, at the same budget. The recommendation: the best layout of the search within the budget.
Each is replayed on a fresh simulated fleet behind a real ``pdctl controller`` in real time;
the replay's own goodput (TTFT and own gap p99 within the targets, client-side) is compared
with the prediction.

    .venv/bin/python -m bench plan-check               # 5 minutes of trace, budget 16
    .venv/bin/python -m bench plan-check --minutes 2
"""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.scenario import Scenario
from bench.scenarios.whatif.model import TRACE
from bench.scenarios.whatif.run import replay_live
from controller.cli.commands import build_parser
from controller.cli.plan import plan_inputs
from controller.whatif.layout import Layout
from controller.whatif.run import simulate
from controller.whatif.search import layout_result, search

CHECK_MODEL, CHECK_ACCELERATOR, CHECK_CONTEXT = "llama-3.1-70b", "h100-sxm", 8192


@dataclass
class CheckOptions:
    minutes: float = 5.0
    budget: int = 16


@dataclass
class Checked:
    name: str
    layout: dict[str, Any]
    label: str
    predicted_share: float
    predicted_per_s: float
    measured_share: float = float("nan")
    measured_per_s: float = float("nan")
    failed: int = 0
    error: str | None = None


@dataclass
class CheckResult:
    options: CheckOptions
    requests: int = 0
    runs: list[Checked] = field(default_factory=list)


def _live(o: CheckOptions, lay: Layout, args: argparse.Namespace, workdir: Path,
          run: Checked) -> None:
    config = {"backend": "sim",
              "model": {"name": CHECK_MODEL, "max_model_len": CHECK_CONTEXT},
              "hardware": {"accelerator": CHECK_ACCELERATOR, "nodes": 8},
              "pools": {"prefill": {"size": lay.prefill_count, "tp": lay.prefill_tp},
                        "decode": {"size": lay.decode_count, "tp": lay.decode_tp}},
              "routing": {"disagg_policy": lay.disagg_policy}}
    replay_args = [str(TRACE), "--limit", str(args.limit_requests), "--ttft-ms",
                   f"{args.ttft_ms:g}", "--gap-ms", f"{args.gap_ms:g}"]
    result, _, _ = replay_live(workdir, config, replay_args, o.minutes * 60 + 600,
                               args.limit_requests)
    s = result["summary"]["all"]
    run.measured_share = float(s["goodput"]["share"] or 0.0)
    run.measured_per_s = float(s["goodput"]["per_s"] or 0.0)
    run.failed = int(s["failed"])


def run_check(o: CheckOptions) -> CheckResult:
    args = build_parser().parse_args([
        "plan", str(TRACE), "--model", CHECK_MODEL, "--accelerator", CHECK_ACCELERATOR,
        "--budget", str(o.budget), "--tp", "2,4,8", "--context", str(CHECK_CONTEXT),
        "--minutes", f"{o.minutes:g}"])
    requests, spec, space, _ = plan_inputs(args)
    args.limit_requests = len(requests)
    res = CheckResult(o, len(requests))
    best = next((c for c in search(requests, spec, space) if c.meets), None)
    rule_p = max(1, o.budget // 4 // 4)
    rule = Layout((o.budget - 4 * rule_p) // 2, 2, rule_p, 4)
    chosen = [("rule of thumb", rule)] + ([("pdctl plan", best.layout)] if best else [])
    for name, lay in chosen:
        pred = layout_result(simulate(requests, lay, spec), space.floor)
        run = Checked(name, lay.as_dict(), lay.label, pred.attained, pred.goodput_per_s)
        print(f"  {name}: {lay.label}: predicted {pred.attained:.1%} within targets; "
              "replaying live", flush=True)
        with tempfile.TemporaryDirectory(prefix="bench-plan-check-") as tmp:
            try:
                _live(o, lay, args, Path(tmp), run)
            except Exception as exc:  # reported, and the other layout still runs
                run.error = f"{type(exc).__name__}: {exc}"[:400]
        res.runs.append(run)
    return res


def check_report(r: CheckResult) -> str:
    lines = [f"{r.requests} requests (the Mooncake trace's first {r.options.minutes:g} min), "
             "Llama-3.1-70B on H100, 8k context (longer prompts cut as pdctl replay cuts "
             f"them), budget {r.options.budget} accelerators; "
             "TTFT <= 2,000 ms and own gap p99 <= 60 ms.", "",
             "| layout | | predicted within | measured within | predicted good/s | "
             "measured good/s | failed |", "|---|---|---:|---:|---:|---:|---:|"]
    for c in r.runs:
        lines.append(f"| {c.name} | {c.label} | {c.predicted_share:.1%} | "
                     f"{c.measured_share:.1%} | {c.predicted_per_s:.2f} | "
                     f"{c.measured_per_s:.2f} | {c.failed} |"
                     + (f" error: {c.error}" if c.error else ""))
    return "\n".join(lines)


class PlanCheckTool(Scenario[CheckOptions, CheckResult], name="plan-check",
                    alias="bench.plan_check", in_suite=False):
    """Plan check: the recommended layout and the rule of thumb, predicted and measured

    pdctl plan's best layout and the seed's rule-of-thumb layout (1 prefill : 3 decode
    accelerators, prefill TP4, decode TP2) at one budget, each predicted by the discrete-event
    run and measured by replaying the same trace slice on the live simulated fleet."""

    def add_options(self, ap: argparse.ArgumentParser) -> None:
        ap.add_argument("--minutes", type=float, default=5.0)
        ap.add_argument("--budget", type=int, default=16)

    def options(self, args: argparse.Namespace) -> CheckOptions:
        return CheckOptions(args.minutes, args.budget)

    def defaults(self, quick: bool) -> CheckOptions:
        return CheckOptions(minutes=2.0) if quick else CheckOptions()

    def run(self, options: CheckOptions) -> CheckResult:
        return run_check(options)

    def report(self, result: CheckResult) -> str:
        return check_report(result)

    def check(self, result: CheckResult) -> str | None:
        errors = [f"{c.name}: {c.error}" for c in result.runs if c.error]
        return "; ".join(errors) or None
