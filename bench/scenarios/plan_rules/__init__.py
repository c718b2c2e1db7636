"""Plan rules: the seed's rules of thumb measured with ``pdctl plan``'s search -- per model
size and prompt-length class of the Mooncake trace, colocate or disaggregate, the best P:D
accelerator ratio and per-phase TP, and the goodput per accelerator gained over the best
colocated layout.

Each cell is one layout search (``controller.whatif.search``) on the trace's requests of that
prompt class within the first ``--minutes`` (at their own times), TTFT <= 2 s and own gap
p99 <= 60 ms for 90 % of requests (405B on one H200 node: TTFT <= 10 s), within the model's
accelerator budget.

    .venv/bin/python -m bench plan-rules                # every cell (tens of minutes)
    .venv/bin/python -m bench plan-rules --quick        # 8B only, 3 minutes of trace
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass, field
from typing import Any

from bench.scenario import Scenario
from bench.scenarios.whatif.model import TRACE
from controller.cli.commands import build_parser
from controller.cli.plan import plan_inputs
from controller.whatif.search import LayoutResult, search

# (model, accelerator, budget, TPs, context, TTFT target ms): 405B on one H200 node (TP8)
# computes a 10k-token prompt in about 2.5 s, so it gets a 10 s target.
RULE_MODELS: tuple[tuple[str, str, int, str, int, float], ...] = (
    ("llama-3.1-8b", "h100-sxm", 16, "1,2", 32768, 2000.0),
    ("llama-3.1-70b", "h100-sxm", 32, "2,4,8", 32768, 2000.0),
    ("llama-3.1-405b", "h200", 64, "8", 32768, 10000.0),
)
PROMPT_CLASSES: tuple[tuple[str, str], ...] = (("< 1k", "0-1024"), ("4k-10k", "4096-10240"),
                                        ("> 10k", "10240-"))


@dataclass
class RulesOptions:
    minutes: float = 10.0
    models: tuple[str, ...] = tuple(m[0] for m in RULE_MODELS)

    @classmethod
    def defaults(cls, quick: bool) -> RulesOptions:
        return cls(minutes=3.0, models=("llama-3.1-8b",)) if quick else cls()


@dataclass
class RuleCell:
    model: str
    prompts: str
    requests: int = 0
    runs: int = 0
    wall_s: float = 0.0
    best: dict[str, Any] | None = None
    best_colocated: dict[str, Any] | None = None
    best_disaggregated: dict[str, Any] | None = None

    @property
    def gain(self) -> float:
        """Goodput per accelerator of the best layout over the best colocated one."""
        if self.best is None or self.best_colocated is None:
            return math.nan
        return (self.best["goodput_per_accelerator"]
                / self.best_colocated["goodput_per_accelerator"])


@dataclass
class RulesResult:
    options: RulesOptions
    cells: list[RuleCell] = field(default_factory=list)


def _first(cands: list[LayoutResult], disaggregated: bool | None) -> dict[str, Any] | None:
    for c in cands:
        if c.meets and (disaggregated is None or c.layout.disaggregated == disaggregated):
            return c.as_dict()
    return None


def run_rules(o: RulesOptions) -> RulesResult:
    res = RulesResult(o)
    for model, acc, budget, tps, context, ttft_ms in RULE_MODELS:
        if model not in o.models:
            continue
        for name, prompts in PROMPT_CLASSES:
            args = build_parser().parse_args([
                "plan", str(TRACE), "--model", model, "--accelerator", acc, "--budget",
                str(budget), "--tp", tps, "--context", str(context), "--minutes",
                f"{o.minutes:g}", f"--prompts={prompts}", "--ttft-ms", f"{ttft_ms:g}"])
            requests, spec, space, _ = plan_inputs(args)
            started = time.perf_counter()
            cands = search(requests, spec, space)
            cell = RuleCell(model, name, len(requests), len(cands),
                        time.perf_counter() - started, _first(cands, None),
                        _first(cands, False), _first(cands, True))
            print(f"  {model} {name}: {cell.requests} requests, {cell.runs} layouts, "
                  f"{cell.wall_s:.0f} s; best "
                  f"{cell.best['label'] if cell.best else 'none meets'}", flush=True)
            res.cells.append(cell)
    return res


def _layout(d: dict[str, Any] | None) -> str:
    if d is None:
        return "none meets"
    return f"{d['label']} ({d['layout']['accelerators']} acc, {d['attained']:.0%})"


def _ratio(d: dict[str, Any] | None) -> str:
    if d is None or d["layout"]["prefill"]["count"] == 0:
        return "-"
    lay = d["layout"]
    p = lay["prefill"]["count"] * lay["prefill"]["tp"]
    dd = lay["decode"]["count"] * lay["decode"]["tp"]
    return f"{p}:{dd}"


def rules_report(r: RulesResult) -> str:
    lines = [
        f"Each cell: pdctl plan's search on the Mooncake trace's first {r.options.minutes:g} "
        "min, requests of that prompt class, 32k context; TTFT <= 2,000 ms (405B: 10,000 ms) "
        "and own gap p99 <= 60 ms for 90 % of requests; budget 16 (8B), 32 (70B), 64 (405B) "
        "accelerators.", "",
        "| model | prompts | requests | verdict | best layout | P:D accelerators | "
        "best colocated | gain |",
        "|---|---|---:|---|---|---:|---|---:|"]
    for c in r.cells:
        verdict = ("-" if c.best is None else "disaggregate"
                   if c.best["layout"]["prefill"]["count"] else "colocate")
        gain = "-" if math.isnan(c.gain) else f"{c.gain:.2f}x"
        if c.best is not None and c.best_colocated is None:
            gain = "colocated never meets"
        lines.append(f"| {c.model} | {c.prompts} | {c.requests} | {verdict} | "
                     f"{_layout(c.best)} | {_ratio(c.best)} | {_layout(c.best_colocated)} | "
                     f"{gain} |")
    return "\n".join(lines)


class PlanRulesTool(Scenario[RulesOptions, RulesResult], name="plan-rules",
                    alias="bench.plan_rules", in_suite=False):
    """Plan rules: colocate or disaggregate, by model size and prompt length, measured

    pdctl plan's layout search per model (8B, 70B on H100; 405B on H200) and prompt-length
    class of the Mooncake trace: the best layout, its P:D accelerator ratio and TPs, and its
    goodput per accelerator over the best colocated layout."""

    def add_options(self, ap: argparse.ArgumentParser) -> None:
        ap.add_argument("--minutes", type=float, help="minutes of trace (default 10)")
        ap.add_argument("--quick", action="store_true", help="8B only, 3 minutes")

    def options(self, args: argparse.Namespace) -> RulesOptions:
        o = RulesOptions.defaults(args.quick)
        if args.minutes is not None:
            o.minutes = args.minutes
        return o

    def defaults(self, quick: bool) -> RulesOptions:
        return RulesOptions.defaults(quick)

    def run(self, options: RulesOptions) -> RulesResult:
        return run_rules(options)

    def report(self, result: RulesResult) -> str:
        return rules_report(result)
