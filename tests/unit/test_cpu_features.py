"""Which vLLM CPU attention kernel the lab's engines take, on CPUs with and without AMX."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.cli.serve import engine_attention
from controller.config import load_settings
from controller.sizing.cpu_features import CPU_ENGINE_DTYPE, attention_path, cpu_flags

AMX = frozenset({"avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "amx_int8"})
AVX512 = frozenset({"avx512f", "avx512_bf16"})


@pytest.mark.parametrize(("flags", "dtype", "block", "head", "isa"), [
    (AMX, "bfloat16", 128, 64, "amx"),  # the crash: vLLM 0.32's defaults on an AMX Xeon
    (AMX, "float32", 128, 64, "vec"),  # the lab's default there
    (AVX512, "bfloat16", 128, 64, "vec"),
    (AVX512, "float32", 128, 64, "vec"),  # the lab's default on this machine kind
    (AMX, "bfloat16", 16, 64, "vec16"),
    (AMX, "bfloat16", 128, 80, "vec16"),  # head size 80: vec16 whatever the CPU
])
def test_attention_path_mirrors_vllm_selection(flags: frozenset[str], dtype: str, block: int,
                                               head: int, isa: str) -> None:
    path = attention_path(flags, dtype, block, head)
    assert path.isa == isa and path.crash_prone == (isa == "amx")


def test_cpu_flags_reads_the_first_flags_line(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx512f amx_tile\n\nflags\t: other\n")
    assert cpu_flags(info) == {"fpu", "avx512f", "amx_tile"}
    assert cpu_flags(tmp_path / "missing") == frozenset()


def test_the_lab_runs_float32_on_cpu_hosts_so_no_cpu_takes_the_amx_kernel(tmp_path: Path
                                                                           ) -> None:
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(
        '{"hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2, '
        '"num_hidden_layers": 4, "intermediate_size": 512, "vocab_size": 600, '
        '"torch_dtype": "bfloat16"}')
    s = load_settings(None, backend="vllm", model={"name": "lab-tiny", "path": str(model)},
                      hardware={"accelerator": "cpu-lab", "kv_link": "host-memory"},
                      pools={"prefill": {"tp": 1}, "decode": {"tp": 1}})
    assert s.engine_dtype == CPU_ENGINE_DTYPE == "float32"
    assert s.model_profile.dtype_bytes == 4  # KV bytes are counted at the engines' dtype
    path = engine_attention(s)
    assert path is not None and path.isa == "vec" and path.block_size == 128
    gpu = load_settings(None, backend="vllm", model={"name": "lab-tiny", "path": str(model)},
                        pools={"prefill": {"tp": 1}, "decode": {"tp": 1}})
    assert gpu.engine_dtype is None and engine_attention(gpu) is None
