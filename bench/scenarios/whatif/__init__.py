"""What-if: the discrete-event run's speed on a trace hour, and its fidelity per TTFT part
against the live simulated fleet through the real controller.

Speed: the first ``--speed-minutes`` of the Mooncake trace on a 16-instance fleet (4 prefill +
12 decode, Llama-3.1-8B TP1 on H100, 32k context), run discrete-event
(``controller.whatif``) on one core. Fidelity: ``--requests`` of the trace replayed with
``pdctl replay`` through a real ``pdctl controller`` and its simulated engines (2 + 2, real
time), the controller's own request records against the discrete-event records of the same
slice and layout: p50 and p90 of TTFT, each TTFT part, and the inter-token gap p99.

    .venv/bin/python -m bench whatif                 # the hour, and 300 requests live
    .venv/bin/python -m bench whatif --quick         # 5 minutes, and 40 requests live
    .venv/bin/python -m bench whatif --skip-fidelity --speed-minutes 60
    .venv/bin/python -m bench whatif --lab lab-model --trace ../shared/traces/... \
        --requests 60 --rate-scale 0.2 --speed-minutes 5   # against the real CPU lab

With ``--lab`` the live side is the real CPU lab (``pdctl lab``'s configuration: vLLM's CPU
build, 1 prefill + 1 decode, KV over NIXL in host memory) and the discrete-event side runs
lab-tiny on the cpu-lab profile with the lab's routing; prompts fitted to its context.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.scenario import Scenario, take_given
from bench.scenarios.whatif.model import WhatIfOptions, WhatIfResult
from bench.scenarios.whatif.run import run_whatif
from bench.scenarios.whatif.text import whatif_report


class WhatIfScenario(Scenario[WhatIfOptions, WhatIfResult], name="whatif",
                     alias="bench.whatif"):
    """What-if: a trace hour simulated discrete-event, and its fidelity per TTFT part

    One hour of the Mooncake trace on a 16-instance simulated fleet, run as a discrete-event
    simulation of the engines' own scheduler and cost model with the router's own code (its
    run time on one core); then a trace slice through the live simulated fleet and the real
    controller against the same slice discrete-event: TTFT, each TTFT part and the gap tail,
    p50 and p90, and their errors."""

    def add_options(self, ap: argparse.ArgumentParser) -> None:
        ap.add_argument("--speed-minutes", type=float, dest="speed_minutes",
                        help="minutes of trace for the speed run (default 60; quick 5)")
        ap.add_argument("--requests", type=int, dest="fidelity_requests",
                        help="requests replayed live (default 300; quick 40)")
        ap.add_argument("--start-s", type=float, dest="fidelity_start_s",
                        help="where the live slice starts in the trace (default 0)")
        ap.add_argument("--rate-scale", type=float, dest="fidelity_rate_scale",
                        help="the live slice's rate multiplied (default 1)")
        ap.add_argument("--time-scale", type=float, dest="time_scale",
                        help="the live fleet's sim.time_scale (default 1)")
        ap.add_argument("--skip-fidelity", action="store_true", dest="skip_fidelity",
                        help="the speed run only")
        ap.add_argument("--trace", type=Path,
                        help="the trace (default the Mooncake conversation trace)")
        ap.add_argument("--lab", type=Path, dest="lab_model_dir", metavar="MODEL_DIR",
                        help="fidelity against the real CPU lab (vLLM, 1 prefill + 1 decode "
                             "over NIXL, the model pdctl make-model wrote to MODEL_DIR) "
                             "instead of the simulated fleet")
        ap.add_argument("--kv-mode", choices=("pull", "push"), dest="kv_mode",
                        help="the KV hand-off of the fidelity run, live and discrete-event "
                             "(default pull; the simulated fleet only)")
        ap.add_argument("--quick", action="store_true", help="5 minutes; 40 requests live")

    def options(self, args: argparse.Namespace) -> WhatIfOptions:
        o = WhatIfOptions.defaults(args.quick)
        take_given(o, args, ("speed_minutes", "fidelity_requests", "fidelity_start_s",
                             "fidelity_rate_scale", "time_scale", "trace", "lab_model_dir",
                             "kv_mode"))
        o.skip_fidelity = args.skip_fidelity
        if o.lab_model_dir is not None:  # the lab's pools, in real time
            if o.kv_mode != "pull":
                raise SystemExit("bench whatif: --lab takes no --kv-mode push: the CPU lab "
                                 "refuses push (vllm.push_on_cpu)")
            o.fidelity_prefill = o.fidelity_decode = 1
            o.time_scale = 1.0
        return o

    def defaults(self, quick: bool) -> WhatIfOptions:
        return WhatIfOptions.defaults(quick)

    def run(self, options: WhatIfOptions) -> WhatIfResult:
        return run_whatif(options)

    def report(self, result: WhatIfResult) -> str:
        return whatif_report(result)

    def check(self, result: WhatIfResult) -> str | None:
        return result.error
