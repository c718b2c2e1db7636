"""Prompts for a trace, as token ids: two requests share exactly the 512-token blocks their
hash ids share.

A block's 512 token ids are a function of its id alone: the id written in base ``ID_SPAN`` in
its first ``ID_DIGITS`` tokens (so two different ids never make the same block, for ids below
``ID_SPAN ** ID_DIGITS``), the rest pseudo-random from the id (SplitMix64). A prompt is its
blocks in order, the last one cut to ``input_length``. Ids lie in ``[ID_BASE, ID_BASE + ID_SPAN)``:
valid for any vocabulary of at least 512 tokens (the lab model has 640) and clear of the
usual special tokens (0-2 in the lab model).

Token ids go to the engine as they are (vLLM's ``"prompt": [ids]``), so the engine's prompt
is exactly ``input_length`` tokens and its prefix cache sees exactly the trace's sharing.

Text prompts (``PromptMaker(text=True)``, ``pdctl replay --text-prompts``) render each token id
as a fixed 4-byte piece, its three decimal digits and a space (``f"{id:03d} "``; every id is
below 1,000): for routers that match on request text (vllm-router's ``cache_aware``). An
engine counting one token per 4 UTF-8 bytes (``controller.tokens.estimate_token_ids``: the
simulated engine without a tokenizer) then sees exactly ``input_length`` tokens and exactly the
same sharing: two prompts share a leading text of ``4 * n`` bytes where they share ``n``
leading token ids. A real tokenizer would count them otherwise.

``fit_context`` makes a request fit a context length: the completion first kept whole (at
most the context less one token), then the prompt cut from its end -- a cut prompt keeps its
leading blocks, so the prefix sharing of what remains is the trace's.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from controller.replay.trace import BLOCK_TOKENS, TraceRequest

ID_BASE = 10
ID_SPAN = 500
ID_DIGITS = 4
CACHE_BLOCKS = 16384  # recent blocks kept (~8 M ids, ~50 MB): conversations reuse them
_TEXT = [str(i) for i in range(ID_BASE + ID_SPAN)]  # an id's JSON text, looked up
PIECE_BYTES = 4  # a text prompt's bytes per token id
_PIECE = [f"{i:03d} " for i in range(ID_BASE + ID_SPAN)]  # an id's text piece, looked up
assert ID_BASE + ID_SPAN <= 1000 and all(len(p) == PIECE_BYTES for p in _PIECE)


def ids_text(ids: list[int]) -> str:
    """Token ids as a text prompt: each id's fixed 4-byte piece (``f"{id:03d} "``)."""
    return "".join(map(_PIECE.__getitem__, ids))


def block_array(block_id: int) -> np.ndarray:
    """The 512 token ids of block ``block_id`` (a non-negative integer), as uint16."""
    if block_id < 0:
        raise ValueError(f"block id {block_id} is negative")
    head, rest = [], block_id
    for _ in range(ID_DIGITS):
        rest, digit = divmod(rest, ID_SPAN)
        head.append(ID_BASE + digit)
    tail = (_mix(block_id) % np.uint64(ID_SPAN)).astype(np.uint16) + np.uint16(ID_BASE)
    return np.concatenate([np.array(head, dtype=np.uint16), tail])


def block_tokens(block_id: int) -> list[int]:
    """``block_array`` as a list."""
    return [int(t) for t in block_array(block_id).tolist()]


_GOLDEN = 0x9E3779B97F4A7C15
_POSITIONS = np.arange(1, BLOCK_TOKENS - ID_DIGITS + 1, dtype=np.uint64) * np.uint64(_GOLDEN)


def _mix(block_id: int) -> np.ndarray:
    """SplitMix64 over the block's positions: deterministic pseudo-random 64-bit words,
    about 10 us a block (numpy's seeded generators cost 10x that)."""
    z = _POSITIONS + np.uint64((block_id * 0xD1B54A32D192ED03 + 1) & (2**64 - 1))
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


class PromptMaker:
    """Token-id prompts from hash ids, as lists or as JSON text: an array of ids, or with
    ``text`` a string of the ids' 4-byte pieces (``ids_text``). Recent blocks are kept with
    their JSON text, so a long prompt's body is a join of cached strings (a 12k-token prompt:
    tens of microseconds, against milliseconds for ``json.dumps`` of its ids)."""

    def __init__(self, cache_blocks: int = CACHE_BLOCKS, text: bool = False) -> None:
        self._cache: OrderedDict[int, tuple[np.ndarray, str]] = OrderedDict()
        self._size = cache_blocks
        self.text = text

    def _render(self, ids: list[int]) -> str:
        """Ids as they go inside the JSON value: pieces (text) or comma-separated numbers."""
        return ids_text(ids) if self.text else ",".join(map(_TEXT.__getitem__, ids))

    def _block(self, block_id: int) -> tuple[np.ndarray, str]:
        got = self._cache.get(block_id)
        if got is None:
            ids = block_array(block_id)
            got = self._cache[block_id] = (ids, self._render(ids.tolist()))
            if len(self._cache) > self._size:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(block_id)
        return got

    def _blocks(self, hash_ids: tuple[int, ...], tokens: int) -> list[tuple[np.ndarray, str]]:
        need = -(-tokens // BLOCK_TOKENS)
        if tokens < 1 or need > len(hash_ids):
            raise ValueError(f"{tokens} tokens need {need} blocks, {len(hash_ids)} given")
        return [self._block(b) for b in hash_ids[:need]]

    def prompt(self, hash_ids: tuple[int, ...], tokens: int) -> list[int]:
        """The first ``tokens`` token ids of the blocks ``hash_ids`` (enough of them)."""
        out: list[int] = []
        for ids, _ in self._blocks(hash_ids, tokens):
            out += ids.tolist()
        del out[tokens:]
        return out

    def prompt_text(self, hash_ids: tuple[int, ...], tokens: int) -> str:
        """``prompt`` as a text prompt (``ids_text``), whatever ``text`` says."""
        return ids_text(self.prompt(hash_ids, tokens))

    def prompt_json(self, hash_ids: tuple[int, ...], tokens: int) -> str:
        """``prompt`` as JSON: an array's text, or with ``text`` a string's (the pieces
        are digits and spaces: nothing to escape)."""
        blocks = self._blocks(hash_ids, tokens)
        cut = tokens - (len(blocks) - 1) * BLOCK_TOKENS
        last = (blocks[-1][1] if cut == BLOCK_TOKENS
                else self._render(blocks[-1][0][:cut].tolist()))
        if self.text:
            return '"' + "".join([text for _, text in blocks[:-1]] + [last]) + '"'
        return "[" + ",".join([text for _, text in blocks[:-1]] + [last]) + "]"


@dataclass(frozen=True, slots=True)
class Fitted:
    """What is sent for one trace request: prompt and completion tokens, and whether they
    were cut to fit the context."""

    prompt_tokens: int
    max_tokens: int
    clamped: bool


def fit_context(req: TraceRequest, context: int | None, max_prompt: int | None = None) -> Fitted:
    """The request's lengths within ``context`` (prompt + completion, None: no limit) and
    ``max_prompt`` (None: no limit). A context under 2 tokens cannot hold a request."""
    prompt, out = req.input_length, req.output_length
    if max_prompt is not None:
        prompt = min(prompt, max_prompt)
    if context is not None:
        if context < 2:
            raise ValueError(f"a context of {context} tokens holds no request")
        out = min(out, context - 1)
        prompt = min(prompt, context - out)
    return Fitted(prompt, out, (prompt, out) != (req.input_length, req.output_length))
