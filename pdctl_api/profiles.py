"""Hardware, model and link profiles, and the roofline arithmetic built on them.

One place for the numbers of ``../shared/context/pd-disaggregation.md``: KV bytes per prompt,
transfer time over a link, prefill and decode-step time at a given tensor parallelism, and
whether a model fits an accelerator at a TP. The simulated engine, the controller's validation
and the advisor all use these functions, so a number is defined once.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

GIB = 1024**3


@dataclass(frozen=True)
class HardwareProfile:
    """One accelerator kind. Figures are per accelerator (dense BF16)."""

    name: str
    peak_flops: float  # FLOP/s
    mem_bandwidth: float  # bytes/s
    mem_bytes: float  # bytes of device memory
    accelerators_per_node: int
    description: str


@dataclass(frozen=True)
class ModelProfile:
    """Architecture numbers of a decoder-only transformer (Llama family)."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    params: float
    dtype_bytes: int = 2
    max_model_len: int = 8192

    @functools.cached_property
    def weight_bytes(self) -> float:
        return self.params * self.dtype_bytes

    @functools.cached_property
    def kv_bytes_per_token(self) -> int:
        """K and V for every layer: 2 x layers x kv_heads x head_dim x dtype_bytes."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes


@dataclass(frozen=True)
class LinkProfile:
    """A KV transfer link: effective bandwidth and typical per-transfer latency."""

    name: str
    bandwidth: float  # bytes/s
    latency_s: float
    description: str


def llama_params(layers: int, hidden: int, heads: int, kv_heads: int, head_dim: int,
                 intermediate: int, vocab: int, tied: bool = False) -> float:
    """Parameter count of a Llama-architecture model (no biases)."""
    attn = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2
    mlp = 3 * hidden * intermediate
    norms = 2 * hidden
    embed = vocab * hidden * (1 if tied else 2)
    return float(layers * (attn + mlp + norms) + embed + hidden)


HARDWARE: dict[str, HardwareProfile] = {
    p.name: p
    for p in (
        HardwareProfile("h100-sxm", 989e12, 3.35e12, 80 * GIB, 8, "NVIDIA H100 SXM 80GB"),
        HardwareProfile("h200", 989e12, 4.8e12, 141e9, 8, "NVIDIA H200 141GB"),
        HardwareProfile("a100-80gb", 312e12, 2.039e12, 80 * GIB, 8, "NVIDIA A100 SXM 80GB"),
        # One x86 core of the 2-core lab machine counted as one "accelerator". Effective
        # figures, calibrated with bench/lab.py (guidellm, synchronous, mixed 20-68 /
        # 275-1006-token prompts) against the real P/D lab: decode ITL p50 ~19-23 ms and
        # prefill ~1.1 s for the median long prompt (which the sim counts as 411 tokens) on a
        # shared, loaded box with NIXL's progress threads busy. They absorb vLLM's per-step
        # CPU overhead and that contention; they are not the core's roofline (was 40e9, 8e9).
        HardwareProfile("cpu-lab", 4.7e9, 0.4e9, 4 * GIB, 2, "one core of the 2-core CPU lab"),
    )
}

MODELS: dict[str, ModelProfile] = {
    m.name: m
    for m in (
        ModelProfile("llama-3-8b", 32, 4096, 32, 8, 128, 14336, 128256,
                     llama_params(32, 4096, 32, 8, 128, 14336, 128256)),
        ModelProfile("llama-3-70b", 80, 8192, 64, 8, 128, 28672, 128256,
                     llama_params(80, 8192, 64, 8, 128, 28672, 128256)),
        # Llama 3.1: the Llama 3 architecture with llama3 RoPE scaling (factor 8 over the
        # original 8,192 positions) to 131,072 tokens of context. Numbers from the released
        # config.json files (meta-llama/Llama-3.1-{8B,70B,405B}[-Instruct]: hidden_size,
        # num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim,
        # intermediate_size, vocab_size, max_position_embeddings) and the Llama 3 paper
        # (arXiv 2407.21783, table 3). Weights and KV in BF16 like the Llama 3 presets; the
        # RoPE scaling changes no count the roofline uses.
        ModelProfile("llama-3.1-8b", 32, 4096, 32, 8, 128, 14336, 128256,
                     llama_params(32, 4096, 32, 8, 128, 14336, 128256),
                     max_model_len=131072),
        ModelProfile("llama-3.1-70b", 80, 8192, 64, 8, 128, 28672, 128256,
                     llama_params(80, 8192, 64, 8, 128, 28672, 128256),
                     max_model_len=131072),
        # 405B: 8 KV heads (the first upload's config.json said 16; Meta corrected it to the
        # paper's 8). ~406e9 parameters, 812 GB in BF16: it fits 8 x H200 with room for a
        # 128k sequence, but no single H100 or A100 node (that takes Meta's FP8 variant,
        # which this BF16 profile does not model).
        ModelProfile("llama-3.1-405b", 126, 16384, 128, 8, 128, 53248, 128256,
                     llama_params(126, 16384, 128, 8, 128, 53248, 128256),
                     max_model_len=131072),
        # The generated lab model (``pdctl make-model``): a tiny Llama.
        ModelProfile("lab-tiny", 4, 256, 4, 2, 64, 512, 640,
                     llama_params(4, 256, 4, 2, 64, 512, 640), max_model_len=2048),
    )
}

LINKS: dict[str, LinkProfile] = {
    lk.name: lk
    for lk in (
        LinkProfile("nvlink", 900e9, 0.001, "NVLink intra-node"),
        LinkProfile("ib-ndr", 50e9, 0.010, "InfiniBand NDR 400G"),
        LinkProfile("roce", 40e9, 0.015, "RoCE v2 (25-50 GB/s)"),
        LinkProfile("pcie5", 64e9, 0.020, "PCIe 5.0 x16"),
        LinkProfile("tcp-100gbe", 10e9, 0.002, "TCP over 100 GbE"),
        # NIXL over UCX in host memory on one CPU machine (measured ~4-5 GB/s).
        LinkProfile("host-memory", 4.5e9, 0.001, "NIXL/UCX host memory, same machine"),
    )
}


def lookup(table: dict[str, object], kind: str, name: str) -> object:
    """Return ``table[name]`` or raise ``KeyError`` naming the known choices."""
    try:
        return table[name]
    except KeyError:
        raise KeyError(f"unknown {kind} {name!r}; known: {', '.join(sorted(table))}") from None


def hardware(name: str) -> HardwareProfile:
    p = lookup(HARDWARE, "hardware", name)  # type: ignore[arg-type]
    assert isinstance(p, HardwareProfile)
    return p


def model(name: str) -> ModelProfile:
    p = lookup(MODELS, "model", name)  # type: ignore[arg-type]
    assert isinstance(p, ModelProfile)
    return p


def with_context(m: ModelProfile, max_model_len: int | None) -> ModelProfile:
    """``m`` served with a context of ``max_model_len`` tokens (vLLM's ``--max-model-len``);
    ``m`` itself when None. Raises ``ValueError`` above the model's own context (its
    ``max_model_len``, the positions it was trained for) or below one token."""
    if max_model_len is None or max_model_len == m.max_model_len:
        return m
    if max_model_len < 1:
        raise ValueError(f"max_model_len must be >= 1, got {max_model_len}")
    if max_model_len > m.max_model_len:
        raise ValueError(
            f"max_model_len {max_model_len:,} exceeds {m.name}'s context of "
            f"{m.max_model_len:,} tokens; choose a long-context model or at most "
            f"{m.max_model_len}")
    return dataclasses.replace(m, max_model_len=max_model_len)


def link(name: str) -> LinkProfile:
    p = lookup(LINKS, "link", name)  # type: ignore[arg-type]
    assert isinstance(p, LinkProfile)
    return p


# ---- KV cache and transfer -------------------------------------------------------------

def kv_bytes(m: ModelProfile, tokens: int, block_size: int = 1) -> int:
    """KV bytes for ``tokens`` prompt tokens, rounded up to whole blocks of ``block_size``."""
    blocks = math.ceil(tokens / block_size) if tokens > 0 else 0
    return blocks * block_size * m.kv_bytes_per_token


def wire_seconds(nbytes: float, lk: LinkProfile) -> float:
    """Time to move ``nbytes`` at the link's effective bandwidth (no setup latency)."""
    return nbytes / lk.bandwidth


