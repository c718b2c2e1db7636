"""Which vLLM CPU attention path this host's engines take, decided from the CPU's flags.

vLLM 0.32's CPU attention backend (``vllm/v1/attention/backends/cpu_attn.py``,
``_get_attn_isa``) picks its kernel from the CPU, the dtype and the KV block size. Its ``amx``
kernel executes AMX tile instructions without asking Linux for permission to use them
(``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``); the only such request in vLLM's
binaries is inside its bundled oneDNN. A process that reaches the kernel before oneDNN has
used AMX dies with SIGILL -- which is what a decode engine's first step after a NIXL transfer
does (docs/vllm-lab.md). ``attention_path`` mirrors the selection rule for x86 so the lab can
say, before anything starts, which kernel its engines will run; the engine itself logs
vLLM's own answer at start (``controller/launchers/vllm_entry.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
# The dtype CPU engines run in unless ``vllm.dtype`` says otherwise. vLLM's CPU backend needs
# a block size that is a multiple of 32, so bfloat16 on an AMX CPU always selects the ``amx``
# kernel; in float32 vLLM takes its ``vec`` kernel on every x86 CPU, AMX or not, so the lab
# runs the same attention code on both kinds of machine.
CPU_ENGINE_DTYPE = "float32"
# NixlConnector settings for CPU hosts unless ``vllm.kv_connector_extra_config`` says
# otherwise. vLLM's default of 4 NIXL UCX worker threads per engine left KV reads stuck until
# the prefill's lease expired on the 2-core lab: 4 expiries and 31 of 280 requests over 10 s
# (max 64 s), against 0 expiries and 4 of 280 over 10 s (max 18 s) with no worker threads,
# measured in alternating runs (docs/routing-and-accounting.md, "A stuck KV read").
CPU_NIXL_EXTRA: dict[str, object] = {"num_threads": 0}
# The niceness CPU engines run at unless ``vllm.nice`` says otherwise. Each engine keeps two
# threads busy-polling with no traffic at all (the worker and NIXL's UCX progress thread);
# at niceness 0 they starved everything else on the lab's two cores: `import pandas` took
# 48-85 s on the host and 203 s in the console's container (1.2 s with the engines idle-
# starting), at 10 14 s, at 19 6.4 s, while a disaggregated completion took 0.34 s at 19
# against 0.85 s at 0 (the router gets its share too). Measured 2026-12-02.
CPU_ENGINE_NICE = 19


def cpu_flags(cpuinfo: Path = CPUINFO) -> frozenset[str]:
    """The first processor's ``flags`` from ``/proc/cpuinfo``; empty where there is none."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


@dataclass(frozen=True)
class AttentionPath:
    isa: str  # vLLM's name: amx, vec, vec16
    amx: bool  # the CPU has AMX tiles
    dtype: str
    block_size: int
    head_size: int

    @property
    def crash_prone(self) -> bool:
        """The kernel vLLM 0.32 runs without AMX permission (SIGILL after a NIXL pull)."""
        return self.isa == "amx"

    def describe(self) -> str:
        cpu = "has AMX" if self.amx else "no AMX"
        return (f"{self.isa} (CPU {cpu}; dtype {self.dtype}, block size {self.block_size}, "
                f"head size {self.head_size})")


def attention_path(flags: frozenset[str], dtype: str, block_size: int, head_size: int
                   ) -> AttentionPath:
    """vLLM 0.32's ``_get_attn_isa`` for an x86 CPU with these flags (FP8 KV aside)."""
    amx = "amx_tile" in flags
    if head_size % 32 != 0 and head_size % 16 == 0:
        isa = "vec16"
    elif amx and dtype == "bfloat16" and block_size % 32 == 0:
        isa = "amx"
    elif block_size % 32 == 0:
        isa = "vec"
    else:
        isa = "vec16"
    return AttentionPath(isa, amx, dtype, block_size, head_size)
