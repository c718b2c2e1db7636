"""Block hashes: vLLM's algorithm reproduced (equal to vLLM's own ``hash_block_tokens``
chain and seed), and the controller's own chain hash."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest

from controller.kvevents import hashing
from tests.unit.kvevents import vllm_src

ROOT = str(Path(__file__).resolve().parents[3])
TOKENS = [random.Random(1).randrange(150_000) for _ in range(16 * 5 + 3)]


def _vllm_chain(algo: str, tokens: list[int], block_size: int) -> list[bytes]:
    utils, fns = vllm_src.kv_cache_utils(), vllm_src.hashing()
    fn = fns.get_hash_fn_by_name(algo)
    utils.init_none_hash(fn)
    out, parent = [], None
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = utils.hash_block_tokens(fn, parent, tokens[start:start + block_size])
        out.append(parent)
    return out


ALGOS = ["sha256", "sha256_cbor"] + (
    ["xxhash", "xxhash_cbor"] if importlib.util.find_spec("xxhash") else [])


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("seed", [None, "0", "pdctl"])
def test_equal_to_vllms_hash_block_tokens(algo: str, seed: str | None,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    if seed is None:
        monkeypatch.delenv("PYTHONHASHSEED", raising=False)
        if algo.startswith("xxhash"):
            pytest.skip("a random per-process seed: not computable outside the engine")
    else:
        monkeypatch.setenv("PYTHONHASHSEED", seed)
    ours_seed = hashing.vllm_none_hash_seed(algo)
    assert ours_seed == vllm_src.kv_cache_utils().resolve_none_hash_seed(
        vllm_src.hashing().get_hash_fn_by_name(algo))
    assert ours_seed is not None
    theirs = _vllm_chain(algo, TOKENS, 16)
    ours = hashing.vllm_block_hashes(TOKENS, 16, algo=algo, seed=ours_seed)
    assert ours == theirs and len(ours) == 5
    convert = vllm_src.kv_cache_utils().maybe_convert_block_hash
    assert [hashing.vllm_external_hash(h) for h in ours] == [convert(h) for h in theirs]


def test_xxhash_without_a_seed_is_random_per_process() -> None:
    assert hashing.vllm_none_hash_seed("xxhash", env={}) is None
    assert hashing.vllm_none_hash_seed("xxhash", env={"PYTHONHASHSEED": "3"}) == "3"
    assert hashing.vllm_none_hash_seed("sha256", env={}) == "vllm-none-hash"
    with pytest.raises(ValueError):
        hashing.vllm_block_hashes(TOKENS, 16, algo="md5")


def test_own_chain_hash_is_the_same_in_another_process() -> None:
    import subprocess
    import sys

    code = ("from controller.kvevents.hashing import prompt_chain_hashes as p;"
            f"print(p({TOKENS!r}, 16))")
    for seed in ("0", "12345"):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env={"PYTHONHASHSEED": seed, "PYTHONPATH": ROOT}, check=True)
        assert out.stdout.strip() == str(hashing.prompt_chain_hashes(TOKENS, 16))


def test_own_chain_hash() -> None:
    chain = hashing.prompt_chain_hashes(TOKENS, 16)
    assert len(chain) == 5  # the trailing 3 tokens make no block
    parent, manual = hashing.ROOT_HASH, []
    for i in range(5):
        parent = hashing.block_chain_hash(parent, TOKENS[i * 16:(i + 1) * 16])
        manual.append(parent)
    assert chain == manual
    assert hashing.prompt_chain_hashes(TOKENS[:40], 16) == chain[:2]
    other = hashing.prompt_chain_hashes([TOKENS[0] + 1, *TOKENS[1:]], 16)
    assert all(a != b for a, b in zip(chain, other, strict=True))  # a change carries on
    assert hashing.prompt_chain_hashes([], 16) == []
    assert all(-2**63 <= h < 2**63 for h in chain)  # one machine word: cheap dict keys
    with pytest.raises(ValueError):
        hashing.prompt_chain_hashes(TOKENS, 0)
