"""Scale on simulated engines: one ``pdctl controller`` with 16 prefill + 48 decode instances
at 1,000 requests/s open-loop.

The controller is a real process started with a YAML config (backend ``sim``: Llama-3-70B on
H100 SXM, prefill TP4, decode TP2, 8 accelerators per node and just enough nodes for the
fleet), and it starts every engine itself: on two sim host processes (``sim.processes`` 2,
each engine on its own port; ``--sim-processes 0``: a ``controller.engines.sim`` process per
engine, as before). The
load generator (``bench.loadgen.OpenLoop``) in this process sends open-loop arrivals (Poisson
by default) at the offered rate, warms up, then measures a window:

- achieved rate (200 OK completions per second) against offered, and what the client really
  sent (its own scheduling lag shows when it is starved of CPU);
- errors: any non-200, any stream error event or missing ``[DONE]``, a wrong token count,
  connection errors, and requests the client gave up on (its timeout, or arrivals dropped
  because ``--max-inflight`` requests were already open);
- client TTFT p50/p99 (streamed requests: time to the first token event) and end-to-end
  latency (non-streamed requests);
- CPU from psutil over the window: the controller (cores = CPU s / wall s, and CPU ms per
  completed request), the engines together, this client, and the rest of the machine;
- routing-decision latency p50/p99 from the controller's histogram
  ``pdctl_routing_decision_seconds`` (bucket deltas between scrapes at the window's start and
  end);
- fleet start time: controller spawned until all instances are ready.

Workload: prompts of 1,024-1,536 estimated tokens (text, unique per request, so every request
takes the disaggregated path at the default threshold of 512), ``max_tokens`` 16, a quarter of
the requests streamed. At ``time_scale`` 1.0 the 16 modelled prefill instances can prefill
only ~170 such prompts per second (compute-bound roofline), so the fleet runs at
``sim.time_scale`` 0.1 (modelled hardware 10x faster) to have room for 1,000 req/s; the
report prints the modelled capacity.

    .venv/bin/python -m bench scale                 # 16P+48D, 1000 req/s, 25 s window
    .venv/bin/python -m bench scale --quick         # 4P+12D, 200 req/s, 10 s window
    .venv/bin/python -m bench scale --rate 300 --duration 20 --json /tmp/s.json

Everything started here is stopped on exit, also on Ctrl-C: the controller gets SIGTERM (it
stops its engines), then any engine process left is killed by process group and reported.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import tempfile
import time
from pathlib import Path

import psutil

from bench.fleet import SIM_ENGINE_MATCH, SIM_HARDWARE, ControllerProc, start_controller
from bench.processes import ProcessFleet
from bench.scenario import Scenario, take_given
from bench.scenarios.scale.load import drive
from bench.scenarios.scale.model import (
    DECODE_TP,
    PER_NODE,
    PREFILL_TP,
    Cleanup,
    ScaleOptions,
    ScaleResult,
    modelled_capacity,
    nodes_for,
    scale_config,
)
from bench.scenarios.scale.observe import idle_cpu, wait_fleet
from bench.scenarios.scale.summary import summarize_window
from bench.scenarios.scale.text import scale_report


def measure_fleet(o: ScaleOptions, res: ScaleResult, ctl: ControllerProc,
                  fleet: ProcessFleet, t_spawn: float) -> None:
    """The started fleet until ready, idle, then under load, into ``res``."""
    import uvloop

    res.fleet = wait_fleet(o, ctl, fleet, t_spawn)
    print(f"fleet ready: {res.fleet.fleet_start_s} s for {o.prefill + o.decode} "
          f"instances; load: {o.warmup:g} s warm-up + {o.duration:g} s measured", flush=True)
    if o.engine_nice:
        for pid in fleet.descendants(SIM_ENGINE_MATCH):
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).nice(o.engine_nice)
    res.idle = idle_cpu(ctl, fleet, o.idle)
    load, seen = uvloop.run(drive(o, ctl, fleet))
    res.summary = summarize_window(o, load, seen, res.idle)
    res.loadavg_after = os.getloadavg()
    res.instance_failures = ctl.instance_failures()


class ScaleScenario(Scenario[ScaleOptions, ScaleResult], name="scale", alias="bench.scale"):
    """Scale: 16 prefill + 48 decode simulated 70B/H100 instances

    `pdctl controller` starts 16 prefill (TP4) and 48 decode (TP2) simulated Llama-3-70B/H100
    instances on 20 nodes x 8 (hosted by two sim host processes, `sim.processes`) and is driven
    open-loop at 1,000 requests/s (Poisson). Reported: achieved rate, errors, TTFT, where the
    CPU went, and the routing decision's latency from `pdctl_routing_decision_seconds`."""

    def add_options(self, ap: argparse.ArgumentParser) -> None:
        ap.add_argument("--rate", type=float,
                        help="offered requests/s (default 1000; quick 200)")
        ap.add_argument("--duration", type=float,
                        help="measured seconds (default 25; quick 10)")
        ap.add_argument("--warmup", type=float,
                        help="seconds of load before measuring (default 8; quick 4)")
        ap.add_argument("--prefill", type=int, help="prefill instances (default 16; quick 4)")
        ap.add_argument("--decode", type=int, help="decode instances (default 48; quick 12)")
        ap.add_argument("--quick", action="store_true", help="smoke run: 4P+12D at 200 req/s")
        ap.add_argument("--time-scale", type=float, default=0.1,
                        help="sim.time_scale: wall s per modelled s (default 0.1, see above)")
        ap.add_argument("--arrivals", choices=["poisson", "constant"], default="poisson")
        ap.add_argument("--prompt-tokens", type=int, nargs=2, default=[1024, 1536],
                        metavar=("MIN", "MAX"), help="estimated prompt tokens (bytes / 4)")
        ap.add_argument("--max-tokens", type=int, default=16)
        ap.add_argument("--stream-share", type=float, default=0.25, help="share streamed")
        ap.add_argument("--timeout", type=float, default=15.0,
                        help="client gives up on a request after this many seconds")
        ap.add_argument("--max-inflight", type=int, default=1000,
                        help="arrivals beyond this many open requests are dropped (counted)")
        ap.add_argument("--start-timeout", type=float, default=180.0,
                        help="controller start_timeout_s per instance")
        ap.add_argument("--idle", type=float, default=5.0,
                        help="seconds of idle CPU measurement with the fleet ready, before "
                             "load")
        ap.add_argument("--engine-nice", type=int, default=0,
                        help="renice the engine processes (e.g. 10) so that the controller "
                             "and the client win the CPU, as if the engines ran on other "
                             "hosts")
        ap.add_argument("--sim-processes", type=int, default=2,
                        help="sim.processes: processes hosting all the engines (default "
                             "%(default)s); 0: a process per engine")
        ap.add_argument("--seed", type=int, default=1)
        ap.add_argument("--keep", action="store_true", help="keep the work directory (logs)")

    def options(self, args: argparse.Namespace) -> ScaleOptions:
        o = ScaleOptions.defaults(args.quick)
        take_given(o, args, ("rate", "duration", "warmup", "prefill", "decode"))
        o.time_scale, o.poisson = args.time_scale, args.arrivals == "poisson"
        o.prompt_tokens = (args.prompt_tokens[0], args.prompt_tokens[1])
        o.max_tokens, o.stream_share, o.timeout = (args.max_tokens, args.stream_share,
                                                   args.timeout)
        o.max_inflight, o.start_timeout, o.idle = (args.max_inflight, args.start_timeout,
                                                   args.idle)
        o.engine_nice, o.seed, o.keep = args.engine_nice, args.seed, args.keep
        o.sim_processes = args.sim_processes
        return o

    def defaults(self, quick: bool) -> ScaleOptions:
        return ScaleOptions.defaults(quick)

    def run(self, options: ScaleOptions) -> ScaleResult:
        """Start the fleet, measure, stop everything (also on error and Ctrl-C)."""
        o = options
        tmp = Path(tempfile.mkdtemp(prefix="pdctl-bench-scale-"))
        nodes = nodes_for(o.prefill, o.decode)
        res = ScaleResult(o, nodes, modelled_capacity(o), psutil.cpu_count(), os.getloadavg(),
                          logs=str(tmp))
        print(f"bench.scale: {o.prefill}P x TP{PREFILL_TP} + {o.decode}D x TP{DECODE_TP} on "
              f"{nodes} x {PER_NODE} {SIM_HARDWARE}, time_scale {o.time_scale}; modelled "
              f"prefill capacity ~{res.modelled_prefill_capacity_rps:.0f} req/s for the mean "
              f"prompt; offered {o.rate:g} req/s; logs in {tmp}", flush=True)
        t_all = time.monotonic()
        fleet = ProcessFleet(tmp)
        ok = False
        try:
            t_spawn = time.monotonic()
            ctl = start_controller(tmp, scale_config(o), fleet=fleet, log_level="warning",
                                   wait="none")
            measure_fleet(o, res, ctl, fleet, t_spawn)
            ok = True
        finally:
            engines = len(fleet.descendants(SIM_ENGINE_MATCH))
            stopped = fleet.stop(grace_s=45)
            res.cleanup = Cleanup(stopped.seconds, stopped.exit_codes.get("controller"),
                                  stopped.left_after_sigterm, engines + 1, len(stopped.left))
            print(f"fleet stopped in {stopped.seconds} s; processes left: "
                  f"{len(stopped.left)}", flush=True)
            res.total_s = round(time.monotonic() - t_all, 1)
            if ok and not o.keep and not res.instance_failures and not stopped.left:
                shutil.rmtree(tmp, ignore_errors=True)
                res.logs = ""
        return res

    def report(self, result: ScaleResult) -> str:
        return scale_report(result)

    def check(self, result: ScaleResult) -> str | None:
        """Engine processes left behind."""
        if result.cleanup is not None and result.cleanup.engine_processes_left:
            return "engine processes left behind"
        return None
