"""The fleet's pool and instance gauges, read at scrape time from the fleet itself."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from controller.models import InstanceState, Role

if TYPE_CHECKING:
    from controller.fleet.loop import Fleet


class FleetCollector(Collector):
    """Pool and instance gauges read from the fleet at scrape time, so instances that are
    gone leave no stale series."""

    def __init__(self, fleet: Fleet) -> None:
        self._fleet = fleet

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        c = self._fleet
        desired = GaugeMetricFamily("pdctl_pool_desired_instances",
                                    "Desired instances per pool", labels=["role"])
        for role in Role:
            desired.add_metric([role.value], c.targets[role].size)
        yield desired
        states = GaugeMetricFamily("pdctl_instances", "Instances by role and state",
                                   labels=["role", "state"])
        for role in Role:
            for state in InstanceState:
                n = sum(1 for i in c.registry if i.role is role and i.state is state)
                states.add_metric([role.value, state.value], n)
        yield states
        gauges = {
            "running": GaugeMetricFamily("pdctl_instance_running_requests",
                                         "Requests running on the engine",
                                         labels=["instance", "role"]),
            "waiting": GaugeMetricFamily("pdctl_instance_waiting_requests",
                                         "Requests waiting in the engine",
                                         labels=["instance", "role"]),
            "kv_usage": GaugeMetricFamily("pdctl_instance_kv_cache_usage_ratio",
                                          "KV cache usage, 0..1", labels=["instance", "role"]),
        }
        # The prefill engines' own KV lease counters, per instance: blocks freed because the
        # lease ran out, and reads reported after that (the blocks may have been reused).
        counters = {
            "kv_expired": CounterMetricFamily(
                "pdctl_instance_kv_expired_requests",
                "Requests whose KV blocks the engine freed when their lease expired "
                "(vllm:nixl_num_kv_expired_reqs)", labels=["instance", "role"]),
            "kv_after_expiry": CounterMetricFamily(
                "pdctl_instance_kv_notifications_after_expiry",
                "Reads of KV blocks the engine had already freed, reported to it after the fact "
                "(vllm:nixl_num_notifications_after_expiry)", labels=["instance", "role"]),
        }
        for inst in c.registry:
            if inst.state.terminal:
                continue
            for attr, fam in gauges.items():
                fam.add_metric([inst.id, inst.role.value], getattr(inst, attr))
            for attr, cfam in counters.items():
                cfam.add_metric([inst.id, inst.role.value], getattr(inst, attr))
        yield from gauges.values()
        yield from counters.values()
