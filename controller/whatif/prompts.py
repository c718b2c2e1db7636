"""A trace request's prompt as the engines' prefix caches see it: chain hashes of its full
blocks, equal exactly where the live replay's prompts share their tokens (``pdctl replay``
renders each 512-token trace block from its id, a partial last block as that block's first
tokens), so a run's cache hits are the ones the real engines would have."""

from __future__ import annotations

from collections.abc import Sequence

from controller.replay.trace import BLOCK_TOKENS


class PromptHasher:
    """Chain hashes per engine block, memoized per (parent, trace block id): prompts that
    share a prefix share the work."""

    def __init__(self, block_size: int) -> None:
        if block_size < 1 or BLOCK_TOKENS % block_size:
            raise ValueError(f"block size {block_size} must divide the trace's "
                             f"{BLOCK_TOKENS}-token blocks")
        self.block_size = block_size
        self._per = BLOCK_TOKENS // block_size
        self._memo: dict[tuple[int, int], tuple[int, ...]] = {}

    def hashes(self, hash_ids: Sequence[int], prompt_tokens: int) -> list[int]:
        """The hashes of the prompt's full engine blocks (``prompt_tokens // block_size``)."""
        full = prompt_tokens // self.block_size
        out: list[int] = []
        parent = 0
        memo, per = self._memo, self._per
        for block_id in hash_ids:
            if len(out) >= full:
                break
            key = (parent, block_id)
            run = memo.get(key)
            if run is None:
                chain, items = parent, []
                for k in range(per):
                    chain = hash((chain, block_id, k))
                    items.append(chain)
                run = memo[key] = tuple(items)
            out.extend(run[:full - len(out)])
            parent = run[-1]
        return out
