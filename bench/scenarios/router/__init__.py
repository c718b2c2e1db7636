"""Router cost: pdctl and vllm-router against the client doing the P/D hops itself.

Two cases, each with its own engines, a pdctl controller (``external`` backend) and a
vllm-router (``--vllm-pd-disaggregation``) in front of the same two engines, all real
processes on this machine:

- engine-bound: one simulated prefill and one simulated decode engine (llama-3-8b, h100-sxm,
  TP1, time scale 0.1): the engines take milliseconds per request, as real ones do, and
  the router's cost is what it adds to their latency;
- router-bound: ``bench.instant_engine`` (a prefill and a decode port that answer the moment
  a request is parsed, tens of microseconds of CPU per request): the router's own CPU per
  request decides the rate.

Three targets, every request disaggregated:

- direct:      the client does vLLM's NixlConnector two-hop flow itself (prefill hop with
               ``max_tokens: 1``, ``stream: false``, ``kv_transfer_params.do_remote_decode``;
               then the decode hop with the returned ``kv_transfer_params``): no router
- pdctl:       client -> pdctl (prefill hop, decode hop)
- vllm-router: client -> vllm-router (prefill hop, decode hop)

For each concurrency (closed-loop workers, streaming completions) the targets are measured
round-robin inside each round, for several rounds, and the rounds merged. TTFT is the
client's time to the first SSE event carrying a token. Each router's CPU time (process and
children) is read before and after each measurement. Before measuring, a flow check sends a
few requests through each target and reads the engines' counters to confirm that every
request made one prefill (one token) and one KV pull on the decode engine.

``--pdctl-root PATH`` runs the controller from another source tree (e.g. ``git worktree add
/tmp/pdctl-before <commit>``), with this interpreter and ``PYTHONPATH=PATH``: before/after
figures measured the same way in one session. Engines and client stay this checkout's.

    .venv/bin/python -m bench router                        # ~5 min on 2 cores
    .venv/bin/python -m bench router --quick                # smoke run, ~1 min
    .venv/bin/python -m bench router --case router-bound --rounds 4
    .venv/bin/python -m bench router --data-workers 1       # pdctl in one process
    .venv/bin/python -m bench router --pdctl-root /tmp/pdctl-before --json /tmp/before.json

vllm-router 0.1.17 lives in its own venv (``make bench-router`` creates it):

    python3 -m venv .bench/venv-router && .bench/venv-router/bin/pip install vllm-router==0.1.17
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

from bench.fleet import SIM_MODEL_8B, controller_package, source_of
from bench.processes import FleetError
from bench.scenario import Scenario
from bench.scenarios.router.measure import measure_case
from bench.scenarios.router.model import (
    CASES,
    DEFAULT_ROUTER,
    INSTALL_HINT,
    ROUTER_PROMPT,
    TARGETS,
    RouterOptions,
    RouterResult,
)
from bench.scenarios.router.text import router_report


def router_binary(opts: RouterOptions) -> str | None:
    """The vllm-router executable, or None when ``opts`` skips it; ``FleetError`` if it is
    asked for and missing."""
    if opts.vllm_router is None:
        return None
    found = shutil.which(str(opts.vllm_router)) or str(opts.vllm_router)
    if not (os.path.isfile(found) and os.access(found, os.X_OK)):
        raise FleetError(f"vllm-router not found at {opts.vllm_router}. Install vllm-router "
                         f"0.1.17 in its own venv:\n    {INSTALL_HINT}\nor pass "
                         "--vllm-router PATH (or --no-vllm-router to skip it).")
    return found


class RouterScenario(Scenario[RouterOptions, RouterResult], name="router", alias="bench.router"):
    """Router cost: pdctl vs vllm-router 0.1.17

    Two cases, reached three ways in interleaved rounds: `direct` (the client does the
    NixlConnector two-hop flow itself, the no-router baseline), `pdctl` (the controller,
    `external` backend) and `vllm-router` (`--vllm-pd-disaggregation`, in its own virtualenv).
    **Engine-bound**: one simulated prefill and one simulated decode engine (llama-3-8b,
    h100-sxm, TP1, time scale 0.1), closed-loop clients at concurrency 1, 16, 64 and 256.
    **Router-bound**: an instant engine pair (`bench/instant_engine.py`: answers the moment a
    request is parsed, tens of microseconds of CPU per request), so the router's own cost
    decides; concurrency 1 and 64. Streaming completions. Added TTFT is each router's client
    TTFT minus direct's; CPU per request is each router process's CPU time over the requests it
    served (robust to a noisy machine, unlike latency and rate)."""

    def add_options(self, ap: argparse.ArgumentParser) -> None:
        ap.add_argument("--case", choices=CASES, nargs="+", default=list(CASES),
                        help="which cases (default: both)")
        ap.add_argument("--duration", type=float, help="measured seconds per cell (default 5)")
        ap.add_argument("--warmup", type=float,
                        help="seconds per cell before the measured window (default 1)")
        ap.add_argument("--rounds", type=int,
                        help="interleaved repetitions (default: engine-bound 2, router-bound 3)")
        ap.add_argument("--concurrency", type=int, nargs="+",
                        help="closed-loop workers per cell (default: engine-bound 1 16 64 256, "
                             "router-bound 1 64)")
        ap.add_argument("--max-tokens", type=int, default=4, help="tokens per request")
        ap.add_argument("--time-scale", type=float, default=0.1,
                        help="the engine-bound case's sim engines' time scale")
        ap.add_argument("--vllm-router", type=Path, default=DEFAULT_ROUTER,
                        help="the vllm-router executable (default: .bench/venv-router/bin/...)")
        ap.add_argument("--no-vllm-router", action="store_true",
                        help="measure direct and pdctl only")
        ap.add_argument("--pdctl-root", type=Path,
                        help="run the pdctl controller from this source tree (PYTHONPATH), "
                             "e.g. a `git worktree` of an older commit")
        ap.add_argument("--data-workers", type=int, default=2,
                        help="pdctl's controller.data_workers: processes serving the data "
                             "plane (default 2; 1: the controller's process alone)")
        ap.add_argument("--quick", action="store_true",
                        help="smoke run: 1 round of 1.5 s; engine-bound at concurrency 1 and 16")

    def options(self, args: argparse.Namespace) -> RouterOptions:
        o = RouterOptions.defaults(args.quick)
        o.cases = tuple(args.case)
        o.duration = args.duration if args.duration is not None else o.duration
        o.warmup = args.warmup if args.warmup is not None else o.warmup
        o.rounds, o.concurrency = args.rounds, args.concurrency
        o.max_tokens, o.time_scale = args.max_tokens, args.time_scale
        o.vllm_router = None if args.no_vllm_router else args.vllm_router
        o.pdctl_root = args.pdctl_root.resolve() if args.pdctl_root else None
        o.data_workers = args.data_workers
        return o

    def defaults(self, quick: bool) -> RouterOptions:
        return RouterOptions.defaults(quick)

    def run(self, options: RouterOptions) -> RouterResult:
        """Every case of ``options``."""
        router_bin = router_binary(options)
        targets = [t for t in TARGETS if router_bin is not None or t != "vllm-router"]
        if options.pdctl_root is not None:
            found = controller_package(options.pdctl_root)
            if found != (options.pdctl_root / "controller").resolve():
                raise FleetError(f"--pdctl-root {options.pdctl_root}: the controller would be "
                                 f"imported from {found}")
        workdir = Path(tempfile.mkdtemp(prefix="pdctl-bench-router-"))
        source = source_of(options.pdctl_root)
        print(f"router cost: pdctl from {source}; work directory {workdir}", flush=True)
        cases = [measure_case(case, options, targets, router_bin or "", workdir)
                 for case in options.cases]
        return RouterResult(options, source, SIM_MODEL_8B, len(ROUTER_PROMPT), os.cpu_count(),
                            cases)

    def report(self, result: RouterResult) -> str:
        return router_report(result)
