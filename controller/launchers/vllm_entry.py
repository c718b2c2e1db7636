"""Start vLLM's OpenAI server after logging which CPU attention kernel vLLM will choose.

Run as a script by ``VllmLauncher`` (``python vllm_entry.py <api_server flags>``), with the
engine's own interpreter, so it imports nothing from pdctl: the interpreter may be another
environment that has only vLLM. On a CPU host it asks vLLM's own selection code
(``cpu_attn._get_attn_isa``) which kernel the given dtype, block size and head size get on
this CPU, and prints one ``pdctl: vLLM CPU attention path ...`` line to the engine log
before the server starts; then it runs ``vllm.entrypoints.openai.api_server`` exactly as
``python -m`` would.
"""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

SERVER = "vllm.entrypoints.openai.api_server"

# Run as a script, this file's folder is sys.path[0]; it holds pdctl's ``vllm.py`` launcher,
# which would shadow the vllm package.
if sys.path and Path(sys.path[0] or ".").resolve() == Path(__file__).resolve().parent:
    del sys.path[0]


def _flag(argv: list[str], name: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def _model_config(argv: list[str]) -> dict[str, object]:
    model = _flag(argv, "--model")
    path = Path(model) / "config.json" if model else None
    if path is None or not path.is_file():
        return {}
    data = json.loads(path.read_text())
    return data if isinstance(data, dict) else {}


def attention_line(argv: list[str]) -> str | None:
    """The line to log, or None on a GPU host (the CPU backend is not used there)."""
    import torch

    if torch.cuda.is_available():
        return None
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    cfg = _model_config(argv)
    dtype_name = _flag(argv, "--dtype") or "auto"
    if dtype_name == "auto":
        dtype_name = str(cfg.get("dtype") or cfg.get("torch_dtype") or "bfloat16")
    dtype = getattr(torch, dtype_name, torch.bfloat16)
    block = int(_flag(argv, "--block-size") or 128)
    heads = int(str(cfg.get("num_attention_heads") or 1))
    head_size = int(str(cfg.get("head_dim") or int(str(cfg.get("hidden_size") or 0)) // heads))
    isa = _get_attn_isa(dtype, block, head_size or None)
    amx = torch.cpu._is_amx_tile_supported()
    return (f"pdctl: vLLM CPU attention path {isa} (CPU has AMX: {'yes' if amx else 'no'}; "
            f"dtype {dtype_name}, block size {block}, head size {head_size}; "
            "chosen by vllm.v1.attention.backends.cpu_attn._get_attn_isa)")


def main() -> None:
    argv = sys.argv[1:]
    try:
        line = attention_line(argv)
    except Exception as exc:  # never keep the engine from starting over a log line
        line = f"pdctl: vLLM CPU attention path unknown ({type(exc).__name__}: {exc})"
    if line:
        print(line, flush=True)
    sys.argv = [SERVER, *argv]
    runpy.run_module(SERVER, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
