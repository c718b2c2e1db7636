"""``pdctl replay``'s prompts and schedule: shared hash ids <=> identical token blocks, exact
lengths, the fit to a context, and the send times under time and rate scales."""

from __future__ import annotations

import itertools

import pytest

from controller.replay.prompts import (
    ID_BASE,
    ID_SPAN,
    PIECE_BYTES,
    PromptMaker,
    block_tokens,
    fit_context,
    ids_text,
)
from controller.replay.schedule import Slice, due_times, select
from controller.replay.trace import BLOCK_TOKENS, Trace, TraceRequest
from tests.unit.test_replay_trace import MOONCAKE, needs_traces


def _req(line: int, t: float, inp: int, out: int = 10, ids: tuple[int, ...] | None = None
         ) -> TraceRequest:
    return TraceRequest(line, t, inp, out, ids or tuple(range(-(-inp // BLOCK_TOKENS))))


def test_a_block_is_a_function_of_its_id_alone() -> None:
    assert block_tokens(7) == block_tokens(7)
    assert len(block_tokens(7)) == BLOCK_TOKENS
    ids = [0, 1, 2, 499, 500, 501, 10**6, 12345678]
    blocks = [tuple(block_tokens(i)) for i in ids]
    assert len(set(blocks)) == len(ids)
    assert all(ID_BASE <= t < ID_BASE + ID_SPAN for b in blocks for t in b)
    with pytest.raises(ValueError):
        block_tokens(-1)


def test_prompts_share_exactly_the_blocks_their_hash_ids_share() -> None:
    maker = PromptMaker(cache_blocks=3)  # a small cache: rebuilt blocks must be the same
    a = maker.prompt((0, 1, 2, 3), 2000)
    b = maker.prompt((0, 1, 9, 3), 1800)
    assert len(a) == 2000 and len(b) == 1800
    blocks_a = [a[i:i + BLOCK_TOKENS] for i in range(0, 2000, BLOCK_TOKENS)]
    blocks_b = [b[i:i + BLOCK_TOKENS] for i in range(0, 1800, BLOCK_TOKENS)]
    assert blocks_a[0] == blocks_b[0] and blocks_a[1] == blocks_b[1]
    assert blocks_a[2] != blocks_b[2]
    # the same id makes the same block; the last block is cut to the length
    assert blocks_b[3] == blocks_a[3][:len(blocks_b[3])] == block_tokens(3)[:264]
    # the shared prefix is exactly the two shared blocks
    common = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    assert common >= 2 * BLOCK_TOKENS and common < 3 * BLOCK_TOKENS


@needs_traces
def test_on_the_trace_equal_block_ids_iff_equal_token_blocks() -> None:
    from controller.replay.trace import load_trace

    reqs = load_trace(MOONCAKE).requests[:60]
    maker = PromptMaker()
    blocks = {}
    for r in reqs:
        ids = maker.prompt(r.hash_ids, r.input_length)
        assert len(ids) == r.input_length
        for n, h in enumerate(r.hash_ids):
            chunk = tuple(ids[n * BLOCK_TOKENS:(n + 1) * BLOCK_TOKENS])
            if len(chunk) == BLOCK_TOKENS:
                blocks.setdefault(h, set()).add(chunk)
    assert all(len(v) == 1 for v in blocks.values())
    full = {h: next(iter(v)) for h, v in blocks.items()}
    for (h1, b1), (h2, b2) in itertools.combinations(full.items(), 2):
        assert (b1 == b2) == (h1 == h2)
    assert len(full) < sum(len(r.hash_ids) for r in reqs)  # the slice does share blocks


def test_prompt_needs_enough_blocks() -> None:
    with pytest.raises(ValueError):
        PromptMaker().prompt((1,), 513)


@pytest.mark.parametrize(("inp", "out", "context", "max_prompt", "expected"), [
    (1000, 100, 8192, None, (1000, 100, False)),
    (8092, 100, 8192, None, (8092, 100, False)),
    (12000, 100, 8192, None, (8092, 100, True)),
    (12000, 9000, 8192, None, (1, 8191, True)),
    (12000, 100, None, None, (12000, 100, False)),
    (12000, 100, None, 4096, (4096, 100, True)),
    (3000, 100, 8192, 4096, (3000, 100, False)),
])
def test_fit_keeps_the_completion_and_cuts_the_prompt(
        inp: int, out: int, context: int | None, max_prompt: int | None,
        expected: tuple[int, int, bool]) -> None:
    f = fit_context(_req(1, 0.0, inp, out), context, max_prompt)
    assert (f.prompt_tokens, f.max_tokens, f.clamped) == expected


TRACE = Trace(__import__("pathlib").Path("t"), "mooncake", tuple(
    _req(i + 1, t, 600) for i, t in enumerate([0.0, 0.0, 3.0, 6.0, 9.0, 12.0])))


@pytest.mark.parametrize(("sl", "lines", "due"), [
    (Slice(0, None), [1, 2, 3, 4, 5, 6], [0, 0, 3, 6, 9, 12]),
    (Slice(0, 3, time_scale=0.1), [1, 2, 3], [0, 0, 0.3]),
    (Slice(0, None, rate_scale=2), [1, 2, 3, 4, 5, 6], [0, 0, 1.5, 3, 4.5, 6]),
    (Slice(0, None, time_scale=0.5, rate_scale=2), [1, 2, 3, 4, 5, 6],
     [0, 0, 0.75, 1.5, 2.25, 3]),
    (Slice(5, None), [4, 5, 6], [1, 4, 7]),
    (Slice(6, 2, time_scale=2), [4, 5], [0, 6]),
    (Slice(13, None), [], []),
])
def test_the_schedule_under_time_and_rate_scale(sl: Slice, lines: list[int],
                                                due: list[float]) -> None:
    picked = select(TRACE, sl)
    assert [r.line for r in picked] == lines
    assert due_times(picked, sl) == pytest.approx(due)


def test_time_and_rate_scale_are_the_same_schedule() -> None:
    a, b = Slice(0, None, time_scale=0.25), Slice(0, None, rate_scale=4)
    assert due_times(list(TRACE.requests), a) == due_times(list(TRACE.requests), b)
    assert a.trace_s(3.0) == 12.0


@pytest.mark.parametrize("kwargs", [{"start_s": -1, "limit": None},
                                    {"start_s": 0, "limit": 0},
                                    {"start_s": 0, "limit": None, "time_scale": 0},
                                    {"start_s": 0, "limit": None, "rate_scale": -2}])
def test_bad_slices_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Slice(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("tokens", [1, 511, 512, 513, 1024, 1500])
def test_the_json_text_is_the_prompt(tokens: int) -> None:
    import json

    from controller.cli.replay_send import request_body

    maker = PromptMaker()
    ids = (4, 8, 15)
    assert json.loads(maker.prompt_json(ids, tokens)) == maker.prompt(ids, tokens)
    body = json.loads(request_body("m", maker.prompt_json(ids, tokens), 7))
    assert body == {"prompt": maker.prompt(ids, tokens), "model": "m", "max_tokens": 7,
                    "ignore_eos": True, "temperature": 0.0, "stream": True,
                    "stream_options": {"include_usage": True}}


# ---- text prompts (--text-prompts) ---------------------------------------------------------

@pytest.mark.parametrize("tokens", [1, 511, 512, 513, 1500, 2000])
def test_a_text_prompt_keeps_the_token_count(tokens: int) -> None:
    import json

    from controller.tokens import estimate_token_ids, estimate_tokens

    maker = PromptMaker(text=True)
    text = json.loads(maker.prompt_json((0, 1, 2, 3), tokens))
    assert text == maker.prompt_text((0, 1, 2, 3), tokens)
    assert len(text.encode()) == PIECE_BYTES * tokens
    assert estimate_tokens(text) == len(estimate_token_ids(text)) == tokens
    assert text == ids_text(maker.prompt((0, 1, 2, 3), tokens))
    assert text.startswith(f"{block_tokens(0)[0]:03d} ")


def test_text_prompts_share_exactly_the_blocks_their_hash_ids_share() -> None:
    from controller.tokens import estimate_token_ids

    maker = PromptMaker(cache_blocks=3, text=True)
    a = maker.prompt_text((0, 1, 2, 3), 2000)
    b = maker.prompt_text((0, 1, 9, 3), 1800)
    common = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    # equal text exactly as long as the shared blocks' tokens (to within the first differing
    # token's piece, whose leading digits may agree)
    assert 2 * BLOCK_TOKENS * PIECE_BYTES <= common < (2 * BLOCK_TOKENS + 1) * PIECE_BYTES
    ta, tb = estimate_token_ids(a), estimate_token_ids(b)
    shared = next(i for i, (x, y) in enumerate(zip(ta, tb, strict=False)) if x != y)
    ids_a, ids_b = maker.prompt((0, 1, 2, 3), 2000), maker.prompt((0, 1, 9, 3), 1800)
    assert shared == next(i for i, (x, y) in enumerate(zip(ids_a, ids_b, strict=False))
                          if x != y)
    # the engine's token ids are one-to-one with the prompt's ids
    assert len({(x, y) for x, y in zip(ta, ids_a, strict=True)}) == len(set(ids_a))


@needs_traces
def test_on_the_trace_shared_blocks_iff_equal_text_prefixes() -> None:
    from controller.replay.trace import load_trace

    reqs = load_trace(MOONCAKE).requests[:40]
    maker = PromptMaker(text=True)
    texts = [maker.prompt_text(r.hash_ids, r.input_length) for r in reqs]
    piece = BLOCK_TOKENS * PIECE_BYTES
    for (r1, t1), (r2, t2) in itertools.combinations(zip(reqs, texts, strict=True), 2):
        lead = next((i for i, (x, y) in enumerate(zip(r1.hash_ids, r2.hash_ids, strict=False))
                     if x != y), min(len(r1.hash_ids), len(r2.hash_ids)))
        full = min(lead * BLOCK_TOKENS, r1.input_length, r2.input_length)
        assert t1[:full * PIECE_BYTES] == t2[:full * PIECE_BYTES]
        if lead * piece < min(len(t1), len(t2)):  # the next block differs within its text
            assert t1[lead * piece:(lead + 1) * piece] != t2[lead * piece:(lead + 1) * piece]
