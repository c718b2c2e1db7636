"""The two-hop proxy: parse -> choose path -> prefill hop -> decode hop (relayed) -> account.

The disaggregated flow is the one vLLM's NixlConnector expects: the prefill instance gets the
request with ``max_tokens=1``, ``stream=false`` and ``kv_transfer_params.do_remote_decode``;
its answer's ``kv_transfer_params`` go, with the original request, to a decode instance,
which pulls the KV and generates. Prompts shorter than ``disagg_min_prompt_tokens`` -- or
any request when no prefill instance is ready or the prefill hop fails -- take the colocated
path: the decode instance prefills itself. An unreachable instance is retried on another
before any byte has gone to the client.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from controller import profiles
from controller.cluster import Cluster
from controller.errors import (
    BadRequest,
    NoInstanceAvailable,
    RoutingError,
    UpstreamFailed,
    UpstreamUnreachable,
)
from controller.metrics import Metrics
from controller.models import Instance, RequestPath, RequestRecord, Role
from controller.requests_log import RequestLog
from controller.router.accounting import EngineTimes, Observation, breakdown
from controller.router.upstream import Stream, Upstream, UpstreamError
from controller.tokens import TokenCounter

log = logging.getLogger("pdctl.router")

NULL_KV_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False,
                  "remote_engine_id": None, "remote_block_ids": None,
                  "remote_host": None, "remote_port": None}
TAIL_BYTES = 16384
RETRY_PAUSE_S = 0.5  # times the attempt number, before retrying decode instances that failed


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
    decode_open: bool = False  # a decode response is open and counted in its inflight
    first_at: float | None = None
    routed: bool = False  # the first hop has been sent (routing decision observed)
    finished: bool = False  # recorded by ``finish``
    retries: int = 0
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


def _is_kv_load_failure(body: bytes) -> bool:
    return b"kv_load_failure" in body or b"KV load" in body


class Proxy:
    def __init__(self, cluster: Cluster, upstream: Upstream, counter: TokenCounter,
                 requests: RequestLog, metrics: Metrics) -> None:
        self.cluster = cluster
        self.upstream = upstream
        self.counter = counter
        self.requests = requests
        self.metrics = metrics
        s = cluster.settings
        self._link = profiles.link(s.hardware.kv_link)
        self._block = s.kv_block_size

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
        """Run the prefill hop (when the path is disaggregated) and open the decode hop.

        Returns the decode engine's response with status read and body not yet consumed;
        the caller relays it, closes it and then calls ``finish``.
        """
        kv_params = None
        threshold = self.cluster.routing.disagg_min_prompt_tokens
        if ctx.prompt_tokens >= threshold and self.cluster.ready(Role.PREFILL):
            ctx.path = RequestPath.DISAGGREGATED  # also when cancelled during the prefill hop
            done = await self._prefill(ctx)
            if done is None:
                ctx.path = RequestPath.COLOCATED
            else:
                kv_params = done.kv_params
        try:
            return await self._open_decode(ctx, kv_params)
        except UpstreamFailed as exc:
            if kv_params is None or not exc.kv_load_failure:
                raise
            # The decode engine could not load the KV (prefill gone, handle expired): serve
            # the request colocated instead of failing it.
            ctx.errors.append(f"KV load failed on {ctx.decode.id if ctx.decode else '?'}")
            ctx.path = RequestPath.COLOCATED
            ctx.retries += 1
            return await self._open_decode(ctx, None)

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

    async def _prefill(self, ctx: Ctx) -> PrefillDone | None:
        payload = orjson.dumps(prefill_body(ctx.body))
        tried: set[str] = set()
        for _ in range(self.cluster.routing.max_attempts):
            inst = self.cluster.pick(Role.PREFILL, tried)
            if inst is None:
                break
            tried.add(inst.id)
            sent = self._sending(ctx)
            inst.inflight += 1
            try:
                r = await self.upstream.post(f"{inst.url}{ctx.endpoint}", payload,
                                             self._headers(ctx))
            except UpstreamError as exc:
                self._unreachable(ctx, inst, exc)
                continue
            finally:
                inst.inflight -= 1
            if r.status != 200:
                ctx.errors.append(f"prefill {inst.id} answered {r.status}")
                ctx.retries += 1
                continue
            try:
                data = orjson.loads(r.body)
            except ValueError:
                data = None
            kv = data.get("kv_transfer_params") if isinstance(data, dict) else None
            if not isinstance(kv, dict):
                ctx.errors.append(f"prefill {inst.id} returned no kv_transfer_params")
                continue
            assert isinstance(data, dict)
            ctx.prefill = inst
            ctx.prefill_times = EngineTimes.parse(data.get("metrics"))
            ctx.prefill_wall_ms = (time.perf_counter() - sent) * 1e3
            return PrefillDone(inst, kv)
        log.warning("%s: prefill hop failed (%s); serving colocated", ctx.rid,
                    "; ".join(ctx.errors) or "no prefill instance")
        return None

    def _unreachable(self, ctx: Ctx, inst: Instance, exc: Exception) -> None:
        msg = f"{inst.id} unreachable: {exc}"
        ctx.errors.append(msg)
        ctx.retries += 1
        self.cluster.report_unreachable(inst, msg)

    async def _open_decode(self, ctx: Ctx, kv_params: dict[str, Any] | None) -> Stream:
        body, ctx.strip_usage = decode_body(ctx.body, kv_params)
        payload = orjson.dumps(body)
        tried: set[str] = set()
        for attempt in range(self.cluster.routing.max_attempts):
            inst = self.cluster.pick(Role.DECODE, tried)
            if inst is None and tried:
                # Every ready decode instance failed once. Nothing reached the client yet, so
                # try them again after a pause rather than fail the request.
                await asyncio.sleep(RETRY_PAUSE_S * attempt)
                tried.clear()
                inst = self.cluster.pick(Role.DECODE, tried)
            if inst is None:
                break
            tried.add(inst.id)
            inst.inflight += 1
            ctx.decode = inst
            ctx.decode_sent = self._sending(ctx)
            try:
                resp = await self.upstream.open(f"{inst.url}{ctx.endpoint}", payload,
                                                self._headers(ctx))
            except UpstreamError as exc:
                inst.inflight -= 1
                self._unreachable(ctx, inst, exc)
                continue
            except BaseException:
                inst.inflight -= 1
                raise
            if resp.status < 500:
                ctx.decode_open = True
                return resp
            try:
                text = await resp.read()
            except UpstreamError:
                text = b""
            finally:
                resp.close()
                inst.inflight -= 1
            if kv_params is not None and _is_kv_load_failure(text):
                raise UpstreamFailed(f"decode {inst.id} could not load the KV cache",
                                     resp.status, text, kv_load_failure=True)
            ctx.errors.append(f"decode {inst.id} answered {resp.status}")
            ctx.retries += 1
        if ctx.errors:
            raise UpstreamUnreachable("no decode instance could serve the request: "
                                      + "; ".join(ctx.errors[-3:]))
        raise NoInstanceAvailable("no ready decode instance")

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
            error=error,
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
