"""The fake controller's what-if (``/api/v1/whatif``): a prediction for a proposal in which
more instances mean a proportionally lower TTFT, and its figures."""

from __future__ import annotations

import time
from typing import Any

from controller.errors import Unpredictable
from controller.models import PoolTarget, Role


def figures_of(ttft: float, within: float) -> dict[str, Any]:
    parts = {"ttft": ttft, "queue": ttft / 4, "prefill": ttft / 2, "transfer": ttft / 10,
             "decode_sched": ttft / 20, "gap_p99": 30.0}
    return {"requests": 300, "within_ttft": within, "p50_ms": parts,
            "p90_ms": {k: 2 * v for k, v in parts.items()}}


def forecast_of(targets: dict[Role, PoolTarget], body: dict[str, Any]) -> dict[str, Any]:
    """A prediction for ``body`` (``POST /whatif/pools``): more instances, a lower TTFT."""
    def layout(pools: dict[str, tuple[int, int]]) -> dict[str, Any]:
        return {r: {"count": n, "tp": tp} for r, (n, tp) in pools.items()}

    now = {r.value: (t.size, t.tp) for r, t in targets.items()}
    new = {r: (body.get(r, {}).get("size", n), body.get(r, {}).get("tp", tp))
           for r, (n, tp) in now.items()}
    grow = sum(n for n, _ in new.values()) / sum(n for n, _ in now.values())
    return {"id": 1, "made_at": time.time(), "current": layout(now), "proposed": layout(new),
            "current_label": "{}xTP{} prefill + {}xTP{} decode".format(*now["prefill"],
                                                                      *now["decode"]),
            "proposed_label": "{}xTP{} prefill + {}xTP{} decode".format(*new["prefill"],
                                                                       *new["decode"]),
            "requests": 300, "span_s": 600.0, "ttft_target_ms": 2000.0,
            "before": figures_of(1800.0, 0.62), "after": figures_of(1800.0 / grow, 0.97),
            "accelerator_hours": {"current": 1.0, "proposed": round(grow, 3)},
            "wall_s": 0.4, "notes": ["each layout as it serves once converged"]}


def whatif_answer(fake: Any, key: tuple[str, str], body: Any) -> Any:
    """``GET /whatif`` and ``POST /whatif/pools`` of ``fake`` (a ``FakeController``)."""
    if fake.legacy:
        raise KeyError(key[1])  # 404: an older controller predicts nothing
    if key == ("GET", "/whatif"):
        return fake.whatif
    if fake.unpredictable:
        raise Unpredictable(fake.unpredictable)
    fake.whatif = {"forecast": forecast_of(fake.targets, body), "status": "proposed"}
    return fake.whatif["forecast"]
