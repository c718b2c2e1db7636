"""One client request while the router serves it (``Ctx``), its id, and the prefill's answer
that the decode hop carries on (``PrefillDone``)."""

from __future__ import annotations

import itertools
import os
import re
from dataclasses import dataclass, field
from typing import Any

from controller.errors import RoutingError
from controller.models import Instance, RequestPath
from controller.router.accounting import EngineTimes
from controller.router.handoff import HandoffDecision
from controller.router.policies import PromptBlocks
from controller.router.table import Lease

_ID_PREFIX = f"pdctl-{os.urandom(6).hex()}-"
_ID_SEQ = itertools.count(1)


_TRACEPARENT = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")


def trace_context(traceparent: str | None, tracestate: str | None) -> tuple[tuple[str, str], ...]:
    """The client's W3C trace context, as the headers both hops carry: none for a missing or
    malformed ``traceparent`` (W3C Trace Context: lower-case hex, not version ff, no all-zero
    trace or parent id; a malformed one is ignored, with its ``tracestate``)."""
    if traceparent is None:
        return ()
    value = traceparent.strip()
    if (_TRACEPARENT.fullmatch(value) is None or value.startswith("ff-")
            or value[3:35] == "0" * 32 or value[36:52] == "0" * 16):
        return ()
    if tracestate:
        return (("traceparent", value), ("tracestate", tracestate.strip()))
    return (("traceparent", value),)


def new_request_id() -> str:
    """Unique per controller run (random prefix) and cheap: one per client request."""
    return f"{_ID_PREFIX}{next(_ID_SEQ)}"


@dataclass
class Ctx:
    """Everything known about one client request while it is served. Written by the proxy
    only; ``Proxy.serve`` turns it into the request's record once, when it ends."""

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
    router_queue_ms: float = 0.0  # waited in the router for a prefill slot
    decode: Instance | None = None
    decode_lease: Lease | None = None  # ``decode`` counts this request in flight
    decode_sent: float = 0.0
    kv_handle: str | None = None  # the prefill's request id, once a decode hop carried it
    first_at: float | None = None
    gaps: list[float] = field(default_factory=list)  # seconds between streamed chunks
    routed: bool = False  # the first hop has been sent (routing decision observed)
    retries: int = 0
    reached_failures: int = 0  # failed attempts that may have reached an engine
    failed_decodes: set[str] = field(default_factory=set)  # failed after reaching them
    errors: list[str] = field(default_factory=list)
    strip_usage: bool = False  # the router asked for a usage chunk the client did not
    rejection: RoutingError | None = None  # refused before routing: why
    blocks: PromptBlocks | None = None  # the prompt's blocks, when a pool routes by cache
    # Prompt tokens the index says the prefill instance (disaggregated) or the colocated
    # decode instance holds, what the prefill engine reported, and what the decode
    # instance of a disaggregated request holds (not pulled over NIXL).
    cached_predicted: int | None = None
    prefill_cached: int | None = None
    decode_cached_predicted: int | None = None
    decision: HandoffDecision | None = None  # the hand-off decision, once made
    trace: tuple[tuple[str, str], ...] = ()  # the trace context every hop carries
    span: Any = None  # the request's OpenTelemetry span (``controller.router.tracing``), if on


@dataclass
class PrefillDone:
    instance: Instance
    kv_params: dict[str, Any]
    answered_at: float  # router clock when the answer arrived: the lease runs from about then
    incarnation: int = 0  # the prefill instance's when it answered (a restart voids the handle)

    @property
    def void(self) -> bool:
        """The prefill engine restarted since it answered: its handle names blocks of an
        engine that is gone."""
        return self.instance.incarnation != self.incarnation

    @property
    def handle(self) -> str | None:
        rid = self.kv_params.get("remote_request_id")
        return rid if isinstance(rid, str) else None
