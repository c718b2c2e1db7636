"""Load-balancing policies, in a registry by name. A policy only chooses among the
candidates it is given, with the router's in-flight counts by instance id; pool membership
lives in the routing table."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from controller.models import Instance


class Policy(Protocol):
    name: str

    def choose(self, candidates: Sequence[Instance], inflight: Mapping[str, int]
               ) -> Instance: ...


class RoundRobin:
    """Each request to the next candidate in id order."""

    name = "round_robin"

    def __init__(self) -> None:
        self._counter = itertools.count()

    def choose(self, candidates: Sequence[Instance], inflight: Mapping[str, int]
               ) -> Instance:
        return candidates[next(self._counter) % len(candidates)]


class LeastLoaded(RoundRobin):
    """Fewest requests in flight (router's count) plus waiting (engine's count); ties rotate
    (from where the round robin would start)."""

    name = "least_loaded"

    def choose(self, candidates: Sequence[Instance], inflight: Mapping[str, int]
               ) -> Instance:
        offset, n = next(self._counter), len(candidates)
        best = candidates[offset % n]
        best_key = inflight.get(best.id, 0) + best.waiting
        for k in range(1, n):
            inst = candidates[(offset + k) % n]
            key = inflight.get(inst.id, 0) + inst.waiting
            if key < best_key:
                best, best_key = inst, key
        return best


POLICIES: dict[str, Callable[[], Policy]] = {
    RoundRobin.name: RoundRobin,
    LeastLoaded.name: LeastLoaded,
}


def make_policy(name: str) -> Policy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}") from None
