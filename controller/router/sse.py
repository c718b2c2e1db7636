"""Server-sent events as the engines stream them: the end marker, the usage-only event the
router may have asked for, and the last event that carries usage and metrics."""

from __future__ import annotations

from typing import Any

import orjson

DONE = b"data: [DONE]"
DONE_EVENT = b"data: [DONE]\n\n"
TAIL_BYTES = 16384  # of a stream kept to find its last events
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
