"""Soak: a small simulated fleet under mixed open-loop traffic for 30 minutes, with the
planner applying its sizes and a fault every two minutes, judged from the client's side.

The controller is a real process (backend ``sim``: Llama-3-8B on H100, 2 prefill + 2 decode
instances at TP1, an engine process per instance, the KV lease at its shortest, 6 s; the
planner in ``apply`` mode). The load (``bench.loadgen.OpenLoop``, Poisson, half the requests
streamed, two thirds long enough to go disaggregated, each prompt unique) runs the whole time;
the faults rotate:

- ``kill-decode``, ``kill-prefill``: SIGKILL a ready instance's engine process;
- ``stall-prefill``: SIGSTOP a ready prefill engine for longer than the KV lease, then SIGCONT;
- ``tp-change``: the prefill pool's TP 1 <-> 2 (a rolling replacement).

Judged: every request either succeeded or got a clear error (an HTTP error in OpenAI's shape,
or an error event ending its stream) -- a request that hung past the client's timeout, lost its
connection, or ended without ``[DONE]`` is *lost*; no KV handle held by an engine or counted
by the router once the lease has passed after the load; no process left; the controller's
memory (RSS) and file descriptors flat (the median of the last fifth of the samples against
the first fifth: at most 1.25x, and at most 20 more descriptors; judged on the full run only).

    .venv/bin/python -m bench soak            # 30 min
    .venv/bin/python -m bench soak --quick    # 100 s, every fault once (CI runs this)
    .venv/bin/python -m bench soak --duration 600 --fault-every 60 --rate 4
"""

from __future__ import annotations

import argparse

from bench.scenario import Scenario, take_given
from bench.scenarios.soak.model import SoakOptions, SoakResult, problems
from bench.scenarios.soak.run import run_soak
from bench.scenarios.soak.text import soak_report


class SoakScenario(Scenario[SoakOptions, SoakResult], name="soak", alias="bench.soak"):
    """Soak: 30 minutes of mixed traffic, the planner applying, a fault every 2 minutes

    A simulated 2 prefill + 2 decode fleet under Poisson traffic (half streamed, two thirds
    disaggregated) while the planner applies its sizes and engines are killed, stalled past
    the KV lease and replaced by a TP change in turn. Reported from the client's side: requests
    ok, clear errors, lost (must be 0); KV handles left; the controller's memory and file
    descriptors over the run."""

    def add_options(self, ap: argparse.ArgumentParser) -> None:
        ap.add_argument("--duration", type=float, help="seconds of load (default 1800; "
                                                        "quick 100)")
        ap.add_argument("--fault-every", type=float, dest="fault_every",
                        help="seconds between faults (default 120; quick 20)")
        ap.add_argument("--planner-interval", type=float, dest="planner_interval",
                        help="the planner's interval_s (default 60; quick 15)")
        ap.add_argument("--rate", type=float, help="requests/s offered (default 6)")
        ap.add_argument("--quick", action="store_true", help="100 s, every fault once")
        ap.add_argument("--time-scale", type=float, default=1.0, dest="time_scale",
                        help="sim.time_scale (default 1)")
        ap.add_argument("--seed", type=int, default=1)
        ap.add_argument("--keep", action="store_true", help="keep the work directory (logs)")

    def options(self, args: argparse.Namespace) -> SoakOptions:
        o = SoakOptions.defaults(args.quick)
        take_given(o, args, ("duration", "fault_every", "planner_interval", "rate"))
        o.time_scale, o.seed, o.keep = args.time_scale, args.seed, args.keep
        return o

    def defaults(self, quick: bool) -> SoakOptions:
        return SoakOptions.defaults(quick)

    def run(self, options: SoakOptions) -> SoakResult:
        return run_soak(options)

    def report(self, result: SoakResult) -> str:
        return soak_report(result, problems(result, self.quick(result)))

    def check(self, result: SoakResult) -> str | None:
        found = problems(result, self.quick(result))
        return "; ".join(found) if found else None

    @staticmethod
    def quick(result: SoakResult) -> bool:
        """A run shorter than ten minutes is judged as a smoke run (memory not judged)."""
        return result.options.duration < 600
