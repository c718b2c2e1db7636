"""What the proxy's two hand-off paths (``pull``, ``push``) share with it: the attributes and
helpers ``Proxy`` provides, declared once so that each path lives in a module of its own."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from controller.metrics import Metrics
from controller.models import Instance, RequestRecord
from controller.router.hops import Hops
from controller.router.release import KvRelease
from controller.router.request import Ctx
from controller.router.table import Lease, RoutingTable
from controller.router.upstream import Upstream


class HopWatch(Protocol):
    """Told of every decode hop and every finished request (the silent-fallback watch,
    ``controller.obs.kv_fallback``)."""

    def sent(self, rid: str, decode: str, prefill: str | None, prompt_tokens: int,
             uncached: int) -> None: ...

    def ended(self, rec: RequestRecord) -> None: ...


class ProxyBase:
    table: RoutingTable
    upstream: Upstream
    metrics: Metrics
    clock: Callable[[], float]
    fallback: HopWatch | None
    _hops: Hops
    _kv: KvRelease
    _lease_s: float
    _late_s: float

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        raise NotImplementedError

    def _assign_decode(self, ctx: Ctx, inst: Instance) -> None:
        raise NotImplementedError

    def _cached(self, ctx: Ctx, lease: Lease) -> int | None:
        raise NotImplementedError

    def _sent(self, ctx: Ctx, inst: Instance, prefill: Instance | None) -> None:
        """A decode hop to ``inst`` carries ``ctx``: with ``prefill``'s KV, or (None) to
        compute the prompt itself (the silent-fallback watch's allowance)."""
        if self.fallback is not None:
            uncached = ctx.prompt_tokens - (ctx.decode_cached_predicted or 0)
            self.fallback.sent(ctx.rid, inst.id, prefill.id if prefill else None,
                               ctx.prompt_tokens, uncached)
