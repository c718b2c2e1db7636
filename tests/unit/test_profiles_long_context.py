"""Long-context presets (Llama 3.1, 131,072 tokens) and the configured context
(``model.max_model_len``), with the memory check run at the context served."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from controller.config import Settings
from controller.config.load import pools_problem
from controller.launchers.base import LaunchSpec
from controller.launchers.sim import SimEngineKind
from controller.models import Role
from pdctl_api import profiles

H100 = profiles.hardware("h100-sxm")
H200 = profiles.hardware("h200")
L31_8 = profiles.model("llama-3.1-8b")
L31_70 = profiles.model("llama-3.1-70b")
L31_405 = profiles.model("llama-3.1-405b")


def test_llama31_architecture_numbers() -> None:
    """The released config.json figures; 3.1 differs from 3 only in context."""
    for m3, m31 in ((profiles.model("llama-3-8b"), L31_8),
                    (profiles.model("llama-3-70b"), L31_70)):
        assert (m31.layers, m31.hidden, m31.heads, m31.kv_heads, m31.head_dim,
                m31.intermediate, m31.vocab, m31.params) == (
            m3.layers, m3.hidden, m3.heads, m3.kv_heads, m3.head_dim, m3.intermediate,
            m3.vocab, m3.params)
        assert (m3.max_model_len, m31.max_model_len) == (8192, 131072)
    assert (L31_405.layers, L31_405.hidden, L31_405.heads, L31_405.kv_heads,
            L31_405.head_dim, L31_405.intermediate, L31_405.vocab) == (
        126, 16384, 128, 8, 128, 53248, 128256)
    assert L31_8.params == pytest.approx(8.03e9, rel=0.005)
    assert L31_70.params == pytest.approx(70.6e9, rel=0.005)
    assert L31_405.params == pytest.approx(405.9e9, rel=0.005)


def test_a_128k_sequence_of_70b_kv_is_43_gb() -> None:
    assert profiles.kv_bytes(L31_70, 131072) == pytest.approx(42.95e9, rel=0.001)


@pytest.mark.parametrize(("tp", "fits"), [(1, False), (2, False), (4, True), (8, True)])
def test_llama31_70b_at_128k_on_h100(tp: int, fits: bool) -> None:
    """141 GB of weights + 43 GB of KV: TP2's 152 GB holds the 8k Llama-3 but not 128k."""
    assert (profiles.fit_problem(L31_70, H100, tp) is None) is fits
    assert (profiles.kv_capacity_tokens(L31_70, H100, tp) >= 131072) is fits


def test_the_misfit_names_the_context() -> None:
    problem = profiles.fit_problem(L31_70, H100, 1)
    assert problem is not None
    assert problem.startswith("llama-3.1-70b at TP=1 needs 184.1 GB (weights 141.1 GB + "
                              "42.9 GB of KV for one 131072-token sequence")


def test_llama31_8b_at_128k_fits_one_h100() -> None:
    assert profiles.fit_problem(L31_8, H100, 1) is None
    assert profiles.kv_capacity_tokens(L31_8, H100, 1) >= 131072


def test_llama31_405b_fits_a_h200_node_only() -> None:
    assert profiles.fit_problem(L31_405, H200, 8) is None
    assert profiles.fit_problem(L31_405, H200, 4) is not None
    assert profiles.fit_problem(L31_405, H100, 8) is not None  # 812 GB of BF16 weights


def test_a_shorter_context_needs_less_memory() -> None:
    at_32k = profiles.with_context(L31_70, 32768)
    assert at_32k.max_model_len == 32768 and L31_70.max_model_len == 131072
    assert profiles.fit_problem(L31_70, H100, 2) is not None
    assert profiles.fit_problem(profiles.with_context(L31_70, 16384), H100, 2) is None
    assert profiles.with_context(L31_70, None) is L31_70


def test_a_context_above_the_models_own_is_refused() -> None:
    with pytest.raises(ValueError, match="max_model_len 16,384 exceeds llama-3-70b's "
                                         "context of 8,192 tokens"):
        profiles.with_context(profiles.model("llama-3-70b"), 16384)


def test_llama31_presets_are_listed() -> None:
    assert {"llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b"} <= set(profiles.MODELS)


# ---- the configuration --------------------------------------------------------------------

def test_config_128k_layout_fits_at_tp4_not_tp2() -> None:
    ok = Settings(model={"name": "llama-3.1-70b"},
                  pools={"prefill": {"tp": 4}, "decode": {"tp": 4}})
    assert ok.context_len == 131072 and pools_problem(ok) is None
    tight = Settings(model={"name": "llama-3.1-70b"})  # decode TP2 by default
    problem = pools_problem(tight)
    assert problem is not None and "131072-token sequence" in problem


def test_config_max_model_len_is_the_context_checked() -> None:
    s = Settings(model={"name": "llama-3.1-70b", "max_model_len": 16384})
    assert s.context_len == 16384 and s.model_profile.max_model_len == 16384
    assert pools_problem(s) is None  # decode TP2 holds a 16k sequence


def test_config_max_model_len_above_the_models_own_is_refused() -> None:
    with pytest.raises(ValidationError, match="model.max_model_len: max_model_len 32,768 "
                                              "exceeds llama-3-70b's context of 8,192"):
        Settings(model={"name": "llama-3-70b", "max_model_len": 32768})


def test_config_max_model_len_is_refused_for_external_engines() -> None:
    with pytest.raises(ValidationError, match="external engines serve the context"):
        Settings(backend="external", pools={"decode": {"urls": ["http://127.0.0.1:1"]}},
                 model={"max_model_len": 4096})


def test_config_max_model_len_sets_vllms() -> None:
    s = Settings(backend="vllm", model={"name": "llama-3.1-8b", "max_model_len": 65536})
    assert s.vllm.max_model_len == 65536 and s.context_len == 65536
    with pytest.raises(ValidationError, match="differ; give one"):
        Settings(backend="vllm", model={"name": "llama-3.1-8b", "max_model_len": 65536},
                 vllm={"max_model_len": 4096})


def test_sim_argv_carries_the_context_only_when_set() -> None:
    spec = LaunchSpec(instance_id="p0", role=Role.PREFILL, tp=4, accelerators=(0, 1, 2, 3),
                      log_path=Path("p0.log"))
    plain = SimEngineKind(Settings(model={"name": "llama-3.1-70b"})).argv(spec, 9000)
    assert "--max-model-len" not in plain
    argv = SimEngineKind(Settings(model={"name": "llama-3.1-70b", "max_model_len": 32768})
                         ).argv(spec, 9000)
    assert argv[argv.index("--max-model-len") + 1] == "32768"
