"""The block index under event sequences: store, remove, clear, gaps, replays, staleness,
restarts, what it does not index, its bounds and its health."""

from __future__ import annotations

import pytest

from controller.kvevents.hashing import prompt_chain_hashes
from controller.kvevents.index import (
    Applied,
    BlockIndex,
    Duplicate,
    Ignored,
    MarkedStale,
    NeedReplay,
    Restarted,
)
from controller.kvevents.wire import AllBlocksCleared, BlockStored
from tests.unit.kvevents.events import OTHER, PROMPT, B, batch, removed, stored


def held(index: BlockIndex, name: str, tokens: list[int] = PROMPT) -> int:
    return index.longest_prefix(name, prompt_chain_hashes(tokens, B)) // B


@pytest.fixture
def index() -> BlockIndex:
    ix = BlockIndex(B)
    ix.add("p0")
    ix.add("p1")
    return ix


def test_store_in_two_events_then_the_prefix_is_held(index: BlockIndex) -> None:
    assert index.apply("p0", 0, batch(stored(PROMPT, 0, 2)), 0.0) == Applied("p0", 0, 2, 0,
                                                                              False)
    index.apply("p0", 1, batch(stored(PROMPT, 2, 2)), 0.0)
    assert held(index, "p0") == 4 and held(index, "p1") == 0
    assert index.longest_prefix("p0", prompt_chain_hashes(PROMPT[:10], B)) == 2 * B
    assert held(index, "p0", OTHER) == 0
    diverged = PROMPT[:2 * B] + [0] * (4 * B)
    assert held(index, "p0", diverged) == 2
    assert index.overlaps(prompt_chain_hashes(PROMPT, B)) == {"p0": 4 * B, "p1": 0}


def test_remove_and_clear(index: BlockIndex) -> None:
    index.apply("p0", 0, batch(stored(PROMPT, 0, 4), stored(OTHER, 0, 2)), 0.0)
    out = index.apply("p0", 1, batch(removed(PROMPT, 3, 2), removed(OTHER, 5)), 0.0)
    assert out == Applied("p0", 1, 0, 2, False)  # a hash it never held is ignored
    assert held(index, "p0") == 2 and held(index, "p0", OTHER) == 2
    index.apply("p0", 2, batch(AllBlocksCleared(), stored(OTHER, 0, 1)), 0.0)
    assert held(index, "p0") == 0 and held(index, "p0", OTHER) == 1


def test_a_hash_stored_twice_needs_two_removals(index: BlockIndex) -> None:
    index.apply("p0", 0, batch(stored(PROMPT, 0, 2), stored(PROMPT, 0, 2)), 0.0)
    index.apply("p0", 1, batch(removed(PROMPT, 1)), 0.0)
    assert held(index, "p0") == 2
    index.apply("p0", 2, batch(removed(PROMPT, 1)), 0.0)
    assert held(index, "p0") == 1


def test_engines_with_other_seeds_and_hash_forms_index_alike(index: BlockIndex) -> None:
    index.apply("p0", 0, batch(stored(PROMPT, 0, 3)), 0.0)
    index.apply("p1", 0, batch(stored(PROMPT, 0, 2, seed="17", as_int=False),
                               stored(PROMPT, 2, 1, seed="17", as_int=False)), 0.0)
    assert held(index, "p0") == held(index, "p1") == 3


def test_a_gap_asks_for_a_replay_and_applies_nothing(index: BlockIndex) -> None:
    index.apply("p0", 0, batch(stored(PROMPT, 0, 1)), 0.0)
    assert index.apply("p0", 3, batch(stored(PROMPT, 3, 1)), 0.0) == NeedReplay("p0", 1)
    assert index.last_seq("p0") == 0
    for seq, start in ((1, 1), (2, 2), (3, 3)):  # the replay
        assert isinstance(index.apply("p0", seq, batch(stored(PROMPT, start, 1)), 0.0), Applied)
    assert index.apply("p0", 3, batch(stored(PROMPT, 3, 1)), 0.0) == Duplicate("p0", 3)
    assert held(index, "p0") == 4
    assert index.health("p0", 0.0).replays == 1  # type: ignore[union-attr]


def test_a_first_batch_past_zero_asks_for_everything(index: BlockIndex) -> None:
    assert index.apply("p0", 5, batch(), 0.0) == NeedReplay("p0", 0)
    assert index.apply("new", 2, batch(), 0.0) == NeedReplay("new", 0)  # auto-added