def transfer_seconds(nbytes: float, lk: LinkProfile) -> float:
    """Wire time plus the link's typical per-transfer latency."""
    return wire_seconds(nbytes, lk) + lk.latency_s


# ---- compute -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Efficiency:
    """How much of the roofline an engine reaches."""

    prefill_mfu: float = 0.5  # share of peak FLOP/s a prefill batch reaches
    decode_mfu: float = 0.5
    bandwidth_util: float = 0.8  # share of peak memory bandwidth decode reaches
    step_overhead_s: float = 0.0005  # scheduler + launch cost per forward pass


def prefill_flops(m: ModelProfile, tokens: int, context: int = 0) -> float:
    """FLOPs of a prefill chunk of ``tokens`` tokens after ``context`` cached tokens.

    Linear layers: 2 x params per token. Attention (QK^T and AV, causal): for token i at
    position p it costs 4 x layers x heads x head_dim x p.
    """
    linear = 2.0 * m.params * tokens
    positions = tokens * context + tokens * (tokens + 1) / 2.0
    attn = 4.0 * m.layers * m.heads * m.head_dim * positions
    return linear + attn


def prefill_seconds(m: ModelProfile, hw: HardwareProfile, tp: int, tokens: int,
                    eff: Efficiency = Efficiency()) -> float:
    """Compute-bound time of a whole-prompt prefill on ``tp`` accelerators."""
    return prefill_flops(m, tokens) / (hw.peak_flops * eff.prefill_mfu * tp) + eff.step_overhead_s


