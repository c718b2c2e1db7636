"""vLLM 0.32's KV-event wire format, mirrored field for field.

What ``vllm/distributed/kv_events.py`` (``ZmqEventPublisher``) sends on its PUB socket is a
three-frame multipart message ``(topic, seq, payload)``: the topic as UTF-8, the sequence
number as 8 bytes big-endian (0, 1, 2, ... from the publisher's start), and the payload, a
msgpack-encoded ``KVEventBatch``. The batch is an *array* ``[ts, events, dp_rank]``
(``array_like=True``, ``omit_defaults=True``: a ``None`` rank is left off); each event is a
*map* tagged with its class name under ``"type"`` (``tag=True``), with fields at their
defaults left off. The structs below carry the same names, fields, order, defaults and
options, so bytes from vLLM's classes decode here and ours decode there (tested both ways).

The replay socket (a ROUTER at the publisher) takes ``[b"", seq]`` from a DEALER (8 bytes
big-endian: the first sequence number wanted) and answers ``[b"", topic, seq, payload]`` for
every batch it still buffers from there on, then ``[b"", b"", END_SEQ, b""]``.

Anything that does not decode raises ``WireError`` (a ``ValueError``), and only that."""

from __future__ import annotations

from typing import Any

import msgspec

# vLLM's ExternalBlockHash: 64-bit ints by default (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1),
# the raw hash bytes when that variable is 0.
EngineBlockHash = bytes | int

SEQ_BYTES = 8
END_SEQ = (-1).to_bytes(SEQ_BYTES, "big", signed=True)
MEDIUM_GPU = "GPU"


class WireError(ValueError):
    """A message that is not a KV-event message of vLLM's format."""


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """The base of the tagged events (the tag is the class name)."""


class BlockStored(KVCacheEvent):
    block_hashes: list[EngineBlockHash]
    parent_block_hash: EngineBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[EngineBlockHash]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBatch(EventBatch):
    events: list[KVEvent]


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(KVEventBatch)


def encode_batch(batch: KVEventBatch) -> bytes:
    return _ENCODER.encode(batch)


def decode_batch(payload: bytes) -> KVEventBatch:
    try:
        return _DECODER.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError, TypeError, ValueError) as e:
        raise WireError(f"not a KV event batch: {e}") from None


def encode_seq(seq: int) -> bytes:
    return seq.to_bytes(SEQ_BYTES, "big")


def decode_seq(frame: bytes) -> int:
    if len(frame) != SEQ_BYTES:
        raise WireError(f"a sequence number is {SEQ_BYTES} bytes, got {len(frame)}")
    return int.from_bytes(frame, "big")


def encode_message(topic: str, seq: int, batch: KVEventBatch) -> list[bytes]:
    """The frames a publisher sends (the simulated engine publishes with this)."""
    return [topic.encode(), encode_seq(seq), encode_batch(batch)]


def decode_message(frames: list[bytes]) -> tuple[str, int, KVEventBatch]:
    """``(topic, seq, batch)`` from the frames of one published message."""
    if len(frames) != 3:
        raise WireError(f"a KV event message has 3 frames, got {len(frames)}")
    topic, seq, payload = frames
    try:
        name = topic.decode()
    except UnicodeDecodeError:
        raise WireError("the topic is not UTF-8") from None
    return name, decode_seq(seq), decode_batch(payload)


def replay_request(from_seq: int) -> list[bytes]:
    """What a DEALER sends the publisher's ROUTER to get every buffered batch from
    ``from_seq`` on (the ROUTER sees ``[identity, b"", seq]``, as it requires)."""
    return [b"", encode_seq(from_seq)]


def decode_replay_frame(frames: list[bytes]) -> tuple[str, int, KVEventBatch] | None:
    """One reply on the replay DEALER: a batch, or ``None`` for the end marker."""
    if len(frames) != 4 or frames[0] != b"":
        raise WireError(f"a replay reply is [b'', topic, seq, payload], got {len(frames)} "
                        "frames")
    if frames[2] == END_SEQ:
        return None
    return decode_message(frames[1:])
