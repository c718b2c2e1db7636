"""Engines as Ray actors: one named, detached actor per instance in its own placement group.

Placement: one bundle of ``TP`` units of the accelerator resource (plus ``ray.engine_cpus``
CPUs), STRICT_PACK, so a TP group stays on one node; a group Ray cannot place within
``ray.placement_timeout_s`` fails the start and is removed. The actor (``ray_actor.EngineHost``)
runs the engine kind's command line on its node with the node's IP and free ports there.
Capacity (nodes and their accelerators) comes from the cluster. Actors and placement groups
are named after the instance id in the ``ray.namespace`` namespace, so a restarted controller
finds them (``reattach``). Ray is imported only when this launcher is used.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from controller.config import Settings
from controller.errors import ConfigError, LaunchError
from controller.launchers.base import EngineKind, Launched, Launcher, LaunchSpec, exit_reason
from controller.launchers.ray_actor import EngineHost
from controller.launchers.ray_head import LocalHead, ensure_local_token
from controller.models import PoolTarget, Role

log = logging.getLogger("pdctl.ray")

INSTANCE_ID = re.compile(r"(prefill|decode)-[0-9]+")
REFRESH_S = 1.0  # at most this often the actors are asked whether their engines still run
CALL_TIMEOUT_S = 10.0  # one call to an actor
STOP_EXTRA_S = 15.0  # an actor's stop may take its grace period plus this


@dataclass
class RayHandle:
    actor: Any
    pg: Any
    info: dict[str, Any]
    exit_code: int | None = None
    failure: str | None = None  # the actor (or its node) is gone


@dataclass
class ClusterView:
    """What the controller knows of the cluster: nodes alive and their accelerators."""

    accelerators: dict[str, float] = field(default_factory=dict)  # node IP/id -> count
    cpus: dict[str, float] = field(default_factory=dict)  # node IP/id -> CPUs

    def capacity(self) -> tuple[int, int]:
        counts = [int(c) for c in self.accelerators.values() if c >= 1]
        return (min(counts), len(counts)) if counts else (1, 0)

    def unplaced(self, bundles: Sequence[dict[str, float]]) -> list[dict[str, float]]:
        """The bundles that find no node (each on one node, largest first, first fit), of
        every resource the nodes report: accelerators and CPUs."""
        free = {n: {"ACCEL": self.accelerators.get(n, 0.0), "CPU": self.cpus.get(n, 0.0)}
                for n in self.accelerators.keys() | self.cpus.keys()}
        left = []
        for b in sorted(bundles, key=lambda b: (-b.get("ACCEL", 0.0), -b.get("CPU", 0.0))):
            node = next((n for n in sorted(free)
                         if all(free[n][k] + 1e-9 >= v for k, v in b.items())), None)
            if node is None:
                left.append(b)
                continue
            for k, v in b.items():
                free[node][k] -= v
        return left


def bundle(settings: Settings, tp: int) -> dict[str, float]:
    """The one placement-group bundle of an instance at ``tp``."""
    accel, cpus = settings.ray_accelerator, settings.ray.engine_cpus
    if accel == "CPU":  # the cores are the accelerators
        return {"CPU": float(max(cpus, tp))}
    return {"CPU": float(cpus), accel: float(tp)}


def room_problem(settings: Settings, cluster: ClusterView,
                 targets: dict[Role, PoolTarget]) -> str | None:
    """Why ``cluster`` cannot place every instance of ``targets`` (its bundle of accelerators
    and ``ray.engine_cpus`` CPUs on one node), or None."""
    accel = settings.ray_accelerator
    wanted = []
    for t in targets.values():
        for _ in range(t.size):
            b = bundle(settings, t.tp)
            wanted.append({"ACCEL" if k == accel and accel != "CPU" else k: v
                           for k, v in b.items()})
    left = cluster.unplaced(wanted)
    if not left:
        return None
    pools = ", ".join(f"{r.value} {t.size} x TP{t.tp}" for r, t in targets.items())
    nodes = "; ".join(f"{n}: {cluster.cpus.get(n, 0):g} CPU, "
                      f"{cluster.accelerators.get(n, 0):g} {accel}"
                      for n in sorted(cluster.accelerators.keys() | cluster.cpus.keys()))
    each = ", ".join(f"{v:g} {accel if k == 'ACCEL' else k}" for k, v in left[0].items())
    return (f"{pools}: {len(left)} of {len(wanted)} instances find no Ray node for their "
            f"bundle ({each} on one node; ray.engine_cpus is {settings.ray.engine_cpus:g}); "
            f"the cluster has {nodes or 'no nodes'}")


def actor_options(settings: Settings, tp: int) -> dict[str, Any]:
    """The actor takes its whole bundle, so that Ray tells it its GPUs."""
    b = bundle(settings, tp)
    opts: dict[str, Any] = {"num_cpus": b.pop("CPU")}
    if "GPU" in b:
        opts["num_gpus"] = b.pop("GPU")
    if b:
        opts["resources"] = b
    return opts


def died_reason(exc: BaseException, info: dict[str, Any]) -> str:
    text = str(exc)
    node = info.get("node_ip", "?")
    if "node has died" in text or "node was" in text:
        return f"its Ray node ({node}) died"
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), type(exc).__name__)
    return f"its Ray actor died on node {node}: {first}"


def use_token_auth() -> None:
    """Ray 2.60's ``ray start`` turns token authentication on by default (its token in
    ~/.ray/auth_token), but a driver joining with ``ray.init(address=...)`` sends the token
    only in token mode: enter it where a token exists and RAY_AUTH_MODE says nothing (Ray's
    own rule for a new local cluster)."""
    if "RAY_AUTH_MODE" in os.environ:
        return
    try:
        from ray._private.authentication.authentication_token_setup import (  # noqa: PLC0415
            maybe_enable_token_auth_if_token_available,
        )
    except ImportError:  # another Ray: its own defaults apply
        return
    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)


def reachable(address: str, timeout_s: float = 10.0) -> None:
    """ConfigError unless ``HOST:PORT`` accepts a TCP connection: ``ray.init`` retries an
    address nobody listens on for many minutes with no word."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "://" in address:
        return  # "auto", a ray:// client address: Ray's own resolution and errors
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise ConfigError(f"cannot join the Ray cluster at {address!r} (ray.address): "
                          f"nothing answers there ({exc})") from None


