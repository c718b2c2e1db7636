"""Modelled duration of one engine step, from ``pdctl_api.profiles``' roofline."""

from __future__ import annotations

from pdctl_api import profiles


def step_duration(m: profiles.ModelProfile, hw: profiles.HardwareProfile, tp: int,
                  prefill_chunks: list[tuple[int, int]], decode_contexts: list[int]) -> float:
    """Modelled seconds of a forward pass over these prefill chunks and decoding sequences.

    ``profiles.step_seconds`` prices one prefill chunk ``(tokens, context)``. Its attention
    term is linear in the context, so several chunks are priced as one chunk of all their
    tokens at the *equivalent context* that gives the same attention FLOPs as the chunks
    priced one by one (it may be negative when many short prompts share a step; the sum
    stays exact).
    """
    tokens = sum(n for n, _ in prefill_chunks)
    context = 0
    if len(prefill_chunks) > 1:
        positions = sum(n * c + n * (n + 1) / 2 for n, c in prefill_chunks)
        context = round((positions - tokens * (tokens + 1) / 2) / tokens)
    elif prefill_chunks:
        context = prefill_chunks[0][1]
    return profiles.step_seconds(m, hw, tp, tokens, context, decode_contexts)
