"""Load-balancing policies, in a registry by name. A policy only chooses among the
candidates it is given, with the router's in-flight counts by instance id and, for the
cache-aware policy, the prompt's blocks; pool membership lives in the routing table."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from controller.models import Instance
from controller.router import cache_aware


@dataclass(frozen=True)
class PromptBlocks:
    """A prompt as the cache sees it: its token count and the controller's chain hashes of
    its full blocks (``controller.kvevents.hashing.prompt_chain_hashes``)."""

    tokens: int
    hashes: list[int]


class CacheView(Protocol):
    """What the cache-aware policy reads from the routing table."""

    def cached(self, instance_id: str, prompt: PromptBlocks) -> int: ...

    def trusted(self, instance_id: str) -> bool: ...

    def queued_tokens(self, instance_id: str) -> int: ...

    @property
    def load_limit(self) -> int: ...


class Policy(Protocol):
    name: str

    def choose(self, candidates: Sequence[Instance], inflight: Mapping[str, int],
               prompt: PromptBlocks | None = None) -> Instance: ...


class RoundRobin:
    """Each request to the next candidate in id order."""

    name = "round_robin"

    def __init__(self) -> None:
        self._counter = itertools.count()

    def choose(self, candidates: Sequence[Instance], inflight: Mapping[str, int],
               prompt: PromptBlocks | None = None) -> Instance:
        return candidates[next(self._counter) % len(candidates)]


class LeastLoaded(RoundRobin):
    """Fewest requests in flight (router's count) plus waiting (engine's count); ties rotate
    (from where the round robin would start)."""

    name = "least_loaded"

    def choose(self, candidates: Sequence[Instance], inflight: Mapping[str, int],
               prompt: PromptBlocks | None = None) -> Instance:
        offset, n = next(self._counter), len(candidates)
        best = candidates[offset % n]
        best_key = inflight.get(best.id, 0) + best.waiting
        for k in range(1, n):
            inst = candidates[(offset + k) % n]
            key = inflight.get(inst.id, 0) + inst.waiting
            if key < best_key:
                best, best_key = inst, key
        return best


class CacheAware(LeastLoaded):
    """The fewest uncached prompt tokens plus uncached tokens queued, among instances within
    the load limit (``controller.router.cache_aware``); a request without blocks (a cache
    view that is not wired, or a prompt shorter than a block) goes least loaded. The last
    decision is kept for the console and tests (``last``)."""

    name = "cache_aware"

    def __init__(self, view: CacheView | None = None) -> None:
        super().__init__()
        self.view = view
        self.last: cache_aware.CacheChoice | None = None

    def choose(self, candidates: Sequence[Instance], inflight: Mapping[str, int],
               prompt: PromptBlocks | None = None) -> Instance:
        view = self.view
        if view is None or prompt is None or not prompt.hashes:
            return super().choose(candidates, inflight)
        cands = [cache_aware.Candidate(
            i.id, inflight.get(i.id, 0) + int(i.waiting), view.queued_tokens(i.id),
            view.cached(i.id, prompt), view.trusted(i.id)) for i in candidates]
        self.last = pick = cache_aware.choose(cands, prompt.tokens, view.load_limit,
                                              next(self._counter))
        return next(i for i in candidates if i.id == pick.instance)


POLICIES: dict[str, Callable[[CacheView | None], Policy]] = {
    RoundRobin.name: lambda _view: RoundRobin(),
    LeastLoaded.name: lambda _view: LeastLoaded(),
    CacheAware.name: CacheAware,
}


def make_policy(name: str, view: CacheView | None = None) -> Policy:
    try:
        return POLICIES[name](view)
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}") from None