def test_stale_until_all_blocks_cleared(index: BlockIndex) -> None:
    index.apply("p0", 0, batch(stored(PROMPT, 0, 3)), 0.0)
    assert index.replay_failed("p0", "gone") == MarkedStale("p0", "replay failed: gone")
    assert not index.trusted("p0") and held(index, "p0") == 0
    assert "p0" not in index.overlaps(prompt_chain_hashes(PROMPT, B))
    # a stale instance takes any later seq (no replay) but trusts nothing it hears
    assert index.apply("p0", 9, batch(stored(PROMPT, 0, 1)), 0.0) == Ignored("p0", 9)
    assert held(index, "p0") == 0
    out = index.apply("p0", 10, batch(stored(PROMPT, 0, 1), AllBlocksCleared(),
                                      stored(OTHER, 0, 2)), 0.0)
    assert out == Applied("p0", 10, 2, 0, True)
    assert index.trusted("p0") and held(index, "p0", OTHER) == 2 and held(index, "p0") == 0


def test_a_publisher_restart_drops_entries_and_rebuilds(index: BlockIndex) -> None:
    index.apply("p0", 0, batch(stored(PROMPT, 0, 3)), 0.0)
    index.apply("p0", 1, batch(stored(OTHER, 0, 1)), 0.0)
    index.mark_stale("p0", "garbage")
    out = index.apply("p0", 0, batch(stored(OTHER, 0, 2)), 0.0)
    assert out == Restarted("p0", Applied("p0", 0, 2, 0, False))
    assert index.trusted("p0") and held(index, "p0") == 0 and held(index, "p0", OTHER) == 2
    assert index.health("p0", 0.0).restarts == 1  # type: ignore[union-attr]


def test_removed_instances_drop_everything(index: BlockIndex) -> None:
    index.apply("p0", 0, batch(stored(PROMPT, 0, 3)), 0.0)
    index.remove("p0")
    assert held(index, "p0") == 0 and index.health("p0", 0.0) is None
    assert index.instances() == ["p1"]
    index.mark_stale("p0", "late news")  # a subscriber stopping late does not re-add it
    assert index.instances() == ["p1"]
    index.add("p0")  # started again: fresh from seq 0
    assert isinstance(index.apply("p0", 0, batch(stored(PROMPT, 0, 1)), 0.0), Applied)


@pytest.mark.parametrize("event", [
    stored(PROMPT, 0, 2, medium="CPU"),
    stored(PROMPT, 0, 2, block_size=2, token_ids=PROMPT[:2 * 2]),
    stored(PROMPT, 0, 2, lora_id=1, lora_name="a"),
    stored(PROMPT, 0, 2, extra_keys=[("salt",), None]),
    stored(PROMPT, 0, 2, token_ids=PROMPT[:7]),
])
def test_what_token_ids_alone_cannot_predict_is_skipped(index: BlockIndex,
                                                        event: BlockStored) -> None:
    out = index.apply("p0", 0, batch(event), 0.0)
    assert out == Applied("p0", 0, 0, 0, False)
    assert held(index, "p0") == 0 and index.health("p0", 0.0).skipped == 2  # type: ignore


def test_a_child_whose_parent_is_unknown_is_unresolved(index: BlockIndex) -> None:
    index.apply("p0", 0, batch(stored(PROMPT, 2, 2)), 0.0)
    h = index.health("p0", 0.0)
    assert h is not None and h.unresolved == 2 and h.blocks == 0
    index.apply("p0", 1, batch(stored(PROMPT, 0, 1, extra_keys=[None]), stored(PROMPT, 1, 1)),
                0.0)
    assert held(index, "p0") == 2


def test_memory_is_bounded() -> None:
    ix = BlockIndex(B, max_blocks=5)
    assert isinstance(ix.apply("p0", 0, batch(stored(PROMPT, 0, 5)), 0.0), Applied)
    out = ix.apply("p0", 1, batch(stored(PROMPT, 5, 1)), 0.0)
    assert isinstance(out, MarkedStale) and "more than 5" in out.reason
    assert ix.health("p0", 0.0).blocks == 0  # type: ignore[union-attr]


def test_health_and_rate(index: BlockIndex) -> None:
    for seq in range(10):
        index.apply("p0", seq, batch(stored(PROMPT, 0, 1), removed(PROMPT, 0)), seq * 1.0)
    index.apply("p0", 10, batch(stored(PROMPT, 0, 3)), 10.0)
    h = index.health("p0", 10.0)
    assert h is not None
    assert (h.blocks, h.last_seq, h.stale, h.events) == (3, 10, False, 21)
    assert h.events_per_s == pytest.approx(2.0)
    assert [x.instance for x in index.health_all(10.0)] == ["p0", "p1"]


def test_silence_after_expected_work_marks_stale(index: BlockIndex) -> None:
    index.note_expected("p0", 0.0)
    index.note_expected("p1", 0.0)
    index.apply("p1", 0, batch(stored(PROMPT, 0, 1)), 1.0)  # p1 answered
    assert index.check_silence(3.0, 5.0) == []
    assert index.check_silence(6.0, 5.0, instance="p1") == []
    out = index.check_silence(6.0, 5.0)
    assert [m.instance for m in out] == ["p0"] and not index.trusted("p0")
    assert index.trusted("p1")


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        BlockIndex(0)
