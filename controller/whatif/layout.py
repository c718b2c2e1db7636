"""A fleet layout: how many instances of each pool, at which tensor parallelism, and the
hand-off policy. Colocated layouts have no prefill pool (every request is served whole on a
decode instance)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from controller.router.handoff import DisaggPolicy
from pdctl_api.schema.cluster import KvMode


@dataclass(frozen=True)
class Layout:
    decode_count: int
    decode_tp: int
    prefill_count: int = 0
    prefill_tp: int = 1
    disagg_policy: DisaggPolicy = "threshold"
    kv_mode: KvMode = "pull"  # how the KV moves: the decode engine pulls it, or both hops at
    # once and the prefill engine pushes it (NixlPushConnector)

    def __post_init__(self) -> None:
        if self.decode_count < 1:
            raise ValueError("a layout needs at least one decode instance")
        if self.prefill_count < 0 or min(self.decode_tp, self.prefill_tp) < 1:
            raise ValueError("counts and TP must be positive")

    @property
    def disaggregated(self) -> bool:
        return self.prefill_count > 0

    @property
    def accelerators(self) -> int:
        return self.decode_count * self.decode_tp + self.prefill_count * self.prefill_tp

    @property
    def label(self) -> str:
        if not self.disaggregated:
            return f"colocated {self.decode_count}xTP{self.decode_tp}"
        push = ", KV push" if self.kv_mode == "push" else ""
        return (f"{self.prefill_count}xTP{self.prefill_tp} prefill + "
                f"{self.decode_count}xTP{self.decode_tp} decode ({self.disagg_policy}{push})")

    def as_dict(self) -> dict[str, Any]:
        return {"prefill": {"count": self.prefill_count,
                            "tp": self.prefill_tp if self.disaggregated else None},
                "decode": {"count": self.decode_count, "tp": self.decode_tp},
                "disagg_policy": self.disagg_policy if self.disaggregated else None,
                "kv_mode": self.kv_mode if self.disaggregated else None,
                "accelerators": self.accelerators}
