"""Counting prompt tokens of OpenAI-style request bodies.

The controller needs a prompt's length to choose the disaggregated or colocated path, and the
simulated engine needs it to model work. With a model directory holding ``tokenizer.json`` the
count comes from that tokenizer (``tokenizers``); without one it falls back to
``ceil(utf-8 bytes / 4)``, the usual rough ratio for English BPE text. Chat requests are
counted over a plain rendering of their messages (``role: content`` per line) rather than the
model's chat template, so a chat prompt's count is a close estimate, not exact.
"""

from __future__ import annotations

import array
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

BYTES_PER_TOKEN = 4
ID_BYTES = 4  # a packed token id (``pack_ids``)
_BIG_ENDIAN = sys.byteorder == "big"
assert array.array("I").itemsize == ID_BYTES


def pack_ids(token_ids: Sequence[int]) -> bytes:
    """Token ids as unsigned 32-bit little-endian integers, back to back: what the prefix
    cache's block hashes are computed over (``controller.kvevents.hashing``). Raises
    ``OverflowError`` for an id outside 0..2**32-1."""
    packed = array.array("I", token_ids)
    if _BIG_ENDIAN:
        packed.byteswap()
    return packed.tobytes()


def estimate_tokens(text: str) -> int:
    """Fallback count: one token per four UTF-8 bytes, at least one for non-empty text."""
    if not text:
        return 0
    return max(1, math.ceil(len(text.encode("utf-8")) / BYTES_PER_TOKEN))


def estimate_packed_ids(text: str) -> bytes:
    """``estimate_token_ids`` packed as ``controller.kvevents.hashing.pack_ids`` packs ids
    (unsigned 32-bit little-endian): the text's UTF-8 bytes, zero-padded to 4-byte pieces."""
    data = text.encode("utf-8")
    pad = -len(data) % BYTES_PER_TOKEN
    return data + b"\0" * pad if pad else data


def estimate_token_ids(text: str) -> list[int]:
    """Token ids of the fallback count: each 4-byte piece of the UTF-8 text is one token, its
    id the piece's bytes as a little-endian integer (the last piece zero-padded). As many ids
    as ``estimate_tokens`` counts, and two texts share leading ids exactly where they share
    leading 4-byte pieces: what the simulated engine caches prefixes by, and what the router
    predicts its hits from."""
    data = estimate_packed_ids(text)
    if _BIG_ENDIAN:
        return [int.from_bytes(data[i:i + 4], "little") for i in range(0, len(data), 4)]
    return memoryview(data).cast("I").tolist()


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def render_messages(messages: Any) -> str:
    """A plain rendering of chat messages used only for counting tokens."""
    if not isinstance(messages, list):
        return ""
    lines = []
    for msg in messages:
        if isinstance(msg, dict):
            lines.append(f"{msg.get('role', 'user')}: {_content_text(msg.get('content'))}")
    return "\n".join(lines)


def prompt_of(body: dict[str, Any]) -> str | list[int]:
    """The prompt of a completion or chat body: text, or token ids when given as ids."""
    if "messages" in body:
        return render_messages(body["messages"])
    prompt = body.get("prompt", "")
    if isinstance(prompt, list):
        if prompt and all(isinstance(t, int) for t in prompt):
            return list(prompt)
        return "".join(p for p in prompt if isinstance(p, str))
    return prompt if isinstance(prompt, str) else ""


class TokenCounter(Protocol):
    """``exact``: a completion prompt's count is the engines' own; ``exact_chat``: so is a
    chat prompt's (only when the engines count the same way, as the simulator does)."""

    exact: bool
    exact_chat: bool

    def count(self, body: dict[str, Any]) -> int: ...

    def token_ids(self, body: dict[str, Any]) -> list[int]:
        """The prompt's token ids as this counter counts them (``len`` is ``count``)."""
        ...

    def packed_ids(self, body: dict[str, Any]) -> bytes:
        """``token_ids`` packed (``controller.kvevents.hashing.pack_ids``); ``OverflowError``
        for token ids outside 0..2**32-1."""
        ...


class EstimatingCounter:
    """Counts with the byte-length fallback."""

    name = "estimate (utf-8 bytes / 4)"

    def __init__(self, exact: bool = False) -> None:
        self.exact = self.exact_chat = exact

    def count(self, body: dict[str, Any]) -> int:
        prompt = prompt_of(body)
        return len(prompt) if isinstance(prompt, list) else estimate_tokens(prompt)

    def token_ids(self, body: dict[str, Any]) -> list[int]:
        prompt = prompt_of(body)
        return prompt if isinstance(prompt, list) else estimate_token_ids(prompt)

    def packed_ids(self, body: dict[str, Any]) -> bytes:
        prompt = prompt_of(body)
        return pack_ids(prompt) if isinstance(prompt, list) else estimate_packed_ids(prompt)


class TokenizerCounter:
    """Counts with the model's own ``tokenizer.json``."""

    exact_chat = False  # no chat template here

    def __init__(self, tokenizer_file: Path, exact: bool = False) -> None:
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(str(tokenizer_file))
        self._last: tuple[str, list[int]] | None = None
        self.name = f"tokenizer {tokenizer_file}"
        self.exact = exact

    def count(self, body: dict[str, Any]) -> int:
        return len(self.token_ids(body))

    def token_ids(self, body: dict[str, Any]) -> list[int]:
        prompt = prompt_of(body)
        if isinstance(prompt, list):
            return prompt
        if not prompt:
            return []
        # The router counts a prompt, then (a pool routing by cache) hashes its ids: the
        # last text's ids are kept so that it is tokenized once.
        last = self._last
        if last is not None and last[0] == prompt:
            return last[1]
        ids = list(self._tok.encode(prompt, add_special_tokens=True).ids)
        self._last = (prompt, ids)
        return ids

    def packed_ids(self, body: dict[str, Any]) -> bytes:
        return pack_ids(self.token_ids(body))


def make_counter(model_dir: Path | None, backend: str = "external") -> TokenCounter:
    """The model's tokenizer when ``model_dir/tokenizer.json`` exists, else the estimate.
    Exact where the engines of ``backend`` count alike: vLLM with the same tokenizer, the
    simulator with the same estimate."""
    if model_dir is not None and (model_dir / "tokenizer.json").is_file():
        return TokenizerCounter(model_dir / "tokenizer.json", exact=backend == "vllm")
    return EstimatingCounter(exact=backend == "sim")
