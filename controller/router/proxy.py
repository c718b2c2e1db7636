"""The two-hop proxy: parse -> choose decode -> prefill hop -> decode hop (relayed) -> account.

The disaggregated flow is the one vLLM's NixlConnector expects: the prefill instance gets the
request with ``max_tokens=1``, ``stream=false`` and ``kv_transfer_params.do_remote_decode``;
its answer's ``kv_transfer_params`` (a *KV handle*: the prefill's blocks, held for a lease) go,
with the original request, to a decode instance, which pulls the KV and generates. Prompts
shorter than ``disagg_min_prompt_tokens`` -- or any request when no prefill instance is ready
or the prefill hop fails -- take the colocated path: the decode instance prefills itself.

The rules that keep vLLM's KV contract (docs/routing-and-accounting.md):

- the decode instance is chosen *before* the prefill hop: no ready decode instance -> 503,
  never a prefill whose blocks nobody will read;
- a KV handle is sent to at most one engine, once (no HTTP re-send either). When the decode
  hop carrying it fails after it may have reached the engine, the request gets one colocated
  attempt instead -- vLLM does not fail a read of expired or reused blocks, so a second read
  could return wrong output with HTTP 200;
- a handle whose decode hop would start later than ``kv.late_hop_share`` of the lease goes
  colocated; a streaming hop with no token by then is aborted (its read is stuck and would
  complete after the lease, from freed blocks) and served colocated;
- a handle that will not be read (client gone between the hops, no decode instance could
  take it, late) is released at once: sent to a decode engine in a request its serving layer
  rejects, which makes vLLM notify the prefill to free the blocks;
- attempts that may have reached an engine and failed (it died, or answered 5xx) are at most
  two per request, so a request that kills engines cannot walk the whole pool.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import orjson

from controller import profiles
from controller.cluster import Cluster
from controller.errors import (
    BadRequest,
    NoInstanceAvailable,
    RoutingError,
    UpstreamUnreachable,
)
from controller.metrics import Metrics
from controller.models import Instance, RequestPath, RequestRecord, Role
from controller.requests_log import RequestLog
from controller.router.accounting import EngineTimes, Observation, breakdown
from controller.router.upstream import Reply, Stream, Upstream, UpstreamError
from controller.tokens import TokenCounter

log = logging.getLogger("pdctl.router")

NULL_KV_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False,
                  "remote_engine_id": None, "remote_block_ids": None,
                  "remote_host": None, "remote_port": None}
TAIL_BYTES = 16384
RETRY_PAUSE_S = 0.5  # times the attempt number, before retrying decode instances that failed
MAX_REACHED_FAILURES = 2  # failed attempts per request that may have reached an engine
RELEASE_PATH = "/v1/completions"


@dataclass
class Ctx:
    """Everything known about one client request while it is served."""

    rid: str
    endpoint: str
    body: dict[str, Any]
    stream: bool
    prompt_tokens: int
    t0: float  # perf_counter at arrival
    started_at: float  # unix time at arrival
    path: RequestPath = RequestPath.COLOCATED
    prefill: Instance | None = None
    prefill_times: EngineTimes | None = None
    prefill_wall_ms: float = 0.0
    decode: Instance | None = None
    decode_sent: float = 0.0
    decode_open: bool = False  # ``decode`` counts this request in its inflight
    kv_handle: str | None = None  # the prefill's request id, once a decode hop carried it
    first_at: float | None = None
    routed: bool = False  # the first hop has been sent (routing decision observed)
    finished: bool = False  # recorded by ``finish``
    retries: int = 0
    reached_failures: int = 0  # failed attempts that may have reached an engine
    failed_decodes: set[str] = field(default_factory=set)  # failed after reaching them
    errors: list[str] = field(default_factory=list)
    strip_usage: bool = False  # the router asked for a usage chunk the client did not


_ID_PREFIX = f"pdctl-{os.urandom(6).hex()}-"
_ID_SEQ = itertools.count(1)


def new_request_id() -> str:
    """Unique per controller run (random prefix) and cheap: one per client request."""
    return f"{_ID_PREFIX}{next(_ID_SEQ)}"


@dataclass
class PrefillDone:
    instance: Instance
    kv_params: dict[str, Any]
    answered_at: float  # router clock when the answer arrived: the lease runs from about then

    @property
    def handle(self) -> str | None:
        rid = self.kv_params.get("remote_request_id")
        return rid if isinstance(rid, str) else None


class Buffered:
    """A whole answer read inside its attempt (``Stream`` over bytes already here): a failure
    while reading it was still retryable, because nothing had reached the client."""

    def __init__(self, status: int, content_type: str, body: bytes) -> None:
        self.status, self.content_type, self._body = status, content_type, body

    async def chunks(self) -> AsyncIterator[bytes]:
        yield self._body

    async def read(self) -> bytes:
        return self._body

    def close(self) -> None:
        pass


class AttemptFailed(Exception):
    """One decode attempt failed; ``reached``: the engine may have received the request;
    ``stuck``: aborted because its first token did not come in time."""

    def __init__(self, message: str, reached: bool, stuck: bool = False) -> None:
        super().__init__(message)
        self.reached = reached
        self.stuck = stuck


class Prefetched:
    """A ``Stream`` whose first chunk was read already (within its attempt)."""

    def __init__(self, resp: Stream, first: bytes, rest: AsyncIterator[bytes]) -> None:
        self.status, self.content_type = resp.status, resp.content_type
        self._resp, self._first, self._rest = resp, first, rest

    async def chunks(self) -> AsyncIterator[bytes]:
        if self._first:
            yield self._first
        async for chunk in self._rest:
            yield chunk

    async def read(self) -> bytes:
        return b"".join([c async for c in self.chunks()])

    def close(self) -> None:
        self._resp.close()


def parse_body(raw: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(raw)
    except ValueError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    return body


def prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    out = dict(body)
    out["stream"] = False
    out.pop("stream_options", None)
    out["max_tokens"] = 1
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    out["kv_transfer_params"] = dict(NULL_KV_PARAMS)
    return out


def decode_body(body: dict[str, Any], kv_params: dict[str, Any] | None) -> tuple[dict[str, Any],
                                                                                bool]:
    """The decode hop's body, and whether the router added a usage chunk to a stream.

    A streaming hop always asks for ``include_usage``: vLLM puts the request's usage and
    per-request ``metrics`` in that final chunk, which accounting needs. When the client did
    not ask for it, the relay drops that chunk again.
    """
    out = body if kv_params is None else {**body, "kv_transfer_params": kv_params}
    if not body.get("stream"):
        return out, False
    opts = body.get("stream_options")
    if isinstance(opts, dict) and opts.get("include_usage"):
        return out, False
    extra = opts if isinstance(opts, dict) else {}
    return {**out, "stream_options": {**extra, "include_usage": True}}, True


def release_body(model: str, kv_params: dict[str, Any]) -> dict[str, Any]:
    """A decode-engine request that carries a KV handle and that vLLM's serving layer rejects
    (``max_tokens`` below 1): vLLM then tells the prefill engine to free the handle's blocks
    (``notify_kv_transfer_request_rejected``), reading nothing."""
    return {"model": model, "prompt": [0], "max_tokens": -1, "stream": False,
            "kv_transfer_params": kv_params}


def prefill_answer(reply: Reply) -> dict[str, Any] | None:
    """A successful prefill answer, parsed, when it carries ``kv_transfer_params`` (a dict);
    else None."""
    if reply.status != 200:
        return None
    try:
        data = orjson.loads(reply.body)
    except ValueError:
        return None
    ok = isinstance(data, dict) and isinstance(data.get("kv_transfer_params"), dict)
    return data if ok else None


EMPTY_CHOICES, EMPTY_CHOICES_SPACED = b'"choices":[]', b'"choices": []'


def _empty_choices(event: bytes) -> bool:
    return EMPTY_CHOICES in event or EMPTY_CHOICES_SPACED in event


def _usage_only(event: bytes) -> bool:
    return b'"usage"' in event and _empty_choices(event)


def strip_usage_event(chunk: bytes) -> bytes:
    """Drop the usage-only SSE event (empty ``choices``) from a relayed chunk."""
    if not _empty_choices(chunk):
        return chunk
    return b"\n\n".join(e for e in chunk.split(b"\n\n") if not _usage_only(e))


class Proxy:
    def __init__(self, cluster: Cluster, upstream: Upstream, counter: TokenCounter,
                 requests: RequestLog, metrics: Metrics,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cluster = cluster
        self.upstream = upstream
        self.counter = counter
        self.requests = requests
        self.metrics = metrics
        self.clock = clock
        s = cluster.settings
        self._link = profiles.link(s.hardware.kv_link)
        self._block = s.kv_block_size
        self._late_s = s.kv.lease_s * s.kv.late_hop_share
        self._model = s.model.public_name
        self._background: set[asyncio.Task[None]] = set()

    # ---- entry -----------------------------------------------------------------------

    def new_ctx(self, endpoint: str, raw: bytes, request_id: str | None) -> Ctx:
        t0, started_at = time.perf_counter(), time.time()  # parsing and counting are in TTFT
        body = parse_body(raw)
        if endpoint.endswith("chat/completions") and not isinstance(body.get("messages"), list):
            raise BadRequest("'messages' must be a list")
        if endpoint.endswith("/completions") and "messages" not in body and "prompt" not in body:
            raise BadRequest("'prompt' is required")
        return Ctx(rid=request_id or new_request_id(), endpoint=endpoint, body=body,
                   stream=bool(body.get("stream")), prompt_tokens=self.counter.count(body),
                   t0=t0, started_at=started_at)

    async def open(self, ctx: Ctx) -> Stream:
        """Choose the decode instance, run the prefill hop (disaggregated path) and open the
        decode hop.

        Returns the decode engine's answer: a live stream (streaming, status 200) or the
        whole answer; the caller relays it, closes it and then calls ``finish``.
        """
        first = self.cluster.pick(Role.DECODE, set())
        if first is None:
            raise NoInstanceAvailable("no ready decode instance")
        self._assign_decode(ctx, first)
        threshold = self.cluster.routing.disagg_min_prompt_tokens
        if ctx.prompt_tokens >= threshold and self.cluster.ready(Role.PREFILL):
            ctx.path = RequestPath.DISAGGREGATED  # also when cancelled during the prefill hop
            done = await self._prefill(ctx)
            if done is not None:
                resp = await self._decode_with_kv(ctx, done)
                if resp is not None:
                    return resp
            ctx.path = RequestPath.COLOCATED
        return await self._colocated(ctx)

    async def close(self) -> None:
        """Wait briefly for the releases in flight; cancel what is left."""
        if self._background:
            _, pending = await asyncio.wait(set(self._background), timeout=5.0)
            for task in pending:
                task.cancel()

    # ---- hops ------------------------------------------------------------------------

    def _headers(self, ctx: Ctx) -> dict[str, str]:
        return {"X-Request-Id": ctx.rid, "Content-Type": "application/json"}

    def _sending(self, ctx: Ctx) -> float:
        """Now; on the request's first hop also observe the routing decision's latency
        (arrival to first hop sent: parsing, token counting, policy)."""
        now = time.perf_counter()
        if not ctx.routed:
            ctx.routed = True
            self.metrics.routing_decision.observe(now - ctx.t0)
        return now

    def _assign_decode(self, ctx: Ctx, inst: Instance) -> None:
        """Make ``inst`` the request's decode instance, counted in its inflight from now on
        (a draining instance waits for it)."""
        if ctx.decode is inst and ctx.decode_open:
            return
        if ctx.decode is not None and ctx.decode_open:
            ctx.decode.inflight -= 1
        inst.inflight += 1
        ctx.decode, ctx.decode_open = inst, True

    async def _prefill(self, ctx: Ctx) -> PrefillDone | None:
        payload = orjson.dumps(prefill_body(ctx.body))
        tried: set[str] = set()
        for _ in range(self.cluster.routing.max_attempts):
            inst = self.cluster.pick(Role.PREFILL, tried)
            if inst is None:
                break
            tried.add(inst.id)
            sent = self._sending(ctx)
            reply = await self._prefill_hop(ctx, inst, payload)
            if reply is None:
                continue
            data = prefill_answer(reply)
            if data is None:
                ctx.errors.append(f"prefill {inst.id} answered {reply.status}"
                                  + ("" if reply.status != 200 else " with no kv_transfer_params"))
                ctx.retries += 1
                continue
            ctx.prefill = inst
            ctx.prefill_times = EngineTimes.parse(data.get("metrics"))
            ctx.prefill_wall_ms = (time.perf_counter() - sent) * 1e3
            return PrefillDone(inst, data["kv_transfer_params"], self.clock())
        log.warning("%s: prefill hop failed (%s); serving colocated", ctx.rid,
                    "; ".join(ctx.errors) or "no prefill instance")
        return None

    async def _prefill_hop(self, ctx: Ctx, inst: Instance, payload: bytes) -> Reply | None:
        """POST the prefill hop. If the client leaves meanwhile, the hop is left to finish and
        whatever KV it holds is released: aborting it instead would race with its end, and an
        answer lost in that race leaves its blocks held for the whole lease."""
        inst.inflight += 1
        hop = asyncio.ensure_future(
            self.upstream.post(f"{inst.url}{ctx.endpoint}", payload, self._headers(ctx)))
        try:
            reply = await asyncio.shield(hop)
        except asyncio.CancelledError:
            # ``_release_after`` ends the hop's inflight count when the hop is over.
            self._spawn(self._release_after(hop, inst, ctx.decode, ctx.rid))
            raise
        except UpstreamError as exc:
            inst.inflight -= 1
            self._unreachable(ctx, inst, exc)
            return None
        except BaseException:
            inst.inflight -= 1
            raise
        inst.inflight -= 1
        return reply

    async def _release_after(self, hop: asyncio.Future[Reply], prefill: Instance,
                             decode: Instance | None, rid: str) -> None:
        try:
            reply = await hop
        except (UpstreamError, asyncio.CancelledError):
            return  # no answer: the engine aborted the request or failed; nothing is held
        finally:
            prefill.inflight -= 1
        data = prefill_answer(reply)
        if data is not None:
            await self._release(data["kv_transfer_params"], decode, "client_gone", rid)

    async def _decode_with_kv(self, ctx: Ctx, done: PrefillDone) -> Stream | None:
        """The decode hop carrying the prefill's KV handle, sent once. None: serve the
        request colocated (the handle was released, or may have been read)."""
        body, ctx.strip_usage = decode_body(ctx.body, done.kv_params)
        payload = orjson.dumps(body)
        tried: set[str] = set()
        inst: Instance | None = ctx.decode
        while inst is not None and len(tried) < self.cluster.routing.max_attempts:
            late = self.clock() - done.answered_at
            if late > self._late_s:
                ctx.errors.append(f"decode hop {late:.1f} s after the prefill answered (limit "
                                  f"{self._late_s:g} s of a {self.cluster.settings.kv.lease_s} s "
                                  "lease)")
                self._spawn(self._release(done.kv_params, inst, "late", ctx.rid))
                return None
            self._assign_decode(ctx, inst)
            tried.add(inst.id)
            try:
                resp = await self._attempt(ctx, inst, payload, resend=False,
                                           first_by=done.answered_at + self._late_s)
            except AttemptFailed as exc:
                if exc.reached:
                    # The handle may have been read: it is never sent again. (A hop aborted
                    # for a stuck read answered nobody: its late read cannot taint output.)
                    ctx.kv_handle = None if exc.stuck else done.handle
                    return None
            else:
                ctx.kv_handle = done.handle
                return resp
            inst = self.cluster.pick(Role.DECODE, tried)
        self._spawn(self._release(done.kv_params, ctx.decode, "decode_unavailable", ctx.rid))
        return None

    async def _colocated(self, ctx: Ctx) -> Stream:
        body, ctx.strip_usage = decode_body(ctx.body, None)
        payload = orjson.dumps(body)
        tried: set[str] = set()
        inst: Instance | None = ctx.decode
        for attempt in range(self.cluster.routing.max_attempts):
            if inst is None or inst.id in tried or inst.id in ctx.failed_decodes:
                inst = self._pick_colocated(tried | ctx.failed_decodes, tried)
            if inst is None and tried:
                # Every ready decode instance was tried once (most could not be reached).
                # Nothing went to the client yet, so try again after a pause, not fail.
                await asyncio.sleep(RETRY_PAUSE_S * attempt)
                tried = set()
                inst = self._pick_colocated(ctx.failed_decodes, tried)
            if inst is None:
                break
            self._assign_decode(ctx, inst)
            tried.add(inst.id)
            try:
                return await self._attempt(ctx, inst, payload, resend=True)
            except AttemptFailed:
                if ctx.reached_failures >= MAX_REACHED_FAILURES:
                    break
            inst = None
        if ctx.errors:
            raise UpstreamUnreachable("no decode instance could serve the request: "
                                      + "; ".join(ctx.errors[-3:]))
        raise NoInstanceAvailable("no ready decode instance")

    def _pick_colocated(self, avoid: set[str], tried: set[str]) -> Instance | None:
        """A decode instance for a colocated attempt: one that has not failed this request
        if there is one, else (a single-instance pool, say) one that did but is not yet
        tried again in this round; engines that died refuse the connection."""
        return self.cluster.pick(Role.DECODE, avoid) or self.cluster.pick(Role.DECODE, tried)

    async def _attempt(self, ctx: Ctx, inst: Instance, payload: bytes, resend: bool,
                       first_by: float | None = None) -> Stream:
        """One decode hop to ``inst``: a stream whose first chunk is here (streaming, 200) or
        the whole answer. Raises ``AttemptFailed`` for an unreachable engine, a lost
        connection, a 5xx, or no first chunk by ``first_by`` (router clock)."""
        ctx.decode_sent = self._sending(ctx)
        try:
            resp = await self.upstream.open(f"{inst.url}{ctx.endpoint}", payload,
                                            self._headers(ctx), resend)
        except UpstreamError as exc:
            self._unreachable(ctx, inst, exc)
            raise self._failed(ctx, inst, str(exc), exc.sent) from None
        if ctx.stream and resp.status == 200:
            return await self._first_chunk(ctx, inst, resp, first_by)
        try:
            content = await resp.read()
        except UpstreamError as exc:
            self._unreachable(ctx, inst, exc)
            raise self._failed(ctx, inst, f"{inst.id} failed before answering: {exc}",
                               True) from None
        finally:
            resp.close()
        if resp.status >= 500:
            ctx.errors.append(f"decode {inst.id} answered {resp.status}")
            raise self._failed(ctx, inst, f"{inst.id} answered {resp.status}", True)
        return Buffered(resp.status, resp.content_type, content)

    async def _first_chunk(self, ctx: Ctx, inst: Instance, resp: Stream,
                           first_by: float | None) -> Stream:
        """Wait for a stream's first chunk within its attempt: until it comes nothing has
        reached the client, so a failure is still retried. A disaggregated hop whose first
        token has not come by ``first_by`` is aborted: its KV read is stuck, and vLLM would
        complete it after the prefill's lease expired, from blocks that may be reused
        (docs/routing-and-accounting.md, "A stuck KV read")."""
        chunks = resp.chunks().__aiter__()
        timeout = None if first_by is None else max(0.0, first_by - self.clock())
        try:
            first = await asyncio.wait_for(anext(chunks), timeout)
        except StopAsyncIteration:
            first = b""
        except TimeoutError:
            resp.close()  # the engine aborts the request; the late read's output is dropped
            self.metrics.kv_stuck_reads.inc()
            msg = (f"decode {inst.id} had no token {self._late_s:g} s after the prefill "
                   "answered (KV read stuck); aborted")
            ctx.errors.append(msg)
            raise self._failed(ctx, inst, msg, True, stuck=True) from None
        except UpstreamError as exc:
            resp.close()
            self._unreachable(ctx, inst, exc)
            raise self._failed(ctx, inst, f"{inst.id} failed before its first token: {exc}",
                               True) from None
        except BaseException:
            resp.close()
            raise
        ctx.first_at = time.perf_counter()
        return Prefetched(resp, first, chunks)

    def _failed(self, ctx: Ctx, inst: Instance, message: str, reached: bool,
                stuck: bool = False) -> AttemptFailed:
        ctx.retries += 1
        if reached:
            ctx.reached_failures += 1
            ctx.failed_decodes.add(inst.id)
        return AttemptFailed(message, reached, stuck)

    def _unreachable(self, ctx: Ctx, inst: Instance, exc: Exception) -> None:
        msg = f"{inst.id} unreachable: {exc}"
        ctx.errors.append(msg)
        self.cluster.report_unreachable(inst, msg)

    # ---- releasing KV that will not be read ------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _release(self, kv: dict[str, Any], hint: Instance | None, reason: str,
                       rid: str) -> None:
        """Have a decode engine tell the prefill to free a handle's blocks; counted."""
        inst = hint if hint is not None and not hint.state.terminal else None
        inst = inst or self.cluster.pick(Role.DECODE, set())
        outcome = "failed"
        if inst is not None:
            payload = orjson.dumps(release_body(self._model, kv))
            headers = {"X-Request-Id": f"{rid}-release", "Content-Type": "application/json"}
            try:
                reply = await self.upstream.post(f"{inst.url}{RELEASE_PATH}", payload, headers,
                                                 resend=False)
                outcome = "ok" if reply.status < 500 else "failed"
            except UpstreamError as exc:
                log.warning("%s: releasing KV handle through %s failed: %s", rid, inst.id, exc)
        self.metrics.kv_releases.labels(reason, outcome).inc()
        if outcome == "failed":
            log.warning("%s: KV handle %s not released (%s); the prefill frees it when its "
                        "lease expires", rid, kv.get("remote_request_id"), reason)

    # ---- accounting --------------------------------------------------------------------

    def finish(self, ctx: Ctx, status: str, response: dict[str, Any] | None,
               error: str | None = None) -> RequestRecord:
        """Record the request; ``response`` is the final JSON (or last stream event)."""
        now = time.perf_counter()
        ctx.finished = True
        if ctx.decode is not None and ctx.decode_open:
            ctx.decode.inflight -= 1
            ctx.decode_open = False
        usage = (response or {}).get("usage") or {}
        decode_times = EngineTimes.parse((response or {}).get("metrics"))
        prompt_tokens = int(usage.get("prompt_tokens") or ctx.prompt_tokens)
        disagg = ctx.path is RequestPath.DISAGGREGATED
        kv_bytes = (profiles.kv_bytes(self.cluster.model, prompt_tokens, self._block)
                    if disagg and ctx.prefill is not None else 0)  # none if prefill never ended
        if ctx.first_at is not None:
            ttft = (ctx.first_at - ctx.t0) * 1e3
            to_first = (ctx.first_at - ctx.decode_sent) * 1e3
        else:
            # Non-streaming: the client sees no first token; derive it from when the decode
            # hop was sent plus the decode engine's own queue + first-token time.
            engine = (decode_times.queue_ms + decode_times.ttft_ms) if decode_times else 0.0
            to_first = engine or (now - ctx.decode_sent) * 1e3
            ttft = (ctx.decode_sent - ctx.t0) * 1e3 + to_first
        b = breakdown(Observation(
            ttft_ms=ttft, disaggregated=disagg, prefill=ctx.prefill_times,
            prefill_wall_ms=ctx.prefill_wall_ms, decode=decode_times,
            decode_wall_to_first_ms=to_first,
            transfer_model_ms=self._transfer_estimate_ms(ctx, kv_bytes),
        ))
        rec = RequestRecord(
            id=ctx.rid, started_at=ctx.started_at, endpoint=ctx.endpoint, path=ctx.path,
            status=status, stream=ctx.stream, prompt_tokens=prompt_tokens,
            output_tokens=int(usage.get("completion_tokens") or 0),
            prefill_instance=ctx.prefill.id if ctx.prefill else None,
            decode_instance=ctx.decode.id if ctx.decode else None,
            queue_ms=b.queue_ms, prefill_ms=b.prefill_ms, transfer_ms=b.transfer_ms,
            decode_sched_ms=b.decode_sched_ms, overhead_ms=b.overhead_ms, ttft_ms=b.ttft_ms,
            itl_ms=decode_times.itl_ms if decode_times else 0.0,
            e2e_ms=round((now - ctx.t0) * 1e3, 3), kv_bytes=kv_bytes, retries=ctx.retries,
            error=error, kv_handle=ctx.kv_handle,
        )
        self.requests.add(rec)
        self.metrics.observe(rec)
        return rec

    def _transfer_estimate_ms(self, ctx: Ctx, kv_bytes: int) -> float:
        """The decode instance's recent mean NIXL transfer time when it reports NIXL
        metrics, else the modelled time of ``kv_bytes`` over the configured link."""
        if ctx.decode is not None and ctx.decode.recent_xfer_ms > 0:
            return ctx.decode.recent_xfer_ms
        return profiles.transfer_seconds(kv_bytes, self._link) * 1e3

    def fail(self, ctx: Ctx, exc: RoutingError | Exception) -> RequestRecord:
        """Record a request that failed (a client that left is recorded by ``finish``)."""
        return self.finish(ctx, "error", None, error=str(exc) or type(exc).__name__)


def last_event(tail: bytes) -> dict[str, Any] | None:
    """The last JSON ``data:`` event of an SSE stream tail that carries usage or metrics,
    else the last JSON event."""
    found: dict[str, Any] | None = None
    for line in reversed(tail.split(b"\n")):
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]" or not data.startswith(b"{"):
            continue
        try:
            event = orjson.loads(data)
        except ValueError:
            continue
        if not isinstance(event, dict):
            continue
        if found is None:
            found = event
        if "metrics" in event or "usage" in event and event["usage"]:
            merged = dict(event)
            for key in ("usage", "metrics"):
                if not merged.get(key) and found.get(key):
                    merged[key] = found[key]
            if merged.get("metrics") and merged.get("usage"):
                return merged
            found = merged
    return found