def step_seconds(m: ModelProfile, hw: HardwareProfile, tp: int, prefill_tokens: int,
                 prefill_context: int, decode_contexts: list[int],
                 eff: Efficiency = Efficiency()) -> float:
    """One forward pass of a continuous batch: roofline max(compute, memory).

    Compute: prefill chunk FLOPs plus, per decoding sequence, one token of linear layers and
    attention over its context. Memory: the weights once per step plus every decoding
    sequence's KV cache, read at ``bandwidth_util`` of peak on ``tp`` accelerators.
    """
    return batch_seconds(m, hw, tp, prefill_tokens, prefill_context, len(decode_contexts),
                         sum(decode_contexts), eff)


def batch_seconds(m: ModelProfile, hw: HardwareProfile, tp: int, prefill_tokens: int,
                  prefill_context: int, decoding: int, decode_context: int,
                  eff: Efficiency = Efficiency()) -> float:
    """``step_seconds`` of ``decoding`` sequences whose contexts add up to ``decode_context``
    (all the decode term needs)."""
    flops = prefill_flops(m, prefill_tokens, prefill_context) if prefill_tokens else 0.0
    if decoding:
        flops += (2.0 * m.params * decoding
                  + 4.0 * m.layers * m.heads * m.head_dim * decode_context)
    mfu = eff.prefill_mfu if prefill_tokens else eff.decode_mfu
    compute = flops / (hw.peak_flops * mfu * tp)
    nbytes = m.weight_bytes + decode_context * m.kv_bytes_per_token
    memory = nbytes / (hw.mem_bandwidth * eff.bandwidth_util * tp)
    return max(compute, memory) + eff.step_overhead_s


def decode_step_seconds(m: ModelProfile, hw: HardwareProfile, tp: int, contexts: list[int],
                        eff: Efficiency = Efficiency()) -> float:
    """A decode-only step for sequences with the given context lengths."""
    return step_seconds(m, hw, tp, 0, 0, contexts, eff)


# ---- memory fit --------------------------------------------------------------------------

GPU_MEMORY_UTILIZATION = 0.9
ACTIVATION_RESERVE_BYTES = 1 * GIB  # per accelerator, for activations and buffers


def kv_capacity_tokens(m: ModelProfile, hw: HardwareProfile, tp: int,
                       utilization: float = GPU_MEMORY_UTILIZATION) -> int:
    """Tokens of KV cache an instance holds after weights and reserve; <= 0 if none."""
    usable = hw.mem_bytes * utilization * tp - m.weight_bytes - ACTIVATION_RESERVE_BYTES * tp
    return int(usable // m.kv_bytes_per_token)


def fit_problem(m: ModelProfile, hw: HardwareProfile, tp: int,
                utilization: float = GPU_MEMORY_UTILIZATION) -> str | None:
    """Why ``m`` at TP ``tp`` does not fit ``hw``, or None when weights and one full-length
    sequence of KV cache fit in ``utilization`` of the accelerators' memory. Full length is
    ``m.max_model_len``: pass ``with_context(m, n)`` for a model served with a shorter
    context, as vLLM checks ``--max-model-len`` against the KV space at start."""
    need = m.weight_bytes + m.max_model_len * m.kv_bytes_per_token
    have = (hw.mem_bytes * utilization - ACTIVATION_RESERVE_BYTES) * tp
    if need <= have:
        return None
    return (
        f"{m.name} at TP={tp} needs {need / 1e9:.1f} GB (weights {m.weight_bytes / 1e9:.1f} GB + "
        f"{m.max_model_len * m.kv_bytes_per_token / 1e9:.1f} GB of KV for one "
        f"{m.max_model_len}-token sequence, its context max_model_len) but {tp} x {hw.name} "
        f"offer {have / 1e9:.1f} GB at {utilization:.0%} memory utilization"
    )
