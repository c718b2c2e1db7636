"""Deterministic output text: token ``i`` of a prompt is a word picked by a hash of both.

The same request gives the same text on any engine, colocated or as the decode hop of a
disaggregated pair, at any temperature: tests compare paths token for token, as one does
with greedy decoding on real vLLM.
"""

from __future__ import annotations

import hashlib

VOCAB: tuple[str, ...] = tuple(
    " " + w
    for w in (
        "the of and to in is that for on with as by at from it this be are was an or not "
        "model token cache prefill decode batch engine latency stream queue block transfer "
        "router pool kernel memory bandwidth compute layer attention request response value "
        "fast slow large small first next last every each many some other same new old"
    ).split()
)

_MASK = (1 << 64) - 1


def prompt_seed(prompt: str | list[int]) -> int:
    """A stable 64-bit seed of a prompt (text or token ids); Python's ``hash`` is salted."""
    data = prompt.encode() if isinstance(prompt, str) else b"ids:" + ",".join(
        map(str, prompt)).encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def token_text(seed: int, index: int) -> str:
    """Word ``index`` of the output for ``seed`` (splitmix64 of seed and index)."""
    z = (seed + (index + 1) * 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return VOCAB[(z ^ (z >> 31)) % len(VOCAB)]


def output_text(seed: int, start: int, stop: int) -> str:
    """Words ``start`` up to ``stop`` (exclusive), joined."""
    return "".join(token_text(seed, i) for i in range(start, stop))
