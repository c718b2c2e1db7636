"""The engine fleet: the instance registry (the one writer of instances), the observer, the
desired pools, the start guard and the observe -> plan -> act loop that ties them together.
``build_fleet`` wires them."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx

from controller.config import Settings
from controller.fleet.desired import Desired, capacity_of
from controller.fleet.loop import Fleet
from controller.fleet.observer import Observer
from controller.fleet.registry import Registry
from controller.kvevents.hub import KvEventsHub
from controller.launchers.base import Launcher
from controller.router.table import RoutingTable
from controller.store import Store

__all__ = ["Fleet", "build_fleet"]


def build_fleet(settings: Settings, store: Store, launcher: Launcher,
                client: httpx.AsyncClient | None = None,
                clock: Callable[[], float] = time.monotonic) -> tuple[Fleet, RoutingTable]:
    """A fleet and the routing table it keeps informed of each pool's ready instances."""
    table = RoutingTable(settings.routing, store, clock)
    hub = KvEventsHub(settings.kv_block_size)
    table.index = hub.index
    registry = Registry(store, clock, table.set_members, hub)
    observer = Observer(launcher, client or httpx.AsyncClient(timeout=httpx.Timeout(5.0)),
                        settings.controller.health_timeout_s)
    live = launcher.capacity() is not None  # a Ray cluster's, read live
    desired = Desired(settings, store, launcher.managed,
                      (lambda: capacity_of(settings, launcher)) if live else None,
                      room=launcher.room_problem)
    fleet = Fleet(settings, registry, desired, observer, launcher, table, clock)
    table.on_unreachable = fleet.unreachable
    return fleet, table
