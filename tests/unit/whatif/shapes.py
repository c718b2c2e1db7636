"""Small engine shapes and traces for the discrete-event tests, built from tables."""

from __future__ import annotations

from controller.replay.trace import TraceRequest
from controller.whatif.engine import EngineShape
from pdctl_api import profiles

GIB = 1024**3
TINY = profiles.ModelProfile("tiny", 1, 64, 1, 1, 64, 64, 64, 1e6, max_model_len=4096)
BOX = profiles.HardwareProfile("box", 1e12, 1e11, 4 * GIB, 8, "a test accelerator")
WIRE = profiles.LinkProfile("wire", 1e8, 0.001, "a test link")


def kv_box(tokens: int) -> profiles.HardwareProfile:
    """An accelerator whose memory leaves ``tokens`` tokens of TINY's KV cache at TP 1."""
    usable = (tokens * TINY.kv_bytes_per_token + TINY.weight_bytes
              + profiles.ACTIVATION_RESERVE_BYTES)
    return profiles.HardwareProfile("kv-box", 1e12, 1e11,
                                    usable / profiles.GPU_MEMORY_UTILIZATION, 8, "little memory")


def shape(hw: profiles.HardwareProfile = BOX, context: int | None = None,
          **kw: int) -> EngineShape:
    model = TINY if context is None else profiles.with_context(TINY, context)
    return EngineShape(model, hw, WIRE, **kw)


def requests(times: list[float], prompt: int, output: int,
             shared: int = 0) -> list[TraceRequest]:
    """Requests at ``times`` with their own prompt blocks (the first ``shared`` 512-token
    block ids common to all)."""
    blocks = -(-prompt // 512)
    out = []
    for i, t in enumerate(times):
        ids = tuple(range(shared)) + tuple(1000 + i * 100 + k for k in range(blocks - shared))
        out.append(TraceRequest(i + 1, t, prompt, output, ids))
    return out
