"""Advice from observed traffic: fleet ratio, disaggregate-or-colocate, KV transfer cost.

Pure functions over a model/hardware/link profile and a window of request records, following
``../shared/context/pd-disaggregation.md``: the decode:prefill ratio is
``(OSL x decode cost per token) / (ISL x prefill cost per token)``, the verdict comes from the
page's model-size x ISL table and its short-sequence rules, and transfer above the alert share
of TTFT is flagged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from controller.models import RequestPath, RequestRecord
from controller.sizing import kvfit
from pdctl_api import profiles
from pdctl_api.stats import mean

DEFAULT_ISL = 2048
DEFAULT_OSL = 512
DEFAULT_DECODE_BATCH = 16


@dataclass(frozen=True)
class Verdict:
    decision: str  # colocate | disaggregate | strongly-disaggregate | depends | barely-pays
    reasons: tuple[str, ...]


def _size_class(params_b: float) -> str:
    if params_b < 20:
        return "<20B"
    return "70B" if params_b <= 120 else ">120B"


def _isl_class(isl: float) -> str:
    if isl < 1000:
        return "<1K"
    if isl < 4000:
        return "1K-4K"
    return "4K-10K" if isl <= 10_000 else ">10K"


# The domain page's table; its 1K-4K gap is filled from the neighbouring columns.
TABLE: dict[str, dict[str, str]] = {
    "<20B": {"<1K": "colocate", "1K-4K": "colocate", "4K-10K": "colocate",
             ">10K": "barely-pays"},
    "70B": {"<1K": "colocate", "1K-4K": "depends", "4K-10K": "disaggregate",
            ">10K": "strongly-disaggregate"},
    ">120B": {"<1K": "depends", "1K-4K": "depends", "4K-10K": "disaggregate",
              ">10K": "strongly-disaggregate"},
}


def verdict(params_b: float, isl: float, osl: float, short_share: float) -> Verdict:
    """Disaggregate or colocate, with the rules that decided it."""
    if short_share >= 0.9:
        return Verdict("colocate", (
            f"{short_share:.0%} of requests have ISL < 512 and OSL < 100: extra pools, router "
            "hop and KV transfer never repay themselves",))
    if isl < 512 and osl < 200:
        return Verdict("colocate", (
            f"short sequences (mean ISL {isl:.0f} < 512 and OSL {osl:.0f} < 200)",))
    size, span = _size_class(params_b), _isl_class(isl)
    decision = TABLE[size][span]
    reasons = [f"model {params_b:.0f}B is in the {size} row, mean ISL {isl:.0f} in the "
               f"{span} column: {decision}"]
    if size == "<20B":
        reasons.append("small models (< 20B) rarely gain from disaggregation")
    if span == "1K-4K":
        reasons.append("between the table's <1K and 4K-10K columns: measure TTFT and ITL "
                       "both ways before committing")
    return Verdict(decision, tuple(reasons))


def cost_per_token(m: profiles.ModelProfile, hw: profiles.HardwareProfile, prefill_tp: int,
                   decode_tp: int, isl: float, osl: float, batch: float) -> tuple[float, float]:
    """Accelerator-seconds per prompt token (prefill) and per output token (decode)."""
    n = max(1, round(isl))
    prefill = profiles.prefill_seconds(m, hw, prefill_tp, n) * prefill_tp / n
    b = max(1, round(batch))
    ctx = int(isl + osl / 2)
    decode = profiles.decode_step_seconds(m, hw, decode_tp, [ctx] * b) * decode_tp / b
    return prefill, decode


def advise(m: profiles.ModelProfile, hw: profiles.HardwareProfile, link: profiles.LinkProfile,
           prefill_tp: int, decode_tp: int, records: list[RequestRecord],
           decode_batch: float | None, alert_share: float) -> dict[str, Any]:
    ok = [r for r in records if r.status == "ok"]
    observed = bool(ok)
    isl = mean(r.prompt_tokens for r in ok) if observed else DEFAULT_ISL
    osl = mean(r.output_tokens for r in ok) if observed else DEFAULT_OSL
    short = sum(1 for r in ok if r.prompt_tokens < 512 and r.output_tokens < 100)
    short_share = short / len(ok) if ok else 0.0
    batch = decode_batch if decode_batch and decode_batch >= 1 else DEFAULT_DECODE_BATCH
    c_p, c_d = cost_per_token(m, hw, prefill_tp, decode_tp, isl, osl, batch)
    gpu_ratio = (osl * c_d) / (isl * c_p) if isl > 0 and c_p > 0 else 0.0
    v = verdict(m.params / 1e9, isl, osl, short_share)
    kv = profiles.kv_bytes(m, round(isl))
    disagg = [r for r in ok if r.path is RequestPath.DISAGGREGATED and r.ttft_ms > 0]
    shares = sorted(r.transfer_ms / r.ttft_ms for r in disagg)
    obs_share = shares[len(shares) // 2] if shares else None
    contexts = np.array([r.prompt_tokens + r.output_tokens for r in ok], dtype=float)
    kv_fit = kvfit.fit(m, hw, decode_tp, contexts, isl + osl)
    reasons = list(v.reasons)
    if kv_fit.tight:
        reasons.append(kv_fit.note())
    v = Verdict(v.decision, tuple(reasons))
    prefill_s = profiles.prefill_seconds(m, hw, prefill_tp, max(1, round(isl)))
    model_share = profiles.transfer_seconds(kv, link) / (
        prefill_s + profiles.transfer_seconds(kv, link))
    return {
        "traffic": {"observed": observed, "requests": len(ok), "mean_isl": isl,
                    "mean_osl": osl, "short_request_share": short_share,
                    "note": None if observed else
                    f"no traffic yet: using ISL {DEFAULT_ISL} / OSL {DEFAULT_OSL}"},
        "fleet_ratio": {
            "decode_per_prefill_accelerators": gpu_ratio,
            "decode_per_prefill_instances": gpu_ratio * prefill_tp / decode_tp,
            "prefill_cost_per_token_s": c_p,
            "decode_cost_per_token_s": c_d,
            "decode_batch": batch,
            "decode_batch_observed": decode_batch is not None and decode_batch >= 1,
            "formula": "(OSL x decode cost/token) / (ISL x prefill cost/token)",
        },
        "verdict": {"decision": v.decision, "reasons": list(v.reasons)},
        "kv_capacity": kv_fit.public(),
        "kv_transfer": {
            "link": link.name, "kv_bytes_at_mean_isl": kv,
            "wire_ms": profiles.wire_seconds(kv, link) * 1e3,
            "transfer_ms": profiles.transfer_seconds(kv, link) * 1e3,
            "modelled_share_of_ttft": model_share,
            "observed_share_of_ttft_p50": obs_share,
            "alert_share": alert_share,
            "transfer_dominant": (obs_share if obs_share is not None else model_share)
            > alert_share,
        },
    }
