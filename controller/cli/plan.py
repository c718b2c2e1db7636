"""``pdctl plan TRACE``: search fleet layouts for a trace by discrete-event runs
(``controller.whatif``) and print them best first, with the pdctl configuration of the best."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from controller.cli import clients
from controller.cli.args import SubParsers, count_arg, positive_arg, seconds_arg
from controller.cli.clients import connection_flags
from controller.config import RoutingSettings
from controller.replay.schedule import Slice, select
from controller.replay.trace import TraceError, TraceRequest, from_records, load_trace
from controller.router.handoff import DisaggPolicy
from controller.whatif.engine import EngineShape
from controller.whatif.fleet import Goals
from controller.whatif.run import RunSpec
from controller.whatif.search import LayoutResult, Space, search
from pdctl_api import profiles
from pdctl_api.client import ApiError

PLAN_HELP = """\
Which layout serves this traffic within its targets on the fewest accelerators? Each layout
is run on the trace as a discrete-event simulation of the same engine model the simulated
engine uses (continuous batching, chunked prefill, KV capacity, the prefix cache, the KV link)
with the router's own policies and hand-off decision -- seconds per run, not the trace's time.

Layouts: colocated (one pool of decode instances serving whole requests) at each TP, and
disaggregated (prefill TP x decode TP x hand-off policy), within --budget accelerators. A
layout meets the targets when at least --floor of the requests have TTFT <= --ttft-ms and
their own inter-token gap p99 <= --gap-ms. Its goodput is those requests per second; ranked by
goodput per accelerator, meeting layouts first. For each TP (pair) the search runs the
smallest counts that meet (binary search; disaggregated: decode count first beside a wide
prefill pool, then prefill count), so it prints a few runs per TP, not every layout.

