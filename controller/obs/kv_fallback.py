"""Silent fallback: a request routed disaggregated whose decode engine computed the prompt
itself, because the KV never arrived.

vLLM started with ``kv_load_failure_policy: recompute`` (the lab's default) answers such a
request with HTTP 200 and correct output; only its counters tell: the prompt's tokens are
counted as ``vllm:prompt_tokens_by_source{source="local_compute"}`` instead of
``external_kv_transfer`` (and, when a transfer started and failed,
``vllm:nixl_num_failed_transfers``). The client sees a slow TTFT; the operator sees a P/D
fleet quietly running decode-only.

``FallbackWatch`` keeps, per decode instance, how many prompt tokens the router has given it
to compute: an upper bound per request in flight (its whole prompt when served colocated, one
block when its KV comes from a prefill), replaced by the engine-reported figure when the
request ends (prompt tokens minus ``cached_tokens``). After every load poll
(``check``) it compares that allowance with the engine's ``local_compute`` counter; tokens
computed beyond it are the disaggregated requests' prompts, computed locally. They are
attributed to that instance's recent disaggregated requests, oldest first (each takes its
uncached prompt tokens), which are flagged ``kv_fallback`` on their records, counted per
(prefill, decode) pair in ``pdctl_kv_fallback_requests_total`` and recorded in the audit
log. An engine that exports no such counter is not watched.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from controller.metrics import Metrics
from controller.models import Instance, RequestRecord, Role
from controller.requests_log import RequestLog
from controller.store import Store

RECENT = 256  # disaggregated requests per decode instance kept as attribution candidates
EVENTS_KEPT = 1000


@dataclass
class _Pending:
    prefill: str | None  # None: served colocated
    allowance: int  # prompt tokens it may compute (upper bound while in flight)
    uncached: int  # prompt tokens a fallback would compute (disaggregated)


@dataclass(frozen=True)
class FallbackEvent:
    at: float  # unix time
    prefill: str
    decode: str
    request: str
    tokens: int  # prompt tokens the decode engine computed instead of receiving


@dataclass
class _Decode:
    base: float | None = None  # the counter when first seen, plus what was attributed
    done: float = 0.0  # tokens allowed for the requests that ended
    pending: dict[str, _Pending] | None = None
    recent: deque[tuple[str, str, int]] | None = None  # (request, prefill, uncached)

    def __post_init__(self) -> None:
        self.pending = {}
        self.recent = deque(maxlen=RECENT)


class FallbackWatch:
    def __init__(self, requests: RequestLog, metrics: Metrics, store: Store,
                 slack_tokens: int, clock: Callable[[], float] = time.time) -> None:
        self._requests, self._metrics, self._store = requests, metrics, store
        self._slack = slack_tokens  # what a decode engine computes of a prompt it received
        self._clock = clock
        self._decodes: dict[str, _Decode] = {}
        self._flagged: set[str] = set()  # requests flagged, the newest EVENTS_KEPT
        self.events: deque[FallbackEvent] = deque(maxlen=EVENTS_KEPT)

    def _state(self, decode: str) -> _Decode:
        st = self._decodes.get(decode)
        if st is None:
            st = self._decodes[decode] = _Decode()
        return st

    # ---- the router's side (O(1) per request) ----------------------------------------------

    def sent(self, rid: str, decode: str, prefill: str | None, prompt_tokens: int,
             uncached: int) -> None:
        """A decode hop to ``decode`` carries request ``rid``: with the KV of ``prefill``,
        or (None) to compute its ``prompt_tokens`` itself."""
        st = self._state(decode)
        allowance = prompt_tokens if prefill is None else min(prompt_tokens, self._slack)
        assert st.pending is not None
        st.pending[rid] = _Pending(prefill, allowance, uncached)

    def ended(self, rec: RequestRecord) -> None:
        """The request ended: its allowance becomes what its engine reported."""
        for name in {rec.decode_instance, *self._sent_to(rec.id)} - {None}:
            st = self._decodes.get(str(name))
            if st is None or st.pending is None:
                continue
            p = st.pending.pop(rec.id, None)
            if p is None:
                continue
            if p.prefill is None and name == rec.decode_instance and rec.cached_tokens is not None:
                st.done += max(0, rec.prompt_tokens - rec.cached_tokens)
            else:
                st.done += p.allowance
            if p.prefill is not None and name == rec.decode_instance:
                assert st.recent is not None
                st.recent.append((rec.id, p.prefill, p.uncached))
        if rec.id in self._flagged:
            rec.kv_fallback = True

    def _sent_to(self, rid: str) -> list[str]:
        return [d for d, st in self._decodes.items() if st.pending and rid in st.pending]

    # ---- after each load poll ----------------------------------------------------------------

    def check(self, instances: list[Instance]) -> None:
        live = {i.id for i in instances}
        for gone in set(self._decodes) - live:
            del self._decodes[gone]
        for inst in instances:
            if inst.role is Role.DECODE and inst.local_compute is not None:
                self._check(inst.id, inst.local_compute)

    def _check(self, decode: str, counter: float) -> None:
        st = self._state(decode)
        if st.base is None or counter < st.base:  # first seen, or the engine restarted
            st.base, st.done = counter, 0.0
            assert st.pending is not None
            for p in st.pending.values():  # what they computed may be counted already
                st.base -= p.allowance
            return
        assert st.pending is not None and st.recent is not None
        allowed = st.done + sum(p.allowance for p in st.pending.values())
        excess = counter - st.base - allowed
        if excess < self._slack:
            return
        candidates = [(rid, p.prefill, p.uncached) for rid, p in st.pending.items()
                      if p.prefill is not None] + list(st.recent)
        taken = 0.0
        for rid, prefill, uncached in candidates:
            if rid in self._flagged or uncached <= 0 or excess - taken < uncached / 2:
                continue
            taken += uncached
            self._flag(rid, prefill, decode, uncached)
        st.base += excess  # explained or not, counted once

    def _flag(self, rid: str, prefill: str, decode: str, tokens: int) -> None:
        if len(self.events) == EVENTS_KEPT:
            self._flagged.discard(self.events[0].request)
        self._flagged.add(rid)
        self.events.append(FallbackEvent(self._clock(), prefill, decode, rid, tokens))
        self._metrics.kv_fallback.labels(prefill, decode).inc()
        rec = self._requests.find(rid)
        if rec is not None:
            rec.kv_fallback = True
        self._store.record("controller", "kv.fallback", decode, None, prefill,
                           f"request {rid} was routed disaggregated ({prefill} -> {decode}) "
                           f"but {decode} computed its {tokens:,} prompt tokens itself: the "
                           "KV never arrived")

    def summary(self, window_s: float) -> dict[str, Any]:
        """Fallbacks within the window, per (prefill, decode) pair."""
        since = self._clock() - window_s
        pairs: dict[tuple[str, str], int] = {}
        for e in self.events:
            if e.at >= since:
                pairs[(e.prefill, e.decode)] = pairs.get((e.prefill, e.decode), 0) + 1
        return {"fallback_requests": sum(pairs.values()),
                "fallback_pairs": [{"prefill": p, "decode": d, "requests": n}
                                   for (p, d), n in sorted(pairs.items())]}
