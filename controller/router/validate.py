"""A client's OpenAI request, checked before any engine work (``check``).

The router refuses here what an engine would refuse later, so that no prefill hop runs --
and holds KV blocks for its lease -- for a request the decode side will reject, and so that
no malformed body reaches code that counts or rewrites it. Each refusal is a ``BadRequest``
(400, OpenAI's ``invalid_request_error``) naming the field, or ``ModelNotFound`` (404).

Checked: the shapes the router reads (``prompt``, ``messages`` and their text parts,
``stream``, ``stream_options``), the limits vLLM enforces before scheduling (``max_tokens``
and ``max_completion_tokens`` at least 1, ``n`` at least 1, ``temperature`` at least 0,
``top_p`` in (0, 1]), the served model's name, and -- where the router counts the prompt
exactly as the engine does -- prompt plus completion against the context length.
``kv_transfer_params`` is the router's to set: a client's is refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from controller.errors import BadRequest, ModelNotFound
from controller.tokens import TokenCounter

CHAT = "/v1/chat/completions"
ROUTER_FIELDS = ("kv_transfer_params",)  # engine-internal: set by the router only


@dataclass(frozen=True)
class Limits:
    """What the engines behind this controller accept."""

    model: str  # the served model name
    context_len: int | None  # prompt + completion tokens; None: unknown (external engines)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value))


def _optional_int(body: dict[str, Any], name: str, minimum: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not _is_int(value):
        raise BadRequest(f"'{name}' must be an integer", name)
    if value < minimum:
        raise BadRequest(f"'{name}' must be at least {minimum}, got {value}", name)
    return int(value)


def _check_sampling(body: dict[str, Any]) -> None:
    _optional_int(body, "n", 1)
    temperature = body.get("temperature")
    if temperature is not None and not (_is_number(temperature) and temperature >= 0):
        raise BadRequest("'temperature' must be a number, at least 0", "temperature")
    top_p = body.get("top_p")
    if top_p is not None and not (_is_number(top_p) and 0 < top_p <= 1):
        raise BadRequest("'top_p' must be a number in (0, 1]", "top_p")


def _check_stream(body: dict[str, Any]) -> bool:
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise BadRequest("'stream' must be true or false", "stream")
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise BadRequest("'stream_options' must be an object", "stream_options")
        if not stream:
            raise BadRequest("'stream_options' is only allowed with 'stream': true",
                             "stream_options")
        usage = options.get("include_usage")
        if usage is not None and not isinstance(usage, bool):
            raise BadRequest("'stream_options.include_usage' must be true or false",
                             "stream_options.include_usage")
    return bool(stream)


def _check_messages(body: dict[str, Any]) -> None:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list", "messages")
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise BadRequest(f"'{where}' must be an object", where)
        if not isinstance(msg.get("role"), str):
            raise BadRequest(f"'{where}.role' must be a string", f"{where}.role")
        content = msg.get("content")
        if content is None or isinstance(content, str):
            continue
        if not isinstance(content, list):
            raise BadRequest(f"'{where}.content' must be a string or a list of parts",
                             f"{where}.content")
        for j, part in enumerate(content):
            at = f"{where}.content[{j}]"
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise BadRequest(f"'{at}' must be an object with a 'type'", at)
            if part["type"] == "text" and not isinstance(part.get("text"), str):
                raise BadRequest(f"'{at}.text' must be a string", f"{at}.text")


def _check_prompt(body: dict[str, Any]) -> bool:
    """The completion prompt's shape; True when it is token ids (counted exactly)."""
    if "prompt" not in body:
        raise BadRequest("'prompt' is required", "prompt")
    prompt = body["prompt"]
    if isinstance(prompt, str):
        if not prompt:
            raise BadRequest("'prompt' is empty", "prompt")
        return False
    if isinstance(prompt, list) and prompt:
        if all(_is_int(t) and t >= 0 for t in prompt):
            return True
        if all(isinstance(p, str) for p in prompt):
            return False
    raise BadRequest("'prompt' must be a non-empty string, list of strings or list of "
                     "token ids", "prompt")


def check(endpoint: str, body: dict[str, Any], counter: TokenCounter, limits: Limits
          ) -> tuple[bool, int]:
    """``(stream, prompt_tokens)`` of a request the engines will accept; raises
    ``BadRequest`` or ``ModelNotFound`` otherwise."""
    for name in ROUTER_FIELDS:
        if name in body:
            raise BadRequest(f"'{name}' is set by the router, not by clients", name)
    model = body.get("model")
    if model is not None:
        if not isinstance(model, str):
            raise BadRequest("'model' must be a string", "model")
        if model != limits.model:
            raise ModelNotFound(f"The model `{model}` does not exist; this controller serves "
                                f"`{limits.model}`", "model")
    stream = _check_stream(body)
    _check_sampling(body)
    chat = endpoint == CHAT
    if chat:
        _check_messages(body)
        exact = counter.exact_chat
    else:
        exact = _check_prompt(body) or counter.exact
    echo = not chat and body.get("echo") is True  # vLLM: echo the prompt, generate nothing
    max_tokens = _optional_int(body, "max_tokens", 0 if echo else 1)
    if chat:
        max_tokens = _optional_int(body, "max_completion_tokens", 1) or max_tokens
    prompt_tokens = counter.count(body)
    if exact and limits.context_len is not None:
        wanted = prompt_tokens + (max_tokens or 1)
        if wanted > limits.context_len:
            raise BadRequest(
                f"This model's maximum context length is {limits.context_len} tokens; this "
                f"request needs {wanted} ({prompt_tokens} in the prompt, {max_tokens or 1} "
                "in the completion)", "max_tokens" if max_tokens else "prompt")
    return stream, prompt_tokens
