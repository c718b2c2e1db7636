"""The controller's KV-event intake: one block index for the fleet, one subscriber per
instance that publishes events, following the instances' lives.

The fleet's registry calls ``watch`` when an instance is launched (or adopted from a previous
controller run) and ``unwatch`` when it stops or fails: a subscriber starts with the instance
and catches up from the engine's replay buffer; an instance that ends drops its entries (a
restarted engine is a new instance, or publishes from seq 0 again, which the index treats as
a restart). Instances that publish nothing (attached external engines) are not in the index:
the cache-aware policy routes them by load, and ``health`` says why.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from controller.kvevents.index import BlockIndex, InstanceHealth, MarkedStale, Outcome
from controller.kvevents.subscriber import KVEventSubscriber

log = logging.getLogger(__name__)

# An instance sent work that stores blocks but silent this long is marked stale.
SILENCE_S = 30.0


@dataclass(frozen=True)
class IndexState:
    """One instance's entry as the console shows it: healthy, or why not."""

    instance: str
    watched: bool  # publishes events the controller subscribes to
    health: InstanceHealth | None


class KvEventsHub:
    def __init__(self, block_size: int, *, silence_s: float | None = SILENCE_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.index = BlockIndex(block_size)
        self.silence_s = silence_s
        self.clock = clock
        self._subs: dict[str, KVEventSubscriber] = {}
        self._stopping: set[asyncio.Task[None]] = set()

    def watch(self, instance: str, endpoints: tuple[str, str] | None) -> None:
        """Subscribe to ``instance``'s events at ``(publisher, replay)`` endpoints (None: it
        publishes none); a second call for the same instance starts over."""
        self.unwatch(instance)
        if endpoints is None:
            return
        self.index.add(instance)
        sub = KVEventSubscriber(instance, endpoints[0], self.index,
                                replay_endpoint=endpoints[1], silence_s=self.silence_s,
                                clock=self.clock, on_outcome=self._log_stale)
        self._subs[instance] = sub
        sub.start()

    def unwatch(self, instance: str) -> None:
        """``instance`` ended: its subscriber stops, its entries go."""
        sub = self._subs.pop(instance, None)
        self.index.remove(instance)
        if sub is not None:
            task = asyncio.get_running_loop().create_task(sub.stop())
            self._stopping.add(task)
            task.add_done_callback(self._stopping.discard)

    def watched(self, instance: str) -> bool:
        return instance in self._subs

    def sent(self, instance: str) -> None:
        """The router sent ``instance`` a prompt: it should publish stored blocks soon."""
        if instance in self._subs:
            self.index.note_expected(instance, self.clock())

    def states(self, instances: list[str]) -> list[IndexState]:
        now = self.clock()
        return [IndexState(i, i in self._subs, self.index.health(i, now)) for i in instances]

    async def close(self) -> None:
        subs, self._subs = list(self._subs.values()), {}
        await asyncio.gather(*(s.stop() for s in subs), *self._stopping)
        for s in subs:
            self.index.remove(s.instance)

    @staticmethod
    def _log_stale(out: Outcome) -> None:
        if isinstance(out, MarkedStale):
            log.warning("KV index of %s is stale (%s): routed by load until rebuilt",
                        out.instance, out.reason)
