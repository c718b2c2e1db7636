"""What the ``slo`` hand-off decision weighs (``slo_inputs``) and what it needs to know of
the fleet's speed, learnt from the requests it serves: each pool's prefill cost per uncached
token, the KV transfer cost per token moved, the second hop's overhead, and the recent TTFT
p95.

Each cost is an exponentially weighted mean of what finished requests measured (their TTFT
parts, ``controller.router.accounting``), so it follows load: a prefill engine that batches
several prompts computes each more slowly, and the decision sees it. Until a pool has served
a request the model's roofline stands in (``prior``). Observing a record is O(1); the TTFT
p95 is recomputed at most once per ``P95_EVERY`` records.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from controller.config import Settings
from controller.models import Instance, RequestPath, RequestRecord, Role
from controller.router.handoff import Inputs
from controller.router.request import Ctx
from controller.router.table import RoutingTable
from pdctl_api import profiles
from pdctl_api.stats import quantiles

ALPHA = 0.1  # weight of the newest measurement
TTFT_WINDOW = 200  # recent requests the TTFT p95 is taken over
MIN_FOR_P95 = 20
P95_EVERY = 10
MIN_TOKENS = 16  # prompts shorter than this say more about overheads than per-token cost


@dataclass
class Prior:
    """Starting costs (ms per token) before anything is measured."""

    prefill_ms_per_token: float
    local_ms_per_token: float
    transfer_ms_per_token: float
    hop_ms: float = 2.0


class HandoffRates:
    def __init__(self, prior: Prior) -> None:
        self.prefill_ms_per_token = prior.prefill_ms_per_token
        self.local_ms_per_token = prior.local_ms_per_token
        self.transfer_ms_per_token = prior.transfer_ms_per_token
        self.hop_ms = prior.hop_ms
        self._ttft: deque[float] = deque(maxlen=TTFT_WINDOW)
        self._since_p95 = 0
        self._p95: float | None = None

    @staticmethod
    def _ewma(old: float, new: float) -> float:
        return old + ALPHA * (new - old)

    def observe(self, rec: RequestRecord) -> None:
        """Learn from one finished request."""
        if rec.status != "ok":
            return
        self._ttft.append(rec.ttft_ms)
        self._since_p95 += 1
        uncached = rec.prompt_tokens - (rec.cached_tokens or 0)
        if uncached >= MIN_TOKENS and rec.prefill_ms > 0:
            per_token = rec.prefill_ms / uncached
            if rec.path is RequestPath.DISAGGREGATED:
                self.prefill_ms_per_token = self._ewma(self.prefill_ms_per_token, per_token)
            else:
                self.local_ms_per_token = self._ewma(self.local_ms_per_token, per_token)
        if rec.path is RequestPath.DISAGGREGATED and rec.prefill_instance is not None:
            moved = rec.prompt_tokens - (rec.decode_cached_tokens_predicted or 0)
            if moved >= MIN_TOKENS:
                self.transfer_ms_per_token = self._ewma(self.transfer_ms_per_token,
                                                        rec.transfer_ms / moved)
            self.hop_ms = self._ewma(self.hop_ms, rec.overhead_ms + rec.decode_sched_ms)

    def ttft_p95(self) -> float | None:
        """TTFT p95 over the last ``TTFT_WINDOW`` requests (None: fewer than ``MIN_FOR_P95``)."""
        if len(self._ttft) < MIN_FOR_P95:
            return None
        if self._p95 is None or self._since_p95 >= P95_EVERY:
            q = quantiles(list(self._ttft), (0.95,))
            self._p95 = q[0] if q else None
            self._since_p95 = 0
        return self._p95


def handoff_prior(settings: Settings) -> Prior:
    """Costs from the model's roofline on the configured hardware and link (wall time, so a
    simulated fleet's time scale counts), or plain guesses for a model or hardware no profile
    describes.
    Measurements replace them within a few requests."""
    scale = settings.time_scale
    model = settings.known_profile
    try:
        hw = profiles.hardware(settings.hardware.accelerator)
        lk = profiles.link(settings.hardware.kv_link)
    except (KeyError, ValueError):
        model = None
    if model is None:
        return Prior(prefill_ms_per_token=0.5, local_ms_per_token=0.5,
                     transfer_ms_per_token=0.01)
    return roofline_prior(model, hw, lk, settings.pools.prefill.tp,
                          settings.pools.decode.tp, scale)


def roofline_prior(m: profiles.ModelProfile, hw: profiles.HardwareProfile,
                   lk: profiles.LinkProfile, prefill_tp: int, decode_tp: int,
                   scale: float = 1.0) -> Prior:
    """The roofline's costs of a 2k-token prompt, ``scale`` wall seconds per modelled one."""
    tokens = 2048

    def per_token(tp: int) -> float:
        return profiles.prefill_seconds(m, hw, tp, tokens) * 1e3 * scale / tokens

    moved = profiles.transfer_seconds(profiles.kv_bytes(m, tokens), lk) * 1e3 * scale
    return Prior(prefill_ms_per_token=per_token(prefill_tp),
                 local_ms_per_token=per_token(decode_tp),
                 transfer_ms_per_token=moved / tokens)


def slo_inputs(table: RoutingTable, ctx: Ctx, decode: Instance, rates: HandoffRates,
               router_queue_tokens: int, chunk_tokens: int, ttft_target_ms: float,
               gap_target_ms: float) -> Inputs:
    """The decision's inputs for ``ctx`` once ``decode`` is chosen (and leased): uncached
    tokens from the block index, queued tokens from the router's leases (this request's own
    excluded) and its prefill queue, streams from the router's in-flight counts."""
    prefills = table.ready(Role.PREFILL)
    prompt = ctx.prompt_tokens
    own = ctx.decode_lease.queued if ctx.decode_lease is not None else 0
    local_uncached = prompt - (ctx.decode_cached_predicted or 0)
    best_queued, best_uncached = 0, prompt
    if prefills:
        waiting = router_queue_tokens // len(prefills)
        costs = [(table.queued_tokens(p.id) + waiting,
                  prompt - (table.cached(p.id, ctx.blocks) if ctx.blocks is not None else 0))
                 for p in prefills]
        best_queued, best_uncached = min(costs, key=sum)
    return Inputs(
        prompt_tokens=prompt, prefill_ready=bool(prefills), prefill_uncached=best_uncached,
        prefill_queued=best_queued, decode_uncached=local_uncached,
        decode_queued=max(0, table.queued_tokens(decode.id) - own),
        decode_running=max(0, table.inflight(decode.id) - 1),
        prefill_ms_per_token=rates.prefill_ms_per_token,
        local_ms_per_token=rates.local_ms_per_token,
        transfer_ms=rates.transfer_ms_per_token * local_uncached, hop_ms=rates.hop_ms,
        chunk_tokens=chunk_tokens, ttft_target_ms=ttft_target_ms, gap_target_ms=gap_target_ms,
        ttft_recent_ms=rates.ttft_p95())
