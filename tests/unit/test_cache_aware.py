"""Cache-aware routing: the scorer from tables (affinity, the load limit, queued work, ties),
the routing table's predictions, and the proxy end to end against scripted engines: a prompt
goes where its prefix is indexed, and the record carries predicted and reported hits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from controller.config import load_settings
from controller.kvevents.hashing import vllm_block_hashes, vllm_external_hash
from controller.kvevents.index import BlockIndex
from controller.kvevents.wire import BlockStored, KVEventBatch
from controller.models import RequestPath, Role
from controller.router.cache_aware import Candidate, choose
from controller.tokens import estimate_packed_ids, estimate_token_ids, pack_ids
from pdctl_api import profiles
from tests.unit.fake_engines import KV, Answer, Call, FakeEngines, make_proxy, make_table, serve

C = Candidate


@pytest.mark.parametrize(("cands", "prompt", "limit", "start", "want", "cached", "why"), [
    # A cold fleet: fewest queued tokens, whatever the order.
    ([C("a", 0, 500, 0), C("b", 0, 0, 0)], 1000, 4, 0, "b", 0, "no instance holds"),
    # The warm instance wins while its queue is less than what its cache saves.
    ([C("a", 1, 0, 0), C("b", 2, 300, 800)], 1000, 4, 0, "b", 800, "800 of 1,000"),
    # ... and loses once its queue outweighs the saving.
    ([C("a", 1, 0, 0), C("b", 2, 900, 800)], 1000, 4, 0, "a", 0, "900 uncached tokens are"),
    # Past the load limit affinity yields, however warm.
    ([C("a", 0, 0, 0), C("b", 5, 0, 960)], 1000, 4, 0, "a", 0, "over the load limit (0 + 4)"),
    ([C("a", 0, 0, 0), C("b", 4, 0, 960)], 1000, 4, 0, "b", 960, "960 of 1,000"),
    # Load limit 0: affinity only among the least loaded.
    ([C("a", 0, 0, 0), C("b", 1, 0, 960)], 1000, 0, 0, "a", 0, "over the load limit"),
    # The warmest of several partly warm ones.
    ([C("a", 0, 0, 200), C("b", 0, 0, 600), C("c", 0, 0, 400)], 1000, 4, 0, "b", 600,
     "600 of 1,000"),
    # Stale indexes count as cold, and the reason says so.
    ([C("a", 0, 0, 0, trusted=False), C("b", 0, 0, 0)], 1000, 4, 1, "b", 0,
     "1 of 2 without an up-to-date KV index"),
])
def test_the_scorer_decides_by_uncached_plus_queued_tokens_within_the_load_limit(
        cands: list[Candidate], prompt: int, limit: int, start: int, want: str, cached: int,
        why: str) -> None:
    got = choose(cands, prompt, limit, start)
    assert (got.instance, got.cached_tokens) == (want, cached)
    assert why in got.reason


def test_equal_costs_rotate_instead_of_herding() -> None:
    cands = [C("a", 0, 0, 0), C("b", 0, 0, 0), C("c", 0, 0, 0)]
    assert [choose(cands, 100, 4, k).instance for k in range(6)] == list("abcabc")


def test_no_candidates_is_an_error_not_a_choice() -> None:
    with pytest.raises(ValueError):
        choose([], 100, 4)


# ---- the table and the proxy, with an index fed the events an engine would publish --------

BS = 16


def stored_event(tokens: list[int], blocks: int) -> BlockStored:
    """What a vLLM engine publishes when it caches the first ``blocks`` blocks of tokens."""
    hashes = [vllm_external_hash(h) for h in vllm_block_hashes(tokens[:blocks * BS], BS)]
    return BlockStored(block_hashes=hashes, parent_block_hash=None,
                       token_ids=tokens[:blocks * BS], block_size=BS, lora_id=None,
                       medium="GPU", lora_name=None)


def holding(index: BlockIndex, instance: str, tokens: list[int], blocks: int) -> None:
    last = index.last_seq(instance)
    seq = 0 if last is None else last + 1
    index.apply(instance, seq, KVEventBatch(ts=0.0, events=[stored_event(tokens, blocks)]), 0.0)


TEXT = "the system prompt of a long conversation, " * 40  # 1,680 bytes: 420 tokens, 26 blocks
IDS = estimate_token_ids(TEXT)


def cache_table(tmp_path: Path, **routing: Any) -> tuple[Any, Any]:
    s, table = make_table(tmp_path, prefill=2, decode=2, routing={
        "prefill_policy": "cache_aware", "decode_policy": "cache_aware", **routing})
    table.index = BlockIndex(BS)
    return s, table


def test_the_table_predicts_whole_blocks_and_never_the_last_token(tmp_path: Path) -> None:
    _, table = cache_table(tmp_path)
    holding(table.index, "prefill-1", IDS, 26)
    whole = table.blocks(pack_ids(IDS))
    assert whole is not None and whole.tokens == 420 and len(whole.hashes) == 26
    assert table.cached("prefill-1", whole) == 416  # all 26 blocks, 4 tokens left over
    aligned = table.blocks(pack_ids(IDS[:416]))
    assert aligned is not None and table.cached("prefill-1", aligned) == 400  # not the last
    assert table.cached("prefill-2", whole) == 0
    table.index.mark_stale("prefill-1", "test")
    assert table.cached("prefill-1", whole) == 0 and not table.trusted("prefill-1")


def test_queued_tokens_follow_the_lease(tmp_path: Path) -> None:
    _, table = cache_table(tmp_path)
    inst = table.ready(Role.PREFILL)[0]
    with table.lease(inst) as lease:
        lease.queue(300)
        assert table.queued_tokens(inst.id) == 300
        lease.queue(100)  # replaces
        assert table.queued_tokens(inst.id) == 100
    assert table.queued_tokens(inst.id) == 0


def usage_with_cache(cached: int) -> dict[str, Any]:
    return {"prompt_tokens": 420, "completion_tokens": 1,
            "prompt_tokens_details": {"cached_tokens": cached}}


async def test_a_prompt_goes_where_its_prefix_is_and_the_record_says_so(tmp_path: Path
                                                                       ) -> None:
    async def prefill(call: Call) -> Answer:
        return Answer(200, {"choices": [{"text": "x"}], "kv_transfer_params": KV,
                            "usage": usage_with_cache(400)})

    async def decode(call: Call) -> Answer:
        return Answer(200, {"choices": [{"text": "ok"}], "usage": usage_with_cache(416)})

    engines = FakeEngines({"prefill-1": prefill, "prefill-2": prefill,
                           "decode-1": decode, "decode-2": decode})
    proxy, table = make_proxy(tmp_path, engines, prefill=2, decode=2, routing={
        "prefill_policy": "cache_aware", "decode_policy": "cache_aware"})
    table.index = BlockIndex(BS)
    holding(table.index, "prefill-2", IDS, 25)
    holding(table.index, "decode-2", IDS, 10)
    raw = b'{"prompt": "' + TEXT.encode() + b'", "max_tokens": 2}'
    for _ in range(3):  # the same prompt, again and again: it stays where it is warm
        served = await serve(proxy, raw)
        rec = served.record
        assert served.status == 200 and rec.path is RequestPath.DISAGGREGATED
        assert (rec.prefill_instance, rec.decode_instance) == ("prefill-2", "decode-2")
        assert rec.cached_tokens_predicted == 400 and rec.cached_tokens == 400
        assert rec.decode_cached_tokens_predicted == 160
    s = load_settings(None, controller={"state_dir": tmp_path})  # the KV decode lacked
    assert rec.kv_bytes == profiles.kv_bytes(s.model_profile, 420 - 160, s.kv_block_size)
    # With round robin nothing is predicted, and what the engines report is still kept.
    table.update({"prefill_policy": "round_robin", "decode_policy": "round_robin"}, "test")
    rec = (await serve(proxy, raw)).record
    assert rec.cached_tokens_predicted is None and rec.cached_tokens == 400


async def test_a_stale_index_routes_by_load_and_predicts_nothing_there(tmp_path: Path
                                                                       ) -> None:
    engines = FakeEngines()
    proxy, table = make_proxy(tmp_path, engines, prefill=2, decode=2, routing={
        "prefill_policy": "cache_aware"})
    table.index = BlockIndex(BS)
    holding(table.index, "prefill-2", IDS, 25)
    table.index.mark_stale("prefill-2", "garbage on the wire")
    raw = b'{"prompt": "' + TEXT.encode() + b'", "max_tokens": 2}'
    seen = {(await serve(proxy, raw)).record.prefill_instance for _ in range(4)}
    assert seen == {"prefill-1", "prefill-2"}  # spread by load, no affinity
    assert proxy.requests.recent(1)[0].cached_tokens_predicted == 0


@pytest.mark.parametrize("text", ["", "a", "abcd", "abcde", "héllo wörld " * 7, "x" * 4097])
def test_a_text_prompt_packs_to_its_estimated_ids(text: str) -> None:
    """The simulator's estimate hashes text without a list of ids: the same bytes."""
    assert estimate_packed_ids(text) == pack_ids(estimate_token_ids(text))


async def test_token_ids_no_index_can_hold_are_routed_by_load(tmp_path: Path) -> None:
    proxy, table = make_proxy(tmp_path, FakeEngines(), prefill=2, decode=2, routing={
        "prefill_policy": "cache_aware", "decode_policy": "cache_aware"})
    table.index = BlockIndex(BS)
    served = await serve(proxy, b'{"prompt": [1, 2, 3, 5000000000], "max_tokens": 2}')
    assert served.status == 200 and served.record.cached_tokens_predicted is None
