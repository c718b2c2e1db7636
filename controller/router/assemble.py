"""A whole OpenAI answer from the events of a stream (``Assembler``): how the router serves a
non-streaming client from a decode hop it sent streaming. Push mode needs it: the decode
hop's first token is the only sign that the prefill's KV write landed, so a hop whose write
is stuck can be aborted and served colocated instead of waiting for the request timeout.

Merging follows the OpenAI stream format: the choices by ``index``; text fields appended
(``text``, ``content``, ``reasoning_content``, ``reasoning``, ``refusal``, a tool call's
``arguments``); lists appended (``token_ids``, the ``logprobs`` lists), tool calls by their
own ``index``; the finish and stop reasons the last given; any other field the first given.
The top-level fields of the last events (``usage``, vLLM's ``metrics``) are kept."""

from __future__ import annotations

from typing import Any

import orjson

TEXT_FIELDS = frozenset({"text", "content", "reasoning_content", "reasoning", "refusal",
                         "arguments"})
LAST_WINS = frozenset({"finish_reason", "stop_reason"})
TOP_LAST_WINS = frozenset({"usage", "metrics"})
OBJECTS = {"chat.completion.chunk": "chat.completion"}


class AssembleError(ValueError):
    """The stream is not an OpenAI completion or chat stream (or carried an error event)."""


class Assembler:
    """Feed it the JSON events of one stream, in order; ``answer()`` is the whole answer."""

    def __init__(self) -> None:
        self._top: dict[str, Any] = {}
        self._choices: dict[int, dict[str, Any]] = {}
        self._events = 0

    def feed(self, event: dict[str, Any]) -> None:
        if "error" in event and "choices" not in event:
            raise AssembleError(f"the stream carried an error: {event['error']}")
        choices = event.get("choices")
        if not isinstance(choices, list):
            raise AssembleError("a stream event without a choices list")
        self._events += 1
        for key, value in event.items():
            if key == "choices":
                continue
            if value is None:
                self._top.setdefault(key, None)
            elif self._top.get(key) is None or key in TOP_LAST_WINS:
                self._top[key] = value
        for choice in choices:
            if not isinstance(choice, dict) or not isinstance(choice.get("index", 0), int):
                raise AssembleError("a stream choice without an integer index")
            index = choice.get("index", 0)
            merged = self._choices.setdefault(index, {})
            delta = choice.get("delta")
            rest = {k: v for k, v in choice.items() if k != "delta"}
            if isinstance(delta, dict):
                merge(merged.setdefault("message", {}), delta)
            merge(merged, rest)

    def answer(self) -> dict[str, Any]:
        if not self._events:
            raise AssembleError("the stream had no events")
        out = dict(self._top)
        kind = out.get("object")
        out["object"] = OBJECTS.get(kind, kind) if isinstance(kind, str) else kind
        chat = "message" in next(iter(self._choices.values()), {}) or \
            out["object"] == "chat.completion"
        choices = []
        for index in sorted(self._choices):
            choice = self._choices[index]
            choice["index"] = index
            if chat:
                message = choice.setdefault("message", {})
                message.setdefault("role", "assistant")
            for key in ("finish_reason", "logprobs"):
                choice.setdefault(key, None)
            choices.append(choice)
        out["choices"] = choices
        return out


def merge(into: dict[str, Any], delta: dict[str, Any]) -> None:
    """Merge one event's fields into what came before (the rules in the module's doc)."""
    for key, value in delta.items():
        if value is None:
            into.setdefault(key, None)
            continue
        old = into.get(key)
        if old is None:
            into[key] = _copy(value)
        elif key in LAST_WINS:
            into[key] = value
        elif key in TEXT_FIELDS and isinstance(old, str) and isinstance(value, str):
            into[key] = old + value
        elif isinstance(old, list) and isinstance(value, list):
            if key == "tool_calls":
                _merge_indexed(old, value)
            else:
                old.extend(_copy(value))
        elif isinstance(old, dict) and isinstance(value, dict):
            merge(old, value)
        # any other field: the first given stays


def _merge_indexed(old: list[Any], new: list[Any]) -> None:
    by_index = {c.get("index"): c for c in old if isinstance(c, dict)}
    for item in new:
        if not isinstance(item, dict):
            continue
        target = by_index.get(item.get("index"))
        if target is None:
            target = {}
            old.append(target)
            by_index[item.get("index")] = target
        merge(target, item)


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        merge(out, value)
        return out
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def sse_events(body: bytes) -> list[dict[str, Any]]:
    """The JSON events of a whole SSE body (the end marker and comments left out)."""
    events = []
    for line in body.split(b"\n"):
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            continue
        try:
            event = orjson.loads(data)
        except ValueError:
            raise AssembleError(f"a stream event is not JSON: {data[:80]!r}") from None
        if not isinstance(event, dict):
            raise AssembleError("a stream event is not a JSON object")
        events.append(event)
    return events


def assemble(body: bytes) -> dict[str, Any]:
    """The whole answer a whole SSE body amounts to."""
    asm = Assembler()
    for event in sse_events(body):
        asm.feed(event)
    return asm.answer()
