"""The push hand-off (vLLM 0.32's ``NixlPushConnector``): both hops at once. The decode hop
carries the prefill engine's NIXL identity (``Instance.kv_peer``); the decode engine reserves
blocks for the prompt and registers them with the prefill engine, which WRITEs the KV into
them when its prefill ends. The hop pair shares the request id, which is how the engines
match them.

What the KV contract rules of the pull mode (``controller.router.proxy``) mean here:

- *Read at most once*: the decode hop carrying a prefill's identity is sent once and never
  again (no HTTP re-send, no second decode instance); when it fails after it may have reached
  the engine, the request gets one colocated attempt.
- *Released when nobody will read*: a decode hop that never reached its engine leaves the
  prefill's blocks waiting for a registration that will not come; once the prefill answers,
  its handle is released like a pull handle (a rejected request to a decode engine of the same
  mode makes vLLM notify the prefill).
- *Whole answers*: the decode hop always streams, since its first token is the only sign
  that the write landed; a non-streaming client gets the whole answer assembled from the
  stream (``controller.router.assemble``).
- *Expiry and stuck writes*: a decode engine frees a request's reserved blocks as soon as the
  request ends, whether or not the prefill has written them, so the router never ends the
  decode hop while the prefill may still write into those blocks: if the prefill hop fails,
  it is over (no write will come) and the decode hop is closed; if the prefill answered, the
  decode hop is given ``kv.late_hop_share`` of the lease for its first token (the write
  landed) before it is aborted as stuck and the request served colocated; a client that
  leaves meanwhile is handled the same way in the background.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import orjson

from controller.models import Instance, Role
from controller.router.accounting import EngineTimes, cached_tokens
from controller.router.answer import Buffered, Prefetched
from controller.router.assemble import AssembleError, assemble
from controller.router.bodies import decode_body, prefill_answer, prefill_body, push_params
from controller.router.hop_base import ProxyBase
from controller.router.hops import AttemptFailed
from controller.router.request import Ctx, PrefillDone
from controller.router.table import Lease
from controller.router.upstream import Stream, UpstreamError

log = logging.getLogger("pdctl.router")

PUSH = "push"


class PushHandoff(ProxyBase):
    def _push_prefill(self, ctx: Ctx, slot: Lease | None) -> Instance | None:
        """The prefill instance for a push pair: the slot's when it is a push engine with a
        known identity, else the policy's choice among those."""
        if slot is not None and _pushable(slot.instance):
            return slot.instance
        avoid = {p.id for p in self.table.ready(Role.PREFILL) if not _pushable(p)}
        return self.table.pick(Role.PREFILL, avoid, ctx.blocks)

    async def _push(self, ctx: Ctx, slot: Lease | None) -> Stream | None:
        """Both hops at once on ``ctx.decode`` and a push prefill instance (``slot``'s if it
        fits: this call owns the slot). None: serve the request colocated."""
        decode = ctx.decode
        assert decode is not None
        prefill = self._push_prefill(ctx, slot)
        if slot is not None and (prefill is None or slot.instance is not prefill):
            slot.release()
            slot = None
        if prefill is None or prefill.kv_peer is None:
            ctx.errors.append("no ready prefill instance in push mode")
            return None
        if isinstance(ctx.body.get("prompt"), list) and len(ctx.body["prompt"]) > 1 \
                and not isinstance(ctx.body["prompt"][0], int):
            # Several prompts are several engine requests: one registration cannot match.
            ctx.errors.append("several prompts in one request: served colocated in push mode")
            if slot is not None:
                slot.release()
            return None
        lease = slot if slot is not None else self.table.lease(prefill)
        ctx.cached_predicted = self._cached(ctx, lease)
        # The decode hop always streams: its first token is the sign the write landed.
        body, ctx.strip_usage = decode_body(
            {**ctx.body, "stream": True}, push_params(prefill.kv_peer, ctx.endpoint, ctx.rid))
        ctx.strip_usage = ctx.strip_usage and ctx.stream
        written: list[bool] = []
        self._hops.sending(ctx)
        p_task = asyncio.ensure_future(self._push_prefill_hop(ctx, prefill, lease))
        self._sent(ctx, decode, prefill)
        d_task = asyncio.ensure_future(self._hops.attempt(
            ctx, decode, orjson.dumps(body), resend=False,
            on_sent=lambda: written.append(True), stream=True))
        try:
            resp = await self._push_outcome(ctx, p_task, d_task, written)
        except asyncio.CancelledError:
            self._spawn(self._push_after_client(ctx, p_task, d_task, written))
            raise
        if ctx.stream or not isinstance(resp, Prefetched):
            return resp
        return await self._whole(ctx, resp)

    async def _whole(self, ctx: Ctx, resp: Prefetched) -> Stream | None:
        """A non-streaming client's whole answer, assembled from the decode hop's stream
        once its first token came; None (a colocated attempt) when the stream breaks off."""
        where = ctx.decode.id if ctx.decode else "?"
        try:
            raw = await resp.read()
            answer = assemble(raw)
        except (UpstreamError, AssembleError) as exc:
            ctx.errors.append(f"decode {where} failed mid-answer: {exc}")
            ctx.retries += 1
            ctx.first_at = None  # the colocated attempt's answer is the one timed
            return None
        finally:
            resp.close()
        return Buffered(200, "application/json", orjson.dumps(answer))

    async def _push_outcome(self, ctx: Ctx, p_task: asyncio.Future[PrefillDone | None],
                            d_task: asyncio.Future[Stream], written: list[bool]
                            ) -> Stream | None:
        await asyncio.wait((p_task, d_task), return_when=asyncio.FIRST_COMPLETED)
        if d_task.done():
            exc = d_task.exception()
            if exc is None:  # its first token (or whole answer) came before the prefill's
                self._spawn(_wait(p_task))
                return d_task.result()
            # The decode hop failed first: abort the prefill (no write into blocks the
            # decode engine may have freed), or release what it holds once it answered.
            p_task.cancel()
            done = await _settled(p_task)
            if done is not None and not written:
                self._spawn(self._kv.release(done.kv_params, None, "decode_unavailable",
                                             ctx.rid))
            if isinstance(exc, AttemptFailed) and exc.reached and done is not None:
                ctx.kv_handle = done.handle
            return None
        done = p_task.result()
        if done is None:  # the prefill failed: nothing will be written; end the decode hop
            await _close(d_task)
            return None
        ctx.kv_handle = done.handle
        # The hop's first token says the write landed.
        by = done.answered_at + self._late_s - self.clock()
        try:
            async with asyncio.timeout(max(0.0, by)):
                return await asyncio.shield(d_task)
        except TimeoutError:
            await _close(d_task)
            self.metrics.kv_stuck_reads.inc()
            ctx.errors.append(f"decode {ctx.decode.id if ctx.decode else '?'} had no token "
                              f"{self._late_s:g} s after the prefill answered (KV write "
                              "stuck); aborted")
            return None
        except AttemptFailed as exc:
            if not exc.reached:
                ctx.kv_handle = None
            return None

    async def _push_prefill_hop(self, ctx: Ctx, inst: Instance, lease: Lease
                                ) -> PrefillDone | None:
        """The prefill hop of a push pair; None when it failed (nothing will be written)."""
        payload = orjson.dumps(prefill_body(ctx.body))
        sent = time.perf_counter()
        with lease:
            try:
                reply = await self.upstream.post(f"{inst.url}{ctx.endpoint}", payload,
                                                 self._hops.headers(ctx))
            except UpstreamError as exc:
                self._hops.unreachable(ctx, inst, exc)
                return None
        data = prefill_answer(reply)
        if data is None:
            ctx.errors.append(f"prefill {inst.id} answered {reply.status}")
            ctx.retries += 1
            return None
        ctx.prefill = inst
        ctx.prefill_cached = cached_tokens(data.get("usage"))
        ctx.prefill_times = EngineTimes.parse(data.get("metrics"))
        ctx.prefill_wall_ms = (time.perf_counter() - sent) * 1e3
        self.table.handle_out(inst.id, ctx.rid, self._lease_s)
        return PrefillDone(inst, data["kv_transfer_params"], self.clock(), inst.incarnation)

    async def _push_after_client(self, ctx: Ctx, p_task: asyncio.Future[PrefillDone | None],
                                 d_task: asyncio.Future[Stream], written: list[bool]) -> None:
        """The client left: let the prefill end, then end the decode hop once no write can
        land in its blocks (written, or none coming); release what nobody will read."""
        done = await _settled(p_task)
        if done is None or not written:
            await _close(d_task)
            if done is not None:
                await self._kv.release(done.kv_params, None, "client_gone", ctx.rid)
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0.0, done.answered_at + self._late_s
                                           - self.clock())):
                await _settled(asyncio.shield(d_task))
        await _close(d_task)


def _pushable(inst: Instance) -> bool:
    return inst.kv_mode == PUSH and inst.kv_peer is not None


async def _settled(task: asyncio.Future[Any]) -> Any:
    """The task's result, or None when it failed or was cancelled (the caller's own
    cancellation still propagates)."""
    try:
        return await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
        return None
    except Exception:
        return None


async def _wait(task: asyncio.Future[Any]) -> None:
    await _settled(task)


async def _close(task: asyncio.Future[Stream]) -> None:
    """End a decode hop: cancel it while it connects or waits, close its stream if open."""
    if not task.done():
        task.cancel()
    resp = await _settled(task)
    if resp is not None:
        resp.close()
