"""Benchmarks of pdctl: scenarios that return results, one command line that runs them, and
the pieces they share.

``python -m bench`` runs the suite (every scenario below in turn, then BENCHMARKS.md);
``python -m bench <scenario> [options]`` runs one (``bench.cli``). Each scenario is a
``bench.scenario.Scenario`` in ``bench/scenarios/``:

- ``router``   router cost: pdctl vs vllm-router vs the client's own two hops, with engines
               that take time (engine-bound) and engines that answer at once (router-bound)
- ``lab``      the real CPU lab under guidellm: disaggregated vs colocated, and the
               simulator's prediction of the same workload
- ``scale``    a 16P + 48D simulated 70B/H100 fleet at 1,000 requests/s
- ``console``  how fast the console refreshes with 100k records and 120 instances
- ``ray``      64 simulated instances started and stopped with the local and the Ray
               launcher, and Ray's own CPU and memory (in a private network namespace)
- ``planner``  the SLA planner under a stepped load; P/D against colocated
- tools, not in the suite: ``nixl`` (raw NIXL bandwidth), ``measure-lab`` (per-hop
  latencies of a running lab)

``python -m bench.<module>`` (``bench.router``, ``bench.ray_start``, ...) still runs each, as
it always has: those modules only hand their arguments to ``bench.cli``.

Shared pieces: ``bench.processes`` (starting, watching and stopping processes) and
``bench.fleet`` (the controller and engines; both also used by
``tests/integration/harness.py``), ``bench.loadgen`` (the load generator), ``bench.stats``
(pdctl's percentile, NaN without samples), ``bench.prom`` (Prometheus text), ``bench.cpu``
(CPU time), ``bench.report`` (formatting, JSON), ``bench.suite`` (the suite and
BENCHMARKS.md), ``bench.instant_engine`` (the router-bound case's engines).
"""
