"""KV capacity against observed context lengths: how many of the contexts a decode instance
serves its KV cache holds at a TP. Pure; the advisor, the pool-change dry run and the
planner's reasons say it in the same words.

Llama-3-70B in bf16 at decode TP2 on H100 80 GB holds about 35k tokens (the weights take
~70 GB per GPU): five 7k-token contexts, not the hundreds of sequences a batch could run."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from pdctl_api import profiles
from pdctl_api.stats import quantiles

# Fewer concurrent contexts than this per decode instance is called out: the decode batch,
# and with it throughput per accelerator, is then capped by memory, not compute.
TIGHT_SEQUENCES = 16


@dataclass(frozen=True)
class KvFit:
    tp: int
    tokens_per_instance: int
    context_p50: float
    context_p99: float
    sequences_at_p50: int
    sequences_at_p99: int
    observed: bool  # contexts from traffic, else the assumed default

    @property
    def tight(self) -> bool:
        return self.sequences_at_p99 < TIGHT_SEQUENCES

    def note(self) -> str:
        where = "observed" if self.observed else "assumed (no traffic yet)"
        text = (f"decode at TP{self.tp} holds {self.tokens_per_instance:,} tokens of KV cache "
                f"per instance: {self.sequences_at_p99} contexts of the {where} p99 context "
                f"({self.context_p99:,.0f} tokens), {self.sequences_at_p50} of the p50 "
                f"({self.context_p50:,.0f})")
        if self.tight:
            text += (f"; fewer than {TIGHT_SEQUENCES} sequences per instance: memory, not "
                     "compute, caps the decode batch (a larger decode TP holds more)")
        return text

    def public(self) -> dict[str, Any]:
        return {**asdict(self), "tight": self.tight, "note": self.note()}


def fit(m: profiles.ModelProfile, hw: profiles.HardwareProfile, tp: int,
        contexts: np.ndarray, default_context: float,
        utilization: float = profiles.GPU_MEMORY_UTILIZATION) -> KvFit:
    """``contexts``: prompt + output tokens of observed requests (may be empty)."""
    cap = max(0, profiles.kv_capacity_tokens(m, hw, tp, utilization))
    observed = contexts.size > 0
    if observed:
        p50, p99 = quantiles(contexts, (0.5, 0.99)) or (default_context, default_context)
    else:
        p50 = p99 = default_context
    return KvFit(tp, cap, p50, p99, int(cap // max(p50, 1)), int(cap // max(p99, 1)),
                 observed)
