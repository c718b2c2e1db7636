"""Server-sent events as the engines stream them: whole events from network reads (an event
may arrive split across reads, or several in one), the end marker, the usage-only event the
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


class EventFramer:
    """Whole events from a stream's reads: ``feed`` returns the complete events read so far
    (ending with their blank line) and keeps a trailing part until the read that ends it, so
    that what edits events never sees half of one. A read of whole events, the usual case,
    passes through without a copy."""

    __slots__ = ("_rest",)

    def __init__(self) -> None:
        self._rest = b""

    def feed(self, read: bytes) -> bytes:
        if not self._rest and read.endswith((b"\n\n", b"\r\n\r\n")):
            return read
        data = self._rest + read if self._rest else read
        lf, crlf = data.rfind(b"\n\n"), data.rfind(b"\r\n\r\n")
        cut = max(lf + 2 if lf >= 0 else -1, crlf + 4 if crlf >= 0 else -1)
        if cut < 0:
            self._rest = data
            return b""
        self._rest = data[cut:]
        return data[:cut]

    def flush(self) -> bytes:
        """What the stream's end left unterminated (an engine that closed mid-event)."""
        rest, self._rest = self._rest, b""
        return rest


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
