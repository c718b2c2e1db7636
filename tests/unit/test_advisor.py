"""Advisor: the domain page's table and rules, and the fleet-ratio formula."""

from __future__ import annotations

import pytest

from controller.models import RequestPath, RequestRecord
from controller.sizing import advisor
from pdctl_api import profiles


@pytest.mark.parametrize(("params_b", "isl", "expected"), [
    (8, 500, "colocate"), (8, 6000, "colocate"), (8, 20000, "barely-pays"),
    (70, 800, "colocate"), (70, 2000, "depends"), (70, 6000, "disaggregate"),
    (70, 20000, "strongly-disaggregate"), (400, 800, "depends"),
    (400, 6000, "disaggregate"), (400, 20000, "strongly-disaggregate"),
])
def test_table(params_b: float, isl: float, expected: str) -> None:
    assert advisor.verdict(params_b, isl, 500, 0.0).decision == expected


def test_short_sequences_colocate_whatever_the_model() -> None:
    v = advisor.verdict(400, 300, 150, 0.0)
    assert v.decision == "colocate" and "short" in v.reasons[0]
    assert advisor.verdict(400, 6000, 500, 0.95).decision == "colocate"


def rec(isl: int, osl: int, transfer: float = 10.0, ttft: float = 100.0) -> RequestRecord:
    return RequestRecord("r", 0.0, "/v1/completions", RequestPath.DISAGGREGATED, "ok", False,
                         isl, osl, "p", "d", transfer_ms=transfer, ttft_ms=ttft)


def test_fleet_ratio_follows_the_formula() -> None:
    m, hw = profiles.model("llama-3-70b"), profiles.hardware("h100-sxm")
    out = advisor.advise(m, hw, profiles.link("ib-ndr"), 4, 2, [rec(2048, 512)] * 10, 8, 0.2)
    c_p, c_d = advisor.cost_per_token(m, hw, 4, 2, 2048, 512, 8)
    ratio = out["fleet_ratio"]["decode_per_prefill_accelerators"]
    assert ratio == pytest.approx(512 * c_d / (2048 * c_p))
    assert out["fleet_ratio"]["decode_per_prefill_instances"] == pytest.approx(ratio * 4 / 2)
    assert out["traffic"]["observed"] is True


def test_longer_outputs_need_more_decode() -> None:
    m, hw, lk = profiles.model("llama-3-70b"), profiles.hardware("h100-sxm"), profiles.link("roce")
    short = advisor.advise(m, hw, lk, 4, 2, [rec(2048, 128)], 8, 0.2)
    long = advisor.advise(m, hw, lk, 4, 2, [rec(2048, 1024)], 8, 0.2)
    assert (long["fleet_ratio"]["decode_per_prefill_accelerators"]
            > short["fleet_ratio"]["decode_per_prefill_accelerators"])


def test_transfer_dominant_traffic_is_flagged() -> None:
    m, hw = profiles.model("llama-3-70b"), profiles.hardware("h100-sxm")
    lk = profiles.link("ib-ndr")
    calm = advisor.advise(m, hw, lk, 4, 2, [rec(4096, 200, 10, 100)] * 5, None, 0.2)
    hot = advisor.advise(m, hw, lk, 4, 2, [rec(4096, 200, 50, 100)] * 5, None, 0.2)
    assert calm["kv_transfer"]["transfer_dominant"] is False
    assert hot["kv_transfer"]["transfer_dominant"] is True
    assert hot["kv_transfer"]["kv_bytes_at_mean_isl"] == profiles.kv_bytes(m, 4096)


def test_no_traffic_uses_stated_defaults() -> None:
    out = advisor.advise(profiles.model("llama-3-8b"), profiles.hardware("h200"),
                         profiles.link("tcp-100gbe"), 1, 1, [], None, 0.2)
    assert out["traffic"]["observed"] is False and "no traffic" in out["traffic"]["note"]