The trace: Mooncake JSONL or Azure CSV (as pdctl replay reads them), a slice of --minutes from
--start-s; or, with --recent, the requests the controller at --controller recorded in the last
--minutes (their start times, prompt and output lengths; no prefix sharing is known of them;
a simulated fleet's times divided by its time scale). Prompts longer than the context are cut
to fit, as pdctl replay cuts them.
Progress goes to stderr, one line per run."""

PLAN_EXAMPLE = """\
example:
  pdctl plan ../shared/traces/mooncake_conversation.jsonl --model llama-3.1-70b \\
      --accelerator h100-sxm --budget 32 --context 32768 --ttft-ms 2000 --gap-ms 60
  pdctl plan --recent --minutes 30 --budget 16     # the running controller's last 30 min
"""

TPS = (1, 2, 4, 8)
DEFAULT_LINK = "ib-ndr"
RECORDS_MAX = 10_000  # the most records GET /requests returns


class PlanError(ValueError):
    """Bad input to ``pdctl plan``: the message says what and what is known."""


def _names(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _tps(text: str) -> tuple[int, ...]:
    try:
        tps = tuple(sorted({int(t) for t in _names(text)}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give TPs as 1,2,4") from None
    if not tps or min(tps) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: each TP must be at least 1")
    return tps


def _policies(text: str) -> tuple[DisaggPolicy, ...]:
    known: dict[str, DisaggPolicy] = {"threshold": "threshold", "slo": "slo"}
    out: list[DisaggPolicy] = []
    for name in _names(text):
        if name not in known:
            raise argparse.ArgumentTypeError(f"unknown hand-off policy {name!r}; known: "
                                             f"{', '.join(known)}")
        out.append(known[name])
    if not out:
        raise argparse.ArgumentTypeError("give at least one hand-off policy")
    return tuple(out)


def _prompt_range(text: str) -> tuple[int, int | None]:
    low, sep, high = text.partition("-")
    try:
        lo, hi = int(low), (int(high) if high.strip() else None)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give LOW-HIGH tokens, as 4096-10240 "
                                         "or 10240-") from None
    if not sep or lo < 0 or (hi is not None and hi <= lo):
        raise argparse.ArgumentTypeError(f"{text!r}: give LOW-HIGH with 0 <= LOW < HIGH")
    return lo, hi


def _share(text: str) -> float:
    value = positive_arg(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a share is at most 1")
    return value


def add_plan_parser(sub: SubParsers) -> None:
    p = sub.add_parser("plan", help="search fleet layouts for a trace (discrete-event runs), "
                                    "best first", description=PLAN_HELP, epilog=PLAN_EXAMPLE,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", type=Path, nargs="?", metavar="TRACE",
                   help="the trace file (or --recent)")
    p.add_argument("--recent", action="store_true",
                   help="plan for the controller's own recent requests (those that started "
                        "in the last --minutes, at their own times and lengths) instead of a "
                        "trace; --model, --accelerator and --link default to the "
                        "controller's")
    connection_flags(p)
    p.add_argument("--model", metavar="NAME",
                   help=f"model profile: {', '.join(profiles.MODELS)} (required with TRACE)")
    p.add_argument("--accelerator", metavar="NAME",
                   help=f"accelerator profile: {', '.join(profiles.HARDWARE)} (required with "
                        "TRACE)")
    p.add_argument("--budget", required=True, type=count_arg, metavar="N",
                   help="accelerators the layout may use at most")
    p.add_argument("--link", metavar="NAME",
                   help=f"KV link between instances: {', '.join(profiles.LINKS)} "
                        f"(default {DEFAULT_LINK})")
    p.add_argument("--context", type=count_arg, metavar="TOKENS",
                   help="context served (max_model_len; default: the model's own)")
    p.add_argument("--ttft-ms", type=positive_arg, default=2000.0, metavar="MS",
                   help="TTFT target (default 2000 ms)")
    p.add_argument("--gap-ms", type=positive_arg, default=60.0, metavar="MS",
                   help="inter-token gap target against each request's own gap p99 "
                        "(default 60 ms)")
    p.add_argument("--floor", type=_share, default=0.9, metavar="SHARE",
                   help="share of requests within targets for a layout to meet them "
                        "(default 0.9)")
    p.add_argument("--tp", type=_tps, metavar="LIST",
                   help="TPs to try (default: those of 1,2,4,8 the model fits at and a node "
                        "holds)")
    p.add_argument("--policies", type=_policies, default=("threshold",), metavar="LIST",
                   help="hand-off policies of disaggregated layouts: threshold, slo "
                        "(default threshold)")
    p.add_argument("--disagg-min-prompt-tokens", type=count_arg, default=512, metavar="N",
                   help="the threshold policy's disagg_min_prompt_tokens (default 512)")
    p.add_argument("--prompts", type=_prompt_range, metavar="LOW-HIGH",
                   help="only the trace's requests with LOW <= prompt tokens < HIGH "
                        "(4096-10240; 10240- for no upper bound), at their own times")
    p.add_argument("--decode-policy", default="least_loaded",
                   choices=("round_robin", "least_loaded", "cache_aware"),
                   help="decode pool's routing policy (default least_loaded)")
    p.add_argument("--prefill-policy", default="round_robin",
                   choices=("round_robin", "least_loaded", "cache_aware"),
                   help="prefill pool's routing policy (default round_robin)")
    p.add_argument("--only", choices=("colocated", "disaggregated"),
                   help="search one kind of layout only")
    p.add_argument("--start-s", type=seconds_arg, default=0.0, metavar="S",
                   help="skip to S seconds into the trace (default 0)")
    p.add_argument("--minutes", type=positive_arg, default=10.0, metavar="M",
                   help="minutes of the trace from there (default 10)")
    p.add_argument("--limit", type=count_arg, metavar="N",
                   help="at most N requests of the slice")
    p.add_argument("--rate-scale", type=positive_arg, default=1.0, metavar="X",
                   help="multiply the trace's request rate (plan for growth; default 1)")
    p.add_argument("--json", type=Path, metavar="FILE", help="write every run as JSON")
    p.set_defaults(run=run_plan)


def _profile(table: dict[str, Any], kind: str, name: str) -> Any:
    if name not in table:
        raise PlanError(f"no {kind} profile {name!r}; known: {', '.join(table)}")
    return table[name]


def fitting_tps(m: profiles.ModelProfile, hw: profiles.HardwareProfile,
                asked: tuple[int, ...] | None) -> tuple[tuple[int, ...], list[str]]:
    """The TPs to try, and why the others were left out."""
    out, notes = [], []
    for tp in asked or TPS:
        if tp > hw.accelerators_per_node:
            notes.append(f"TP {tp}: more than the {hw.accelerators_per_node} accelerators "
                         f"of one {hw.name} node")
            continue
        problem = profiles.fit_problem(m, hw, tp)
        if problem is not None:
            notes.append(f"TP {tp}: {problem}")
            continue
        out.append(tp)
    return tuple(out), notes


def recorded_requests(args: argparse.Namespace) -> list[TraceRequest]:
    """The controller's requests that started in the last ``--minutes`` (not those it refused),
    in modelled time (a simulated fleet's wall times / its time scale); fills in the model,
    accelerator and link the controller runs when they were not given."""
    try:
        with clients.connect(args) as client:
            cluster = client.cluster()
            records = client.requests(RECORDS_MAX, since=time.time() - args.minutes * 60)
    except clients.CliError as exc:
        raise PlanError(str(exc)) from None
    except ApiError as exc:
        raise PlanError(clients.describe(exc)) from None
    args.model = args.model or cluster.model.name
    args.accelerator = args.accelerator or cluster.hardware.accelerator
    args.link = args.link or cluster.hardware.kv_link
    requests = from_records(records, cluster.time_scale or 1.0)[:args.limit]
    if not requests:
        raise PlanError(f"the controller at {args.controller} recorded no requests in the last "
                        f"{args.minutes:g} min")
    return requests


def _trace_requests(args: argparse.Namespace) -> list[TraceRequest]:
    trace = load_trace(args.trace)
    sl = Slice(args.start_s, args.limit)
    end = args.start_s + args.minutes * 60
    requests = [r for r in select(trace, sl) if r.time_s < end]
    if not requests and args.prompts is None:
        raise PlanError(f"{args.trace}: no requests between {args.start_s:g} s and {end:g} s "
                        f"(the trace spans {trace.span_s:,.0f} s)")
    return requests


def plan_inputs(args: argparse.Namespace) -> tuple[list[TraceRequest], RunSpec, Space, list[str]]:
    """Everything checked before a run: raises ``PlanError`` or ``TraceError``."""
    if (args.trace is None) == (not args.recent):
        raise PlanError("give a TRACE file or --recent (the controller's own requests), "
                        "one of them")
    if args.trace is not None and (args.model is None or args.accelerator is None):
        raise PlanError("with a TRACE, --model and --accelerator are required")
    requests = recorded_requests(args) if args.recent else _trace_requests(args)
    args.link = args.link or DEFAULT_LINK
    m = _profile(profiles.MODELS, "model", args.model)
    hw = _profile(profiles.HARDWARE, "accelerator", args.accelerator)
    lk = _profile(profiles.LINKS, "link", args.link)
    if args.context is not None:
        if args.context > m.max_model_len:
            raise PlanError(f"--context {args.context:,} is more than {m.name}'s "
                            f"{m.max_model_len:,} tokens")
        m = profiles.with_context(m, args.context)
    tps, notes = fitting_tps(m, hw, args.tp)
    if not tps:
        raise PlanError("no TP to try: " + "; ".join(notes))
    if min(tps) > args.budget:
        raise PlanError(f"a budget of {args.budget} accelerators holds no instance: "
                        f"{m.name} needs TP {min(tps)} on {hw.name} at least")
    if args.prompts is not None:
        lo, hi = args.prompts
        requests = [r for r in requests
                    if r.input_length >= lo and (hi is None or r.input_length < hi)]
        if not requests:
            raise PlanError("no requests with prompts in the range given")
    routing = RoutingSettings(disagg_min_prompt_tokens=args.disagg_min_prompt_tokens,
                              decode_policy=args.decode_policy,
                              prefill_policy=args.prefill_policy)
    spec = RunSpec(EngineShape(m, hw, lk), routing, Goals(args.ttft_ms, args.gap_ms),
                   rate_scale=args.rate_scale)
    try:
        space = Space(args.budget, tps, args.policies, args.floor,
                      colocated=args.only != "disaggregated",
                      disaggregated=args.only != "colocated")
    except ValueError as exc:
        raise PlanError(str(exc)) from None
    return requests, spec, space, notes


def _cell_ms(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f}"


def plan_table(cands: list[LayoutResult]) -> str:
    head = (f"{'#':>2}  {'layout':<46} {'acc':>4} {'within':>7} {'good/s':>7} "
            f"{'per acc':>8} {'TTFT p50':>9} {'p90':>7} {'gap p99':>8}")
    lines = [head]
    for i, c in enumerate(cands, 1):
        s = c.summary
        lines.append(
            f"{i:>2}  {c.layout.label:<46} {c.layout.accelerators:>4} {c.attained:>7.1%} "
            f"{c.goodput_per_s:>7.2f} {c.per_accelerator:>8.3f} "
            f"{_cell_ms(s['ttft_ms']['p50']):>9} {_cell_ms(s['ttft_ms']['p90']):>7} "
            f"{_cell_ms(s['gap_p99_ms']):>8}" + ("" if c.meets else "  (misses)"))
    return "\n".join(lines)


def config_of(c: LayoutResult, args: argparse.Namespace) -> str:
    """The pdctl configuration (YAML) of a layout."""
    lay = c.layout
    prefill = (f"{{size: {lay.prefill_count}, tp: {lay.prefill_tp}}}" if lay.disaggregated
               else "{size: 0}")
    return "\n".join([
        f"model: {{name: {args.model}"
        + (f", max_model_len: {args.context}}}" if args.context else "}"),
        f"hardware: {{accelerator: {args.accelerator}, kv_link: {args.link}}}",
        "pools:",
        f"  prefill: {prefill}",
        f"  decode:  {{size: {lay.decode_count}, tp: {lay.decode_tp}}}",
        "routing:",
        f"  disagg_policy: {lay.disagg_policy}",
        f"  disagg_min_prompt_tokens: {args.disagg_min_prompt_tokens}",
        f"  prefill_policy: {args.prefill_policy}",
        f"  decode_policy: {args.decode_policy}",
    ])


def run_plan(args: argparse.Namespace) -> int:
    try:
        requests, spec, space, notes = plan_inputs(args)
    except (PlanError, TraceError) as exc:
        print(f"pdctl plan: {exc}", file=sys.stderr)
        return 2
    for note in notes:
        print(f"left out {note}", file=sys.stderr)
    span = (requests[-1].time_s - requests[0].time_s) / spec.rate_scale
    print(f"planning for {len(requests):,} requests over {span / 60:.1f} min "
          f"({len(requests) / max(span, 1e-9):.2f}/s), TP {', '.join(map(str, space.tps))}, "
          f"budget {space.budget}", file=sys.stderr)
    started = time.perf_counter()

    def progress(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    cands = search(requests, spec, space, progress)
    print(plan_table(cands))
    best = next((c for c in cands if c.meets), None)
    if best is None:
        print(f"\nno layout within {space.budget} accelerators has {space.floor:.0%} of "
              "requests within the targets; raise --budget or relax the targets")
    else:
        print(f"\nbest: {best.layout.label}, {best.layout.accelerators} accelerators, "
              f"{best.attained:.1%} within targets\n\n{config_of(best, args)}")
    print(f"searched {len(cands)} layouts in {time.perf_counter() - started:.1f} s",
          file=sys.stderr)
    if args.json is not None:
        args.json.write_text(json.dumps({
            "trace": "recent" if args.recent else str(args.trace), "requests": len(requests),
            "model": args.model,
            "accelerator": args.accelerator, "link": args.link, "budget": space.budget,
            "targets": {"ttft_ms": args.ttft_ms, "gap_ms": args.gap_ms,
                        "floor": space.floor},
            "best": None if best is None else best.as_dict(),
            "layouts": [c.as_dict() for c in cands]}, indent=1))
    return 0 if best is not None else 1
