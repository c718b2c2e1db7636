"""The Advisor's what-if calculator: KV cache size and transfer time for a model, a prompt
length and a link, from ``pdctl_api.profiles`` (the same numbers the controller uses)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import pandas as pd

from pdctl_api import profiles

SWEEP_TOKENS = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)


@dataclass(frozen=True)
class WhatIf:
    model: str
    link: str
    prompt_tokens: int
    kv_bytes: int
    wire_ms: float
    transfer_ms: float
    prefill_ms: float | None  # at the given hardware and TP, when known

    @property
    def transfer_share(self) -> float | None:
        """Transfer's share of prefill + transfer: the floor of its share of TTFT."""
        if self.prefill_ms is None:
            return None
        total = self.prefill_ms + self.transfer_ms
        return self.transfer_ms / total if total > 0 else 0.0


def estimate(model: str, prompt_tokens: int, link: str, hardware: str | None = None,
             prefill_tp: int = 1) -> WhatIf:
    m, lk = profiles.model(model), profiles.link(link)
    nbytes = profiles.kv_bytes(m, prompt_tokens)
    prefill_ms = None
    if hardware in profiles.HARDWARE and prompt_tokens > 0:
        hw = profiles.hardware(hardware)
        prefill_ms = profiles.prefill_seconds(m, hw, prefill_tp, prompt_tokens) * 1e3
    return WhatIf(model, link, prompt_tokens, nbytes, profiles.wire_seconds(nbytes, lk) * 1e3,
                  profiles.transfer_seconds(nbytes, lk) * 1e3, prefill_ms)


def transfer_sweep(model: str, links: Iterable[str], tokens: Iterable[int] = SWEEP_TOKENS
          ) -> pd.DataFrame:
    """Transfer time (ms, bandwidth + latency) by prompt length for each link."""
    m = profiles.model(model)
    rows = []
    for name in links:
        lk = profiles.link(name)
        for n in tokens:
            nbytes = profiles.kv_bytes(m, n)
            rows.append({"link": name, "prompt_tokens": n, "kv_gb": nbytes / 1e9,
                         "transfer_ms": profiles.transfer_seconds(nbytes, lk) * 1e3})
    return pd.DataFrame(rows, columns=["link", "prompt_tokens", "kv_gb", "transfer_ms"])


def link_ceiling_gbps(link: str) -> float:
    return profiles.link(link).bandwidth / 1e9


def kv_line(kv_bytes_per_token: int, max_tokens: int) -> pd.DataFrame:
    """The expected KV bytes by prompt length (a straight line), for the scatter's reference."""
    top = max(1, max_tokens)
    return pd.DataFrame({"prompt_tokens": [0, top],
                         "kv_mb": [0.0, kv_bytes_per_token * top / 1e6]})
