"""vLLM 0.32's own KV-event classes, ZMQ publisher and block-hash functions, executed from the
installed source files without importing the ``vllm`` package (whose import pulls torch and
takes half a minute here). The class and function bodies run verbatim; only their
``from vllm... import`` lines are replaced by the few names they use (a logger, the
``ExternalBlockHash`` alias, vLLM's pydantic ``@config`` decorator, the int-hash switch).
When ``vllm`` is already imported in this process, its real modules are used instead."""

from __future__ import annotations

import ast
import importlib.util
import logging
import os
import sys
import types
from collections.abc import Callable, Iterable, Sequence
from functools import cache
from pathlib import Path
from typing import Any, NewType

import pytest


def _vllm_dir() -> Path:
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("vLLM is not installed (the lab extra)")
    return Path(next(iter(spec.submodule_search_locations)))


def _without_vllm_imports(source: str, keep: Iterable[str] | None = None) -> ast.Module:
    tree = ast.parse(source)
    body = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("vllm"):
            continue
        if keep is not None:
            names = _defined(node)
            if not names or not names & set(keep):
                continue
        body.append(node)
    tree.body = body
    return tree


def _defined(node: ast.stmt) -> set[str]:
    if isinstance(node, ast.FunctionDef | ast.ClassDef):
        return {node.name}
    if isinstance(node, ast.Assign):
        return {t.id for t in node.targets if isinstance(t, ast.Name)}
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return {node.target.id}
    return set()


def _exec(name: str, path: Path, namespace: dict[str, Any],
          keep: Iterable[str] | None = None) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(namespace)
    module.__file__ = str(path)
    sys.modules[name] = module  # msgspec and pydantic look types up by module
    code = compile(_without_vllm_imports(path.read_text(), keep), str(path), "exec")
    exec(code, module.__dict__)
    return module


def _config_decorator(cls: type) -> type:
    from pydantic import ConfigDict
    from pydantic.dataclasses import dataclass

    return dataclass(cls, config=ConfigDict(extra="forbid"))  # as vllm.config.utils.config


@cache
def kv_events() -> types.ModuleType:
    """``vllm/distributed/kv_events.py``: EventBatch, KVEventBatch, BlockStored, BlockRemoved,
    AllBlocksCleared, ZmqEventPublisher."""
    if "vllm.distributed.kv_events" in sys.modules:
        return sys.modules["vllm.distributed.kv_events"]
    root = _vllm_dir()
    cfg = _exec("_vllm_src.config_kv_events", root / "config" / "kv_events.py",
                {"config": _config_decorator})

    def _unused(*_: Any) -> Any:
        raise AssertionError("tcp://*:0 is not used in these tests")

    return _exec("_vllm_src.kv_events", root / "distributed" / "kv_events.py", {
        "KVEventsConfig": cfg.KVEventsConfig,
        "init_logger": logging.getLogger,
        "get_ip": _unused, "get_tcp_uri": _unused, "is_valid_ipv6_address": _unused,
        "split_zmq_path": _unused,
        "ExternalBlockHash": bytes | int,
    })


@cache
def hashing() -> types.ModuleType:
    """``vllm/utils/hashing.py`` (sha256, sha256_cbor, xxhash, get_hash_fn_by_name)."""
    if "vllm.utils.hashing" in sys.modules:
        return sys.modules["vllm.utils.hashing"]
    return _exec("_vllm_src.hashing", _vllm_dir() / "utils" / "hashing.py", {})


@cache
def kv_cache_utils() -> types.ModuleType:
    """From ``vllm/v1/core/kv_cache_utils.py``: hash_block_tokens, init_none_hash,
    resolve_none_hash_seed, maybe_convert_block_hash and the constants they read."""
    if "vllm.v1.core.kv_cache_utils" in sys.modules:
        return sys.modules["vllm.v1.core.kv_cache_utils"]
    h = hashing()
    wanted = {"BlockHash", "NONE_HASH", "DEFAULT_NONE_HASH_SEED", "_NON_CRYPTO_HASH_FUNCTIONS",
              "_NONE_HASH_SEED", "resolve_none_hash_seed", "init_none_hash",
              "hash_block_tokens", "maybe_convert_block_hash"}
    int_hashes = os.getenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "1") != "0"
    return _exec("_vllm_src.kv_cache_utils",
                 _vllm_dir() / "v1" / "core" / "kv_cache_utils.py", {
                     "os": os, "Any": Any, "Callable": Callable, "Sequence": Sequence,
                     "NewType": NewType, "logger": logging.getLogger("vllm_src"),
                     "xxhash": h.xxhash, "xxhash_cbor": h.xxhash_cbor,
                     "envs": types.SimpleNamespace(
                         VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=int_hashes),
                 }, keep=wanted)
