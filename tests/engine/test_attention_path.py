"""vLLM's own attention-kernel selection (``cpu_attn._get_attn_isa``), with AMX present and
absent whatever this machine has: the lab's settings never take the ``amx`` kernel, and
``controller.sizing.cpu_features`` predicts vLLM's choice."""

from __future__ import annotations

import importlib.util
import warnings

import pytest

from controller.sizing.cpu_features import attention_path

pytestmark = pytest.mark.engine

AMX = frozenset({"avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "amx_int8"})
AVX512 = frozenset({"avx512f", "avx512_bf16"})


@pytest.mark.parametrize("amx", [True, False])
def test_vllm_own_selection_agrees_on_both_kinds_of_cpu(monkeypatch: pytest.MonkeyPatch,
                                                        amx: bool) -> None:
    """The lab's float32 takes ``vec``; bfloat16 with 128-token blocks takes ``amx`` exactly
    when the CPU has AMX -- the path that crashed."""
    if importlib.util.find_spec("vllm") is None:
        pytest.fail("vLLM is not installed: `make test` installs the lab extra (.[lab])")
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # vLLM's and torch's import-time deprecations
        from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    flags = AMX if amx else AVX512
    for dtype_name, block in (("float32", 128), ("bfloat16", 128), ("bfloat16", 32)):
        vllm_isa = _get_attn_isa(getattr(torch, dtype_name), block, 64)
        assert vllm_isa == attention_path(flags, dtype_name, block, 64).isa
    assert _get_attn_isa(torch.float32, 128, 64) == "vec"
    assert (_get_attn_isa(torch.bfloat16, 128, 64) == "amx") is amx
