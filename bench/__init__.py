"""Benchmarks of pdctl: scenarios that return results, and the pieces they share.

Scenarios (each ``python -m bench.<name>``, all of them with ``python -m bench``):

- ``bench.router``  router cost: pdctl vs vllm-router vs the client's own two hops, with
                    engines that take time (engine-bound) and engines that answer at once
                    (router-bound)
- ``bench.lab``     the real CPU lab under guidellm: disaggregated vs colocated, and the
                    simulator's prediction of the same workload
- ``bench.scale``   a 16P + 48D simulated 70B/H100 fleet at 1,000 requests/s
- ``bench.console`` how fast the console refreshes with 100k records and 120 instances
- ``bench.ray_start`` 64 simulated instances started and stopped with the local and the Ray
                    launcher, and Ray's own CPU and memory (in a private network namespace)

Shared pieces: ``bench.fleet`` (processes: controller, engines, peers; also used by
``tests/integration/harness.py``), ``bench.loadgen`` (the load generator), ``bench.stats``
(the one percentile definition), ``bench.prom`` (Prometheus text), ``bench.cpu`` (CPU time),
``bench.report`` (formatting, JSON, BENCHMARKS.md), ``bench.instant_engine`` (the
router-bound case's engines). Tools: ``bench.nixl`` (raw NIXL bandwidth),
``bench.measure_lab`` (per-hop latencies of a running lab).
"""
