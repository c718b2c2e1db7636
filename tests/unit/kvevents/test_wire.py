"""The wire format against vLLM 0.32's own classes: same options, same bytes, both ways; and
garbage raises WireError only."""

from __future__ import annotations

import random
from typing import Any

import msgspec
import pytest

from controller.kvevents import wire
from tests.unit.kvevents import vllm_src

CLASSES = ("EventBatch", "KVCacheEvent", "BlockStored", "BlockRemoved", "AllBlocksCleared",
           "KVEventBatch")
CONFIG = ("array_like", "omit_defaults", "tag", "tag_field", "forbid_unknown_fields",
          "frozen", "eq", "order", "gc", "dict", "weakref", "repr_omit_defaults")


def _stored(mod: Any, **kw: Any) -> Any:
    fields = {"block_hashes": [2**64 - 1, 7], "parent_block_hash": 12345,
              "token_ids": list(range(8)), "block_size": 4, "lora_id": None, "medium": "GPU",
              "lora_name": None}
    return mod.BlockStored(**(fields | kw))


def _batches(mod: Any) -> list[Any]:
    return [
        mod.KVEventBatch(ts=1.5, events=[]),
        mod.KVEventBatch(ts=2.0, events=[_stored(mod)], data_parallel_rank=0),
        mod.KVEventBatch(ts=3.0, events=[
            _stored(mod, block_hashes=[b"\x01" * 32], parent_block_hash=None, group_idx=1,
                    extra_keys=[("salt",)], lora_id=3, lora_name="a", session_id="s",
                    kv_cache_spec_kind="full", kv_cache_spec_sliding_window=128,
                    locality="LOCAL", ownership="tier2", medium=None),
            mod.BlockRemoved(block_hashes=[7, b"\x02"], medium="CPU", group_idx=0,
                             locality="REMOTE", ownership="x"),
            mod.AllBlocksCleared(),
        ], data_parallel_rank=3),
    ]


def test_the_structs_have_vllms_fields_defaults_and_options() -> None:
    theirs = vllm_src.kv_events()
    for name in CLASSES:
        a, b = getattr(wire, name), getattr(theirs, name)
        assert a.__struct_fields__ == b.__struct_fields__, name
        assert a.__struct_defaults__ == b.__struct_defaults__, name
        ca, cb = a.__struct_config__, b.__struct_config__
        assert {k: getattr(ca, k) for k in CONFIG} == {k: getattr(cb, k) for k in CONFIG}, name


@pytest.mark.parametrize("i", range(3))
def test_vllm_bytes_decode_here_and_ours_decode_there(i: int) -> None:
    theirs = vllm_src.kv_events()
    enc = msgspec.msgpack.Encoder()  # what ZmqEventPublisher encodes with
    vllm_batch, our_batch = _batches(theirs)[i], _batches(wire)[i]
    vllm_bytes, our_bytes = enc.encode(vllm_batch), wire.encode_batch(our_batch)
    assert vllm_bytes == our_bytes
    decoded = wire.decode_batch(vllm_bytes)
    assert msgspec.to_builtins(decoded) == msgspec.to_builtins(vllm_batch)
    back = msgspec.msgpack.Decoder(theirs.KVEventBatch).decode(our_bytes)
    assert msgspec.to_builtins(back) == msgspec.to_builtins(our_batch)
    assert [type(e).__name__ for e in back.events] == [type(e).__name__ for e in decoded.events]


def test_message_frames_round_trip() -> None:
    batch = _batches(wire)[1]
    frames = wire.encode_message("kv@p-0", 2**40, batch)
    assert frames[1] == (2**40).to_bytes(8, "big")
    assert wire.decode_message(frames) == ("kv@p-0", 2**40, batch)
    assert wire.replay_request(5) == [b"", (5).to_bytes(8, "big")]
    assert wire.decode_replay_frame([b"", *frames]) == ("kv@p-0", 2**40, batch)
    assert wire.decode_replay_frame([b"", b"", wire.END_SEQ, b""]) is None


GARBAGE: list[list[bytes]] = [
    [],
    [b"topic"],
    [b"", b"\x00" * 8],
    [b"", b"\x00" * 8, b"", b"extra"],
    [b"", b"\x00" * 7, wire.encode_batch(wire.KVEventBatch(ts=0.0, events=[]))],
    [b"\xff\xfe", b"\x00" * 8, wire.encode_batch(wire.KVEventBatch(ts=0.0, events=[]))],
    [b"", b"\x00" * 8, b""],
    [b"", b"\x00" * 8, b"\xc1"],
    [b"", b"\x00" * 8, msgspec.msgpack.encode({"ts": 1.0})],
    [b"", b"\x00" * 8, msgspec.msgpack.encode([1.0, [{"type": "Nope"}]])],
    [b"", b"\x00" * 8, msgspec.msgpack.encode([1.0, [{"type": "BlockStored"}]])],
    [b"", b"\x00" * 8, msgspec.msgpack.encode([1.0, [{"type": "BlockRemoved",
                                                     "block_hashes": [1.5],
                                                     "medium": None}]])],
    [b"", b"\x00" * 8, msgspec.msgpack.encode(["x", []])],
]


@pytest.mark.parametrize("frames", GARBAGE)
def test_garbage_raises_wire_error(frames: list[bytes]) -> None:
    with pytest.raises(wire.WireError):
        wire.decode_message(frames)


def test_trailing_batch_fields_are_ignored_as_msgspec_does_for_vllm() -> None:
    payload = msgspec.msgpack.encode([1.0, [], 2, "a later vLLM's field"])
    assert wire.decode_batch(payload) == wire.KVEventBatch(ts=1.0, events=[],
                                                           data_parallel_rank=2)


def test_random_bytes_raise_wire_error_only() -> None:
    rng = random.Random(27)
    good = wire.encode_batch(_batches(wire)[2])
    for _ in range(2000):
        payload = bytes(rng.randrange(256) for _ in range(rng.randrange(40)))
        if rng.random() < 0.5:  # a mangled real payload
            cut = rng.randrange(len(good))
            payload = good[:cut] + payload + good[cut + len(payload):]
        try:
            wire.decode_batch(payload)
        except wire.WireError:
            pass
    for frames in ([b"x"], [b"", b"", b"", b""], [b"a", b"b", b"c", b"d"]):
        with pytest.raises(wire.WireError):
            wire.decode_replay_frame(frames)