class RayLauncher(Launcher):
    name = "ray"
    stop_after_exit = True

    def __init__(self, settings: Settings, engine: EngineKind) -> None:
        self._s = settings
        self.engine = engine
        self.namespace = settings.ray.namespace
        self.accelerator = settings.ray_accelerator
        self._handles: dict[str, RayHandle] = {}
        self._refreshed = 0.0
        self._connected = False
        self._head: LocalHead | None = None
        self._connect()
        self.cluster = self._read_cluster()

    # ---- the cluster -------------------------------------------------------------------

    def _connect(self) -> None:
        import ray  # noqa: PLC0415

        r = self._s.ray
        address = r.address or "auto"
        if address == "local":
            ensure_local_token(self._s.controller.state_dir)
        use_token_auth()
        if address == "local":
            self._head = LocalHead(self._s)
            self._head.wait_started()
            address = self._head.address
        else:
            reachable(address)
        try:
            ray.init(address=address, namespace=self.namespace, log_to_driver=False,
                     logging_level=logging.WARNING)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            self._stop_head()
            raise ConfigError(f"cannot join the Ray cluster at {address!r} (ray.address): "
                              f"{exc}") from None
        self._connected = True

    def _read_cluster(self) -> ClusterView:
        import ray  # noqa: PLC0415

        view = ClusterView()
        for node in ray.nodes():
            if node.get("Alive"):
                key = f"{node.get('NodeManagerAddress')}/{str(node.get('NodeID'))[:8]}"
                resources = node.get("Resources", {})
                view.accelerators[key] = float(resources.get(self.accelerator, 0))
                view.cpus[key] = float(resources.get("CPU", 0))
        return view

    def capacity(self) -> tuple[int, int] | None:
        """The cluster's, read live. Where the accelerator resource is CPU, a node's CPUs
        already count any sharing (a lab head offers cores x ``hardware.share``), so the
        fleet takes one instance per unit (``desired.capacity_of``)."""
        return self.cluster.capacity()

    def room_problem(self, targets: dict[Role, PoolTarget]) -> str | None:
        return room_problem(self._s, self.cluster, targets)

    def describe_free(self) -> str:
        import ray  # noqa: PLC0415

        free = ray.available_resources()
        return (f"{free.get(self.accelerator, 0):g} {self.accelerator} and "
                f"{free.get('CPU', 0):g} CPU free in the cluster")

    # ---- one instance ------------------------------------------------------------------

    async def start(self, spec: LaunchSpec) -> Launched:
        import ray  # noqa: PLC0415
        from ray.util.placement_group import placement_group  # noqa: PLC0415
        from ray.util.scheduling_strategies import (  # noqa: PLC0415
            PlacementGroupSchedulingStrategy,
        )

        r = self._s.ray
        b = bundle(self._s, spec.tp)
        pg = placement_group([b], strategy="STRICT_PACK", name=spec.instance_id,
                             lifetime="detached")
        actor = None
        try:
            try:
                await asyncio.wait_for(pg.ready(), r.placement_timeout_s)
            except TimeoutError:
                wanted = ", ".join(f"{v:g} {k}" for k, v in b.items())
                raise LaunchError(
                    f"no Ray node could take {wanted} (one node, STRICT_PACK) within "
                    f"{r.placement_timeout_s:g} s; {self.describe_free()}") from None
            host_cls: Any = ray.remote(EngineHost)
            actor = host_cls.options(
                name=spec.instance_id, namespace=self.namespace, lifetime="detached",
                max_restarts=0, runtime_env=r.runtime_env or None,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    pg, placement_group_bundle_index=0),
                **actor_options(self._s, spec.tp)).remote(spec)
            # No limit of its own here: many actors booting at once on few cores take long
            # (Ray starts their workers a few at a time), and the controller's
            # start_timeout_s covers the whole start; its cancel lands below.
            info = await actor.start.remote(self.engine, self.accelerator)
        except BaseException as exc:
            self._discard(actor, pg)
            if isinstance(exc, (LaunchError, asyncio.CancelledError, KeyboardInterrupt)):
                raise
            raise LaunchError(f"its Ray actor could not start the engine: "
                              f"{type(exc).__name__}: {exc}") from None
        handle = RayHandle(actor, pg, info)
        self._handles[spec.instance_id] = handle
        log.info("%s on Ray node %s: %s", spec.instance_id, info["node_ip"], info["url"])
        return Launched(url=info["url"], handle=handle, node=info["node_ip"],
                        kv_events=_kv_events(info), kv_peer=_kv_peer(info))

    async def stop(self, launched: Launched, grace_s: float = 5.0) -> None:
        h: RayHandle = launched.handle
        if h.failure is None:
            with contextlib.suppress(Exception):
                h.exit_code = await asyncio.wait_for(h.actor.stop.remote(grace_s),
                                                     grace_s + STOP_EXTRA_S)
        self._discard(h.actor, h.pg)
        self._handles.pop(str(h.info.get("instance_id")), None)

    def _discard(self, actor: Any, pg: Any) -> None:
        import ray  # noqa: PLC0415
        from ray.util.placement_group import remove_placement_group  # noqa: PLC0415

        if actor is not None:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
        if pg is not None:
            with contextlib.suppress(Exception):
                remove_placement_group(pg)

    async def refresh(self, launched: Sequence[Launched]) -> None:
        now = time.monotonic()
        if now - self._refreshed < REFRESH_S:
            return
        self._refreshed = now
        handles = [x.handle for x in launched if isinstance(x.handle, RayHandle)
                   and x.handle.failure is None and x.handle.exit_code is None]
        await asyncio.gather(*(self._ask(h) for h in handles))
        with contextlib.suppress(Exception):
            self.cluster = await asyncio.to_thread(self._read_cluster)

    async def _ask(self, h: RayHandle) -> None:
        from ray.exceptions import ActorDiedError, RayActorError  # noqa: PLC0415

        try:
            info = await asyncio.wait_for(h.actor.describe.remote(), CALL_TIMEOUT_S)
        except (ActorDiedError, RayActorError) as exc:
            if "unavailable" in type(exc).__name__.lower():
                return  # transient: asked again at the next refresh
            h.failure = died_reason(exc, h.info)
        except Exception:  # noqa: BLE001 - a slow or unreachable actor is asked again later
            return
        else:
            h.exit_code = info.get("exit_code")

    def exit_code(self, launched: Launched) -> int | None:
        h: RayHandle = launched.handle
        return h.exit_code

    def exit_reason(self, launched: Launched) -> str | None:
        h: RayHandle = launched.handle
        if h.failure is not None:
            return h.failure
        return None if h.exit_code is None else exit_reason(h.exit_code)

    async def log_tail(self, launched: Launched, lines: int = 100) -> str:
        h: RayHandle = launched.handle
        try:
            return str(await asyncio.wait_for(h.actor.log_tail.remote(lines), CALL_TIMEOUT_S))
        except Exception as exc:  # noqa: BLE001 - the log is not worth an error
            return f"(its log is on Ray node {h.info.get('node_ip')}, which did not answer: " \
                   f"{type(exc).__name__})"

    # ---- across controller runs --------------------------------------------------------

    async def reattach(self) -> dict[str, Launched]:
        """Every engine actor in the namespace, by instance id; placement groups of the
        namespace that have no actor (a start cut short) are removed."""
        import ray  # noqa: PLC0415
        from ray.util import get_placement_group, placement_group_table  # noqa: PLC0415

        names = await asyncio.to_thread(ray.util.list_named_actors)
        found: dict[str, Launched] = {}
        for name in names:
            actor = ray.get_actor(name, namespace=self.namespace)
            pg = None
            with contextlib.suppress(Exception):
                pg = get_placement_group(name)
            try:
                info: dict[str, Any] = await asyncio.wait_for(actor.describe.remote(),
                                                              CALL_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001
                log.warning("Ray actor %s did not answer (%s): removed", name, exc)
                self._discard(actor, pg)
                continue
            handle = RayHandle(actor, pg, info, exit_code=info.get("exit_code"))
            self._handles[name] = handle
            found[name] = Launched(url=info.get("url", ""), handle=handle,
                                   node=info.get("node_ip"), kv_events=_kv_events(info),
                                   kv_peer=_kv_peer(info))
        for pg_info in (await asyncio.to_thread(placement_group_table)).values():
            name = str(pg_info.get("name") or "")
            if not INSTANCE_ID.fullmatch(name) or name in found \
                    or pg_info.get("state") == "REMOVED":
                continue
            try:  # found by name only in this namespace: ours
                pg = get_placement_group(name)
            except ValueError:
                continue
            log.warning("placement group %s has no engine actor: removed", name)
            self._discard(None, pg)
        return found

    async def close(self) -> None:
        import ray  # noqa: PLC0415

        await asyncio.gather(*(self.stop(Launched(str(h.info.get("url")), h))
                               for h in list(self._handles.values())),
                             return_exceptions=True)
        if self._connected:
            ray.shutdown()
            self._connected = False
        self._stop_head()

    def _stop_head(self) -> None:
        if self._head is not None:
            self._head.stop()
            self._head = None


def _kv_events(info: dict[str, Any]) -> tuple[str, str] | None:
    """The KV-event endpoints an engine host reported (an older one reports none)."""
    ends = info.get("kv_events")
    return (str(ends[0]), str(ends[1])) if isinstance(ends, list) and len(ends) == 2 else None


def _kv_peer(info: dict[str, Any]) -> dict[str, Any] | None:
    """The engine's NIXL identity an engine host reported (an older one reports none)."""
    peer = info.get("kv_peer")
    return dict(peer) if isinstance(peer, dict) else None
