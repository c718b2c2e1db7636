"""Event builders for the kvevents tests: what vLLM publishes for given token blocks
(hashes from the vLLM-compatible hash function, sha256 and its default seed)."""

from __future__ import annotations

from typing import Any

from controller.kvevents.hashing import vllm_block_hashes, vllm_external_hash
from controller.kvevents.wire import BlockRemoved, BlockStored, KVEventBatch

B = 4
PROMPT = list(range(100, 100 + 6 * B))  # 6 full blocks
OTHER = list(range(900, 900 + 6 * B))


def engine_hashes(tokens: list[int], seed: str = "vllm-none-hash",
                  as_int: bool = True) -> list[Any]:
    return [vllm_external_hash(h, as_int) for h in vllm_block_hashes(tokens, B, seed=seed)]


def stored(tokens: list[int], start: int, n: int, **kw: Any) -> BlockStored:
    """What vLLM publishes when blocks [start, start+n) of ``tokens`` are cached."""
    hashes = engine_hashes(tokens[:(start + n) * B], kw.pop("seed", "vllm-none-hash"),
                           kw.pop("as_int", True))
    fields: dict[str, Any] = {
        "block_hashes": hashes[start:], "parent_block_hash": hashes[start - 1] if start else None,
        "token_ids": tokens[start * B:(start + n) * B], "block_size": B, "lora_id": None,
        "medium": "GPU", "lora_name": None}
    return BlockStored(**(fields | kw))


def removed(tokens: list[int], *blocks: int) -> BlockRemoved:
    hashes = engine_hashes(tokens)
    return BlockRemoved(block_hashes=[hashes[i] for i in blocks], medium="GPU")


def batch(*events: Any) -> KVEventBatch:
    return KVEventBatch(ts=0.0, events=list(events))
