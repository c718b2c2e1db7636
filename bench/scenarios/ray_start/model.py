"""The ray_start scenario's options, process kinds and results: per launcher its start and
stop times and the CPU and memory of every kind of process over idle windows; the result
read back from JSON (the run happens in another process, in a private network namespace)."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any

ACCEL = "accel"
NAMESPACE = "bench"
MIB = 2**20

# Kinds of process, in the report's order; ``process_kind`` sorts a process into one.
KIND_ENGINES = "sim engines"
KIND_HOSTS = "ray::EngineHost workers"
KIND_CONTROLLER = "controller"
RAY_KINDS = ("gcs_server", "raylet", "dashboard (head)", "dashboard agent", "runtime env agent",
             "autoscaler monitor", "log monitor", "idle workers", "other ray workers")
PROCESS_KINDS = (KIND_CONTROLLER, KIND_ENGINES, KIND_HOSTS, *RAY_KINDS, "other")
HEAD_NODE, WORKER_NODES = "ray on the head node", "ray on the worker nodes"


@dataclass
class RayOptions:
    prefill: int = 16
    decode: int = 48
    window: float = 30.0  # seconds of each idle CPU/memory window
    worker_nodes: int = 2
    node_accel: int = 32  # accel units each Ray worker node offers (= accelerators_per_node)
    node_cpus: int = 64  # logical CPUs each Ray worker node offers
    time_scale: float = 1.0
    startup_delay: float = 0.5  # sim.startup_delay_s
    start_timeout: float = 600.0  # controller.start_timeout_s, and the wait for all ready
    placement_timeout: float = 300.0  # ray.placement_timeout_s
    stop_timeout: float = 180.0  # SIGTERM -> everything gone, else reported as left
    launchers: tuple[str, ...] = ("local", "ray")
    keep: bool = False  # keep the work directory (logs, Ray session)

    @staticmethod
    def defaults(quick: bool) -> RayOptions:
        if quick:
            return RayOptions(prefill=4, decode=12, window=10.0)
        return RayOptions()

    @property
    def instances(self) -> int:
        return self.prefill + self.decode


@dataclass
class Group:
    """One kind of process over a window: CPU seconds spent in it, memory at its end."""

    kind: str
    count: int  # processes at the window's end
    cpu_s: float
    cores: float  # cpu_s / window
    rss_mib: float  # summed over the processes
    pss_mib: float


@dataclass
class Usage:
    seconds: float
    machine_busy_cores: float  # the whole machine, anything else included
    groups: list[Group] = field(default_factory=list)  # by kind (PROCESS_KINDS)
    nodes: list[Group] = field(default_factory=list)  # Ray's own processes by node

    def get(self, kind: str) -> Group | None:
        return next((g for g in self.groups if g.kind == kind), None)

    def total(self, kinds: tuple[str, ...]) -> Group:
        gs = [g for g in self.groups if g.kind in kinds]
        return Group("total", sum(g.count for g in gs), round(sum(g.cpu_s for g in gs), 2),
                     round(sum(g.cores for g in gs), 3), round(sum(g.rss_mib for g in gs), 1),
                     round(sum(g.pss_mib for g in gs), 1))


@dataclass
class StartTimes:
    seconds: float  # controller spawned -> every pool converged
    controller_up_s: float  # -> /healthz answered
    first_ready_s: float  # spawn -> the first instance ready (from its ready_at)
    instance_start_s_p50: float  # ready_at - created_at
    instance_start_s_max: float
    engine_processes: int
    host_processes: int  # ray::EngineHost workers
    actors: int  # named actors in the namespace (Ray)
    placement_groups: int  # of instances, not removed (Ray)
    cpu: Usage | None = None  # every process of the run, from spawn to converged


@dataclass
class StopTimes:
    seconds: float  # SIGTERM -> the last of the below
    controller_exit_s: float
    controller_exit_code: int | None
    engines_gone_s: float
    hosts_gone_s: float  # Ray only (NaN for local)
    actors_gone_s: float
    placement_groups_gone_s: float
    left: list[str] = field(default_factory=list)  # still there after stop_timeout


@dataclass
class LauncherRun:
    launcher: str
    start: StartTimes | None = None
    idle: Usage | None = None  # every instance ready, no traffic
    stop: StopTimes | None = None
    failures: list[str] = field(default_factory=list)  # instance.failed events
    error: str | None = None


@dataclass
class RayStartResult:
    options: RayOptions
    machine: str
    load_before: tuple[float, float, float]
    netns: str = ""
    load_after: tuple[float, float, float] | None = None
    local: LauncherRun | None = None
    ray: LauncherRun | None = None
    cluster_start_s: float = math.nan
    cluster_idle: Usage | None = None  # the idle cluster: no driver, no actor
    cluster_teardown_s: float = math.nan
    leftovers: list[str] = field(default_factory=list)  # killed after the run
    total_s: float = 0.0
    logs: str = ""


def from_json(tp: Any, v: Any) -> Any:
    """``v`` (as ``bench.report.jsonable`` wrote it) as an instance of the type ``tp``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if v is None:
            return None
        return from_json(next(a for a in args if a is not type(None)), v)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        return tp(**{f.name: from_json(hints[f.name], v[f.name])
                     for f in dataclasses.fields(tp) if f.name in v})
    if origin is list:
        return [from_json(args[0], x) for x in v]
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(from_json(args[0], x) for x in v)
        return tuple(from_json(a, x) for a, x in zip(args, v, strict=True))
    if origin is dict:
        return {k: from_json(args[1], x) for k, x in v.items()}
    if tp is float:
        return math.nan if v is None else float(v)
    return v
