"""The routing table, owned by the router: live routing settings, each role's policy, the
ready candidates, requests in flight per instance, and instances the router could not reach.

Every reader of a live routing setting reads ``table.settings``: a ``PATCH /routing`` takes
effect for the next request. In-flight counts change only through a ``Lease``, which ends
exactly once however the request ends (a draining instance stops when its count is zero).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable
from types import TracebackType
from typing import Any

from controller.config import RoutingSettings, patched
from controller.errors import InvalidChange
from controller.kvevents.hashing import ID_BYTES, prompt_chain_hashes
from controller.kvevents.index import BlockIndex
from controller.models import Instance, Role
from controller.router.policies import Policy, PromptBlocks, make_policy
from controller.store import Store

SUSPECT_S = 2.0  # an instance the router could not reach gets no new request this long
InstanceNote = Callable[[Instance, str], None]  # told of an instance, and why


def _add(counts: dict[str, int], key: str, n: int) -> None:
    left = counts.get(key, 0) + n
    if left:
        counts[key] = left
    else:
        counts.pop(key, None)


class OthersLoad:
    """What the fleet's other router processes have in flight, by instance: requests,
    queued uncached prompt tokens and KV handles out (``controller.workers``); empty in a
    controller with one process."""

    __slots__ = ("inflight", "tokens", "handles")

    def __init__(self) -> None:
        self.inflight: dict[str, int] = {}
        self.tokens: dict[str, int] = {}
        self.handles: dict[str, int] = {}


class Lease:
    """One request counted in one instance's in-flight requests until ``release`` (or the end
    of a ``with`` block), with its uncached prompt tokens (``queue``); releasing twice is
    harmless."""

    __slots__ = ("instance", "_counts", "_held", "_on_release", "_tokens", "_queued")

    def __init__(self, counts: dict[str, int], instance: Instance,
                 on_release: Callable[[], None] | None = None,
                 tokens: dict[str, int] | None = None) -> None:
        self.instance = instance
        self._counts = counts
        self._held = True
        self._on_release = on_release
        self._tokens = tokens
        self._queued = 0
        counts[instance.id] = counts.get(instance.id, 0) + 1

    def queue(self, uncached_tokens: int) -> None:
        """Count ``uncached_tokens`` as work queued on the instance while the lease is held
        (what the cache-aware policy weighs); replaces an earlier count."""
        if self._held and self._tokens is not None:
            _add(self._tokens, self.instance.id, uncached_tokens - self._queued)
            self._queued = uncached_tokens

    def release(self) -> None:
        if self._held:
            self.queue(0)
            self._held = False
            _add(self._counts, self.instance.id, -1)
            if self._on_release is not None:
                self._on_release()

    @property
    def held(self) -> bool:
        return self._held

    @property
    def queued(self) -> int:
        """The uncached prompt tokens this lease counts as queued on its instance."""
        return self._queued

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()


class RoutingTable:
    def __init__(self, initial: RoutingSettings, store: Store | None,
                 clock: Callable[[], float]) -> None:
        """``store`` None: a router worker's table, whose settings the controller sets
        (``mirror``)."""
        self.store = store
        self.clock = clock
        self.settings = self._stored(initial)
        self._policies: dict[Role, Policy] = {}
        self._ready: dict[Role, list[Instance]] = {r: [] for r in Role}
        self._inflight: dict[str, int] = {}
        self._queued_tokens: dict[str, int] = {}  # uncached prompt tokens, by instance
        self._suspect: dict[str, float] = {}
        # The same counts in the fleet's other router processes (``controller.workers``),
        # as they last reported them: picks, caps, drain and the console see every process.
        self.others = OthersLoad()
        # KV handles each prefill instance gave out (request id -> when its lease ends), until
        # their request ends: a draining prefill instance stays while any is out.
        self._handles: dict[str, dict[str, float]] = {}
        # Which instance holds which prompt blocks (the fleet's KV events), set when wired.
        self.index: BlockIndex | None = None
        # Requests waiting in the router for a prefill slot (routing.prefill_max_inflight),
        # first come first served: each future gets a lease on the instance it may use.
        self._waiters: deque[tuple[asyncio.Future[Lease], PromptBlocks | None]] = deque()
        self.on_unreachable: InstanceNote | None = None  # the fleet's, set when wired
        self.on_failed: InstanceNote | None = None  # the router's, set when wired
        # Told "routing" or a role's name when the settings or that pool's members change
        # (the router workers' hub, when wired).
        self.on_change: Callable[[str], None] | None = None
        self._reset_policies()

    def _stored(self, initial: RoutingSettings) -> RoutingSettings:
        if self.store is None:
            return initial
        stored = self.store.get("routing")
        if stored is not None:
            with contextlib.suppress(ValueError):
                return RoutingSettings.model_validate(stored)
        self.store.put("routing", initial.model_dump())
        return initial

    def _reset_policies(self) -> None:
        self._policies = {Role.PREFILL: make_policy(self.settings.prefill_policy, self),
                          Role.DECODE: make_policy(self.settings.decode_policy, self)}

    def policy(self, role: Role) -> Policy:
        return self._policies[role]

    # ---- the prefix cache (cache_aware, and what every record predicts) ----------------

    def blocks(self, packed_ids: bytes) -> PromptBlocks | None:
        """The prompt's blocks as the index keys them, from its packed token ids
        (``hashing.pack_ids``); None when nothing is indexed."""
        if self.index is None:
            return None
        return PromptBlocks(len(packed_ids) // ID_BYTES,
                            prompt_chain_hashes(packed_ids, self.index.block_size))

    @property
    def wants_blocks(self) -> bool:
        """A pool routes by cache: every prompt's blocks are needed."""
        s = self.settings
        return self.index is not None and "cache_aware" in (s.prefill_policy, s.decode_policy)

    def cached(self, instance_id: str, prompt: PromptBlocks) -> int:
        """Prompt tokens ``instance_id`` would serve from its prefix cache, by the index:
        whole blocks, and never the prompt's last token (vLLM always computes it)."""
        if self.index is None or not prompt.hashes:
            return 0
        bs = self.index.block_size
        held = self.index.longest_prefix(instance_id, prompt.hashes)
        return min(held, (prompt.tokens - 1) // bs * bs)

    def expect_blocks(self, inst: Instance, prompt: PromptBlocks, cached: int) -> None:
        """``inst`` was sent a prompt with full blocks it does not hold: it should publish
        them soon (an engine whose events stop is marked stale after a while)."""
        if self.index is not None and len(prompt.hashes) * self.index.block_size > cached:
            self.index.note_expected(inst.id, self.clock())

    def trusted(self, instance_id: str) -> bool:
        return self.index is not None and self.index.trusted(instance_id)

    def queued_tokens(self, instance_id: str) -> int:
        return self._queued_tokens.get(instance_id, 0) + self.others.tokens.get(instance_id, 0)

    @property
    def load_limit(self) -> int:
        return self.settings.cache_load_limit

    # ---- live settings ------------------------------------------------------------------

    def update(self, patch: dict[str, Any], actor: str) -> RoutingSettings:
        """Validate and apply a settings change, persisted and recorded; raises
        InvalidChange and changes nothing when it is invalid."""
        if not patch:
            raise InvalidChange("nothing to change: give at least one routing field")
        if self.store is None:
            raise InvalidChange("a router worker's routing settings are the controller's")
        before = self.settings.model_dump()
        new = patched(self.settings, patch, "routing.")
        changed = {k: v for k, v in new.model_dump().items() if before.get(k) != v}
        self.store.change("routing", new.model_dump(), actor, "routing.update", "routing",
                          {k: before[k] for k in changed}, changed)
        self.mirror(new)
        if self.on_change is not None:
            self.on_change("routing")
        return new

    def mirror(self, new: RoutingSettings) -> None:
        """Take ``new`` as the live settings (a router worker is told the controller's)."""
        policies = (self.settings.prefill_policy, self.settings.decode_policy)
        self.settings = new
        if (new.prefill_policy, new.decode_policy) != policies:
            self._reset_policies()
        self._wake()  # a higher (or no) prefill cap frees slots for those waiting

    # ---- candidates ---------------------------------------------------------------------

    def set_members(self, role: Role, members: list[Instance]) -> None:
        """The registry's ready instances of ``role`` (sorted by id)."""
        self._ready[role] = members
        if role is Role.PREFILL:
            self._wake()  # a new prefill instance takes requests waiting for a slot
        if self.on_change is not None:
            self.on_change(role.value)

    def ready(self, role: Role) -> list[Instance]:
        return self._ready[role]

    def pick(self, role: Role, exclude: set[str], prompt: PromptBlocks | None = None
             ) -> Instance | None:
        """An instance of ``role`` for the next request (``prompt``: its blocks, for the
        cache-aware policy), by the role's policy: one the router reached lately if there
        is one."""
        pool = self._ready[role]
        if self._suspect:
            now = self.clock()
            candidates = [i for i in pool if i.id not in exclude
                          and self._suspect.get(i.id, 0.0) <= now]
            if not candidates:
                candidates = [i for i in pool if i.id not in exclude]
        elif exclude:
            candidates = [i for i in pool if i.id not in exclude]
        else:
            candidates = pool
        counts = self._counts()
        cap = self._cap(role)
        if cap:
            candidates = [i for i in candidates if counts.get(i.id, 0) < cap]
        if not candidates:
            return None
        return self._policies[role].choose(candidates, counts, prompt)

    def _counts(self) -> dict[str, int]:
        """Requests in flight per instance, this process's and the others'."""
        others = self.others.inflight
        if not others:
            return self._inflight
        counts = dict(others)
        for k, n in self._inflight.items():
            counts[k] = counts.get(k, 0) + n
        return counts

    def _cap(self, role: Role) -> int:
        """Requests one instance of ``role`` may have in flight (0: no limit)."""
        cap = self.settings.max_inflight_per_instance
        if role is Role.PREFILL and self.settings.prefill_max_inflight:
            cap = min(cap or self.settings.prefill_max_inflight,
                      self.settings.prefill_max_inflight)
        return cap

    # ---- the router's prefill queue -------------------------------------------------------

    @property
    def prefill_waiting(self) -> int:
        """Requests waiting in the router for a prefill slot."""
        return sum(1 for f, _ in self._waiters if not f.done())

    async def prefill_slot(self, timeout_s: float, prompt: PromptBlocks | None = None
                           ) -> Lease | None:
        """A lease on a prefill instance with a free slot (``routing.prefill_max_inflight``),
        at once when nobody waits and one is free, else after those who came first; None
        when ``timeout_s`` passes first or no prefill instance is ready."""
        if not self._waiters:
            inst = self.pick(Role.PREFILL, set(), prompt)
            if inst is not None:
                return self.lease(inst)
        if not self._ready[Role.PREFILL]:
            return None
        fut: asyncio.Future[Lease] = asyncio.get_running_loop().create_future()
        waiter = (fut, prompt)
        self._waiters.append(waiter)
        try:
            # Not wait_for: on 3.11 it returns a result that arrived with a cancellation and
            # swallows the cancellation.
            await asyncio.wait((fut,), timeout=timeout_s)
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():  # granted as the client left: pass it on
                fut.result().release()
            fut.cancel()
            raise
        finally:
            with contextlib.suppress(ValueError):
                self._waiters.remove(waiter)
        if fut.done():
            return fut.result()
        fut.cancel()  # timed out
        return None

    def _wake(self) -> None:
        """Grant free prefill slots to the requests waiting longest."""
        while self._waiters:
            fut, prompt = self._waiters[0]
            if fut.done():  # gave up
                self._waiters.popleft()
                continue
            inst = self.pick(Role.PREFILL, set(), prompt)
            if inst is None:
                return
            self._waiters.popleft()
            fut.set_result(self.lease(inst))

    def full(self, role: Role) -> bool:
        """Every ready instance of ``role`` has ``max_inflight_per_instance`` requests."""
        cap = self.settings.max_inflight_per_instance
        pool = self._ready[role]
        counts = self._counts()
        return bool(cap and pool) and all(counts.get(i.id, 0) >= cap for i in pool)

    def report_unreachable(self, inst: Instance, error: str) -> None:
        """The router could not reach ``inst``: avoid it briefly; the fleet checks it soon."""
        now = self.clock()
        self._suspect = {k: t for k, t in self._suspect.items() if t > now}
        self._suspect[inst.id] = now + SUSPECT_S
        if self.on_unreachable is not None:
            self.on_unreachable(inst, error)

    def failed(self, inst: Instance, why: str) -> None:
        """The fleet wrote ``inst`` off: what the router has in flight there ends now (a
        stream waiting on an engine that cannot answer would wait the whole read timeout)."""
        if self.on_failed is not None:
            self.on_failed(inst, why)

    def suspect(self, instance_id: str) -> bool:
        return self._suspect.get(instance_id, 0.0) > self.clock()

    # ---- in flight ----------------------------------------------------------------------

    def lease(self, inst: Instance) -> Lease:
        return Lease(self._inflight, inst,
                     self._wake if inst.role is Role.PREFILL else None, self._queued_tokens)

    def inflight(self, instance_id: str) -> int:
        """Requests in flight on the instance, in every router process."""
        return self._inflight.get(instance_id, 0) + self.others.inflight.get(instance_id, 0)

    def own_load(self) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
        """This process's requests in flight, queued prompt tokens and KV handles out, by
        instance (what a router worker reports to the controller)."""
        return (dict(self._inflight), dict(self._queued_tokens),
                {i: n for i in list(self._handles) if (n := self._own_handles(i))})

    # ---- KV handles out -----------------------------------------------------------------

    def handle_out(self, instance_id: str, rid: str, lease_s: float) -> None:
        """The prefill instance answered request ``rid``: its KV blocks wait for a decode
        engine to read or release them, at most the lease."""
        self._handles.setdefault(instance_id, {})[rid] = self.clock() + lease_s

    def handle_done(self, instance_id: str, rid: str) -> None:
        """Request ``rid`` ended: its handle was read, released, or is no one's now."""
        out = self._handles.get(instance_id)
        if out is not None:
            out.pop(rid, None)
            if not out:
                del self._handles[instance_id]

    def void_handles(self, instance_id: str) -> int:
        """The engine behind ``instance_id`` restarted: the handles it gave out hold nothing
        any more (none is left to read, release or wait for). How many were out."""
        n = self.handles_out(instance_id)
        self._handles.pop(instance_id, None)
        return n

    def handles_out(self, instance_id: str) -> int:
        """KV handles of the instance whose request has not ended and lease not run out, in
        every router process."""
        return self._own_handles(instance_id) + self.others.handles.get(instance_id, 0)

    def _own_handles(self, instance_id: str) -> int:
        out = self._handles.get(instance_id)
        if not out:
            return 0
        now = self.clock()
        for rid in [r for r, until in out.items() if until <= now]:
            del out[rid]
        return len(out)
