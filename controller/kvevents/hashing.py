"""Block hashes over token ids: the controller's own chain hash (what the block index is
keyed by and the router computes per prompt) and vLLM 0.32's (what the engines publish and
the simulated engine must publish the same way).

vLLM (``vllm/v1/core/kv_cache_utils.py``: ``hash_block_tokens``, ``init_none_hash``) hashes a
full block as ``hash_fn((parent_hash, tuple(block_token_ids), extra_keys))``, the first
block's parent being ``NONE_HASH = hash_fn(seed)``. ``hash_fn`` is
``--prefix-caching-hash-algo``: ``sha256`` (the default: pickle, then SHA-256),
``sha256_cbor`` (canonical CBOR, then SHA-256), ``xxhash``/``xxhash_cbor`` (XXH3-128). The seed
is ``PYTHONHASHSEED`` when set; otherwise the fixed ``"vllm-none-hash"`` for the SHA-256
algorithms and 32 random bytes per process for the xxhash ones. Events carry each hash as
its low 64 bits as an int (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``, on by default) or as
the raw bytes.

The controller's own hash is Python's hash of ``(parent, c)``, ``c`` a 64-bit number of the
block's token ids (``block_contents``: the ids weighted per position and summed modulo 2**64,
every block of a prompt at once in numpy): the same for every engine whatever its algorithm
and seed, and deterministic across processes (ints and tuples of ints are not salted by
``PYTHONHASHSEED``, unlike bytes). It works on token ids packed as unsigned 32-bit
little-endian integers (``pack_ids``), which is what a text prompt already is under the
simulator's 4-bytes-per-token estimate (its UTF-8 bytes, padded): such a prompt is hashed
without a list of ids. A 12,288-token text prompt costs about 0.13 ms at block size 16 and
0.03 ms at 128 here (32,768 tokens: 0.32 and 0.08 ms), against 0.46 and 0.34 ms through
tuples of ids and 1.3 and 1.0 ms for vLLM's pickle+SHA-256. It is not collision resistant; a
collision can only make the router predict a hit the engine (which checks its own SHA-256
hashes) does not give."""

from __future__ import annotations

import hashlib
import os
import pickle
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from controller.tokens import ID_BYTES, pack_ids

__all__ = ["ID_BYTES", "ROOT_HASH", "block_chain_hash", "block_contents", "pack_ids",
           "prompt_chain_hashes"]

VLLM_DEFAULT_SEED = "vllm-none-hash"
VLLM_HASH_ALGOS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")


# The parent of every prompt's first block in the controller's chain.
ROOT_HASH = 0x5BD1E995


def block_contents(packed: bytes, block_size: int) -> list[int]:
    """One 64-bit number per full block of packed token ids (``pack_ids``): the block's ids
    weighted by fixed odd 64-bit numbers per position and summed modulo 2**64, all blocks at
    once. Two blocks that differ in one position always differ here."""
    if block_size < 1:
        raise ValueError("block_size must be positive")
    n = len(packed) // (block_size * ID_BYTES)
    if n == 0:
        return []
    ids = np.frombuffer(packed, dtype="<u4", count=n * block_size).reshape(n, block_size)
    weights = _weights(block_size)
    return (ids.astype(np.uint64) * weights).sum(axis=1, dtype=np.uint64).tolist()


def block_chain_hash(parent: int, block: Sequence[int] | bytes) -> int:
    """The controller's hash of one full block (its token ids, or them packed), given its
    parent's."""
    data = block if isinstance(block, bytes) else pack_ids(block)
    [content] = block_contents(data, len(data) // ID_BYTES)
    return hash((parent, content))


def prompt_chain_hashes(tokens: Sequence[int] | bytes, block_size: int,
                        root: int = ROOT_HASH) -> list[int]:
    """The chain hashes of a prompt's full blocks, in order (a trailing partial block has
    none, as in vLLM); ``tokens``: token ids, or them packed (``pack_ids``)."""
    data = tokens if isinstance(tokens, bytes) else pack_ids(tokens)
    out: list[int] = []
    parent = root
    for content in block_contents(data, block_size):
        parent = hash((parent, content))
        out.append(parent)
    return out


_WEIGHTS: dict[int, np.ndarray] = {}


def _weights(block_size: int) -> np.ndarray:
    """Fixed odd 64-bit weights, one per position of a block (SplitMix64 from the root)."""
    w = _WEIGHTS.get(block_size)
    if w is None:
        mask, z, out = (1 << 64) - 1, ROOT_HASH, []
        for _ in range(block_size):
            z = (z + 0x9E3779B97F4A7C15) & mask
            x = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
            x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
            out.append((x ^ (x >> 31)) | 1)
        w = _WEIGHTS[block_size] = np.array(out, dtype=np.uint64)
    return w


def _sha256(obj: Any) -> bytes:
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def _sha256_cbor(obj: Any) -> bytes:
    import cbor2  # vLLM's dependency; needed only to mimic this algorithm

    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


def _xxhash(obj: Any) -> bytes:
    import xxhash  # optional in vLLM too

    return bytes(xxhash.xxh3_128_digest(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)))


def _xxhash_cbor(obj: Any) -> bytes:
    import cbor2
    import xxhash

    return bytes(xxhash.xxh3_128_digest(cbor2.dumps(obj, canonical=True)))


_VLLM_FNS: dict[str, Callable[[Any], bytes]] = {
    "sha256": _sha256, "sha256_cbor": _sha256_cbor, "xxhash": _xxhash,
    "xxhash_cbor": _xxhash_cbor,
}


def vllm_none_hash_seed(algo: str = "sha256", env: dict[str, str] | None = None) -> str | None:
    """The seed vLLM derives ``NONE_HASH`` from for an engine started with ``env``; ``None``
    when it is random per process (xxhash without ``PYTHONHASHSEED``): then no one outside
    the engine can compute its hashes."""
    seed = (os.environ if env is None else env).get("PYTHONHASHSEED")
    if seed is not None:
        return seed
    return None if algo.startswith("xxhash") else VLLM_DEFAULT_SEED


def vllm_block_hashes(token_ids: Sequence[int], block_size: int, *, algo: str = "sha256",
                      seed: str = VLLM_DEFAULT_SEED) -> list[bytes]:
    """vLLM's block hashes (the full bytes) of the full blocks of ``token_ids`` for a
    request without LoRA, multimodal input, cache salt or prompt embeddings."""
    try:
        fn = _VLLM_FNS[algo]
    except KeyError:
        raise ValueError(f"unknown prefix-caching hash algorithm {algo!r}") from None
    parent = fn(seed)
    out: list[bytes] = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = fn((parent, tuple(token_ids[start:start + block_size]), None))
        out.append(parent)
    return out


def vllm_external_hash(block_hash: bytes, as_int: bool = True) -> bytes | int:
    """A hash as vLLM's events carry it (``maybe_convert_block_hash``)."""
    if not as_int:
        return block_hash
    return int.from_bytes(block_hash, "big") & ((1 << 64) - 1)
