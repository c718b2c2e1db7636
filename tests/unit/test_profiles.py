"""The domain page's numbers, pinned through ``pdctl_api.profiles``."""

from __future__ import annotations

import pytest

from pdctl_api import profiles

L70 = profiles.model("llama-3-70b")
H100 = profiles.hardware("h100-sxm")


def test_llama70b_4k_prompt_kv_is_1_34_gb() -> None:
    assert profiles.kv_bytes(L70, 4096) == pytest.approx(1.342e9, rel=0.01)
    assert L70.kv_bytes_per_token == 2 * 80 * 8 * 128 * 2


@pytest.mark.parametrize(("link", "seconds"), [("ib-ndr", 0.027), ("tcp-100gbe", 0.134)])
def test_wire_time_of_a_4k_prompt(link: str, seconds: float) -> None:
    nbytes = profiles.kv_bytes(L70, 4096)
    assert profiles.wire_seconds(nbytes, profiles.link(link)) == pytest.approx(seconds, rel=0.02)


def test_transfer_adds_link_latency() -> None:
    lk = profiles.link("ib-ndr")
    assert profiles.transfer_seconds(1e9, lk) == pytest.approx(profiles.wire_seconds(1e9, lk)
                                                               + lk.latency_s)


def test_accelerator_figures() -> None:
    assert H100.peak_flops == pytest.approx(989e12)
    assert H100.mem_bandwidth == pytest.approx(3.35e12)
    assert profiles.hardware("h200").mem_bandwidth == pytest.approx(4.8e12)


@pytest.mark.parametrize(("tp", "fits"), [(1, False), (2, True), (4, True)])
def test_llama70b_fit_on_h100(tp: int, fits: bool) -> None:
    assert (profiles.fit_problem(L70, H100, tp) is None) is fits
    assert (profiles.kv_capacity_tokens(L70, H100, tp) >= L70.max_model_len) is fits


def test_small_batch_decode_is_memory_bound() -> None:
    one = profiles.decode_step_seconds(L70, H100, 2, [4096])
    eight = profiles.decode_step_seconds(L70, H100, 2, [4096] * 8)
    assert eight / one < 1.15  # nearly flat: the weights dominate what a step reads
    assert 0.02 < one < 0.05  # a 30-50 ms class decode step, as the page says


def test_prefill_grows_with_prompt_length() -> None:
    times = [profiles.prefill_seconds(L70, H100, 4, n) for n in (512, 1024, 2048, 4096, 8192)]
    assert times == sorted(times)
    assert times[-1] / times[-2] > 2.0  # attention makes it slightly superlinear


def test_unknown_name_lists_known_choices() -> None:
    with pytest.raises(KeyError, match="known: .*h100-sxm"):
        profiles.hardware("tpu-v9")
