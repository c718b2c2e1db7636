"""The pull hand-off (vLLM's NixlConnector default): the prefill hop first; its answer's KV
handle then goes, once, to the decode instance, which reads the blocks over NIXL. The KV
contract rules it keeps are in ``controller.router.proxy``'s docstring."""

from __future__ import annotations

import asyncio
import logging
import time
from functools import partial

import orjson

from controller.models import Instance, Role
from controller.router.accounting import EngineTimes, cached_tokens
from controller.router.bodies import decode_body, prefill_answer, prefill_body
from controller.router.hop_base import ProxyBase
from controller.router.hops import AttemptFailed
from controller.router.request import Ctx, PrefillDone
from controller.router.table import Lease
from controller.router.upstream import Stream, UpstreamError, UpstreamReply

log = logging.getLogger("pdctl.router")


class PullHandoff(ProxyBase):
    async def _prefill(self, ctx: Ctx, slot: Lease | None = None) -> PrefillDone | None:
        """The prefill hop, tried on up to ``max_attempts`` instances; the first on ``slot``'s
        instance when the router's queue granted one (the hop owns and ends that lease)."""
        payload = orjson.dumps(prefill_body(ctx.body))
        # Only a prefill engine of the decode instance's KV mode can hand it the KV (both
        # modes serve while a pool changes mode).
        mode = ctx.decode.kv_mode if ctx.decode is not None else "pull"
        tried = {p.id for p in self.table.ready(Role.PREFILL) if p.kv_mode != mode}
        if slot is not None and slot.instance.id in tried:
            slot.release()
            slot = None
        for _ in range(self.table.settings.max_attempts):
            lease, slot = slot, None
            inst = (lease.instance if lease is not None
                    else self.table.pick(Role.PREFILL, tried, ctx.blocks))
            if inst is None:
                break
            tried.add(inst.id)
            sent = self._hops.sending(ctx)
            reply = await self._prefill_hop(ctx, inst, payload, lease)
            if reply is None:
                continue
            data = prefill_answer(reply)
            if data is None:
                ctx.errors.append(f"prefill {inst.id} answered {reply.status}"
                                  + ("" if reply.status != 200 else " with no kv_transfer_params"))
                ctx.retries += 1
                continue
            ctx.prefill = inst
            ctx.prefill_cached = cached_tokens(data.get("usage"))
            ctx.prefill_times = EngineTimes.parse(data.get("metrics"))
            ctx.prefill_wall_ms = (time.perf_counter() - sent) * 1e3
            self.table.handle_out(inst.id, ctx.rid, self._lease_s)
            return PrefillDone(inst, data["kv_transfer_params"], self.clock(), inst.incarnation)
        log.warning("%s: prefill hop failed (%s); serving colocated", ctx.rid,
                    "; ".join(ctx.errors) or "no prefill instance")
        return None

    async def _prefill_hop(self, ctx: Ctx, inst: Instance, payload: bytes,
                           lease: Lease | None = None) -> UpstreamReply | None:
        """POST the prefill hop, counted in ``inst``'s in-flight requests (``lease``, or a new
        one). If the client leaves meanwhile, the hop is left to finish and whatever KV it
        holds is released: aborting it instead would race with its end, and an answer lost
        in that race leaves its blocks held for the whole lease."""
        lease = lease if lease is not None else self.table.lease(inst)
        ctx.cached_predicted = self._cached(ctx, lease)
        hop = asyncio.ensure_future(
            self.upstream.post(f"{inst.url}{ctx.endpoint}", payload, self._hops.headers(ctx)))
        try:
            return await asyncio.shield(hop)
        except asyncio.CancelledError:
            # The lease goes with the hop: ``_release_after`` ends it when the hop is over.
            assert lease is not None
            self._spawn(self._release_after(hop, lease, ctx.decode, ctx.rid))
            lease = None
            raise
        except UpstreamError as exc:
            self._hops.unreachable(ctx, inst, exc)
            return None
        finally:
            if lease is not None:
                lease.release()

    async def _release_after(self, hop: asyncio.Future[UpstreamReply], lease: Lease,
                             decode: Instance | None, rid: str) -> None:
        with lease:
            try:
                reply = await hop
            except (UpstreamError, asyncio.CancelledError):
                return  # no answer: the engine aborted the request or failed; nothing held
        data = prefill_answer(reply)
        if data is not None:
            await self._kv.release(data["kv_transfer_params"], decode, "client_gone", rid)

    async def _decode_with_kv(self, ctx: Ctx, done: PrefillDone) -> Stream | None:
        """The decode hop carrying the prefill's KV handle, sent once. None: serve the
        request colocated (the handle was released, or may have been read)."""
        body, ctx.strip_usage = decode_body(ctx.body, done.kv_params)
        payload = orjson.dumps(body)
        tried: set[str] = set()
        inst: Instance | None = ctx.decode
        while inst is not None and len(tried) < self.table.settings.max_attempts:
            if done.void:
                ctx.errors.append(f"prefill {done.instance.id} restarted after it answered: "
                                  "its KV handle is void")
                return None
            late = self.clock() - done.answered_at
            if late > self._late_s:
                ctx.errors.append(f"decode hop {late:.1f} s after the prefill answered (limit "
                                  f"{self._late_s:g} s of a {self._lease_s} s lease)")
                self._spawn(self._kv.release(done.kv_params, inst, "late", ctx.rid))
                return None
            self._assign_decode(ctx, inst)
            tried.add(inst.id)
            self._sent(ctx, inst, done.instance)
            written: list[bool] = []
            try:
                resp = await self._hops.attempt(ctx, inst, payload, resend=False,
                                           first_by=done.answered_at + self._late_s,
                                           on_sent=partial(written.append, True))
            except AttemptFailed as exc:
                if exc.reached:
                    # The handle may have been read: it is never sent again. (A hop aborted
                    # for a stuck read answered nobody: its late read cannot taint output.)
                    ctx.kv_handle = None if exc.stuck else done.handle
                    return None
            except asyncio.CancelledError:
                if not written:
                    # The client left while the hop was still connecting: no engine has the
                    # handle, so nothing would free the prefill's blocks before the lease
                    # ends. (A hop already written is aborted by the engine, which frees them.)
                    self._spawn(self._kv.release(done.kv_params, None, "client_gone", ctx.rid))
                raise
            else:
                ctx.kv_handle = done.handle
                return resp
            inst = self.table.pick(Role.DECODE, tried, ctx.blocks)
        self._spawn(self._kv.release(done.kv_params, ctx.decode, "decode_unavailable", ctx.rid))
        return None
