"""Server-sent events as the engines stream them: the end marker, the usage-only event the
router may have asked for, the router's fields an event may carry, and the last event that
carries usage and metrics."""

from __future__ import annotations

from typing import Any

import orjson

DONE = b"data: [DONE]"
DONE_EVENT = b"data: [DONE]\n\n"
TAIL_BYTES = 16384  # of a stream kept to find its last events
ROUTER_FIELD = b'"kv_transfer_params"'
EMPTY_CHOICES, EMPTY_CHOICES_SPACED = b'"choices":[]', b'"choices": []'


def _empty_choices(event: bytes) -> bool:
    return EMPTY_CHOICES in event or EMPTY_CHOICES_SPACED in event


def _usage_only(event: bytes) -> bool:
    return b'"usage"' in event and _empty_choices(event)


def strip_usage_event(chunk: bytes) -> bytes:
    """Drop the usage-only SSE event (empty ``choices``) from a relayed chunk."""
    if not _empty_choices(chunk):
        return chunk
    return b"\n\n".join(e for e in chunk.split(b"\n\n") if not _usage_only(e))


def strip_router_fields(chunk: bytes) -> bytes:
    """Drop ``kv_transfer_params`` (the router's, never the client's) from each JSON event
    of a relayed chunk; a chunk without it is returned as it is."""
    if ROUTER_FIELD not in chunk:
        return chunk
    events = chunk.split(b"\n\n")
    for k, event in enumerate(events):
        if ROUTER_FIELD in event and event.startswith(b"data:"):
            try:
                data = orjson.loads(event[5:])
            except ValueError:
                continue
            if isinstance(data, dict):
                data.pop("kv_transfer_params", None)
                events[k] = b"data: " + orjson.dumps(data)
    return b"\n\n".join(events)


def error_event(message: str) -> bytes:
    """The event (and end marker) that ends a stream the engine broke off."""
    event = {"error": {"message": message, "type": "upstream_error", "code": 502}}
    return b"data: " + orjson.dumps(event) + b"\n\n" + DONE_EVENT


def last_event(tail: bytes) -> dict[str, Any] | None:
    """The last JSON ``data:`` event of an SSE stream tail that carries usage or metrics,
    else the last JSON event."""
    found: dict[str, Any] | None = None
    for line in reversed(tail.split(b"\n")):
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]" or not data.startswith(b"{"):
            continue
        try:
            event = orjson.loads(data)
        except ValueError:
            continue
        if not isinstance(event, dict):
            continue
        if found is None:
            found = event
        if "metrics" in event or "usage" in event and event["usage"]:
            merged = dict(event)
            for key in ("usage", "metrics"):
                if not merged.get(key) and found.get(key):
                    merged[key] = found[key]
            if merged.get("metrics") and merged.get("usage"):
                return merged
            found = merged
    return found
