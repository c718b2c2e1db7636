"""Reading OpenAI request bodies into ``SimRequest``, and the errors of the ``/v1`` surface.

Validation lives here so routes stay thin: a bad body raises ``EngineError`` once, and the route
edge renders it in OpenAI's ``{"error": {"message", "type", "code"}}`` shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from controller.tokens import EstimatingCounter, prompt_of

DEFAULT_MAX_TOKENS = 16
_COUNTER = EstimatingCounter()


class EngineError(Exception):
    """An error answered to the client in OpenAI's error shape."""

    def __init__(self, message: str, status_code: int = 400,
                 error_type: str = "BadRequestError") -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.error_type = error_type

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.error_type,
                          "param": None, "code": self.status_code}}


class KvLoadFailure(EngineError):
    """A decode hop could not load its KV and the policy is ``fail``."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"KV load failed: {reason}", 500, "kv_load_failure")
        self.reason = reason


@dataclass(frozen=True, slots=True)
class RemoteKv:
    """Where a decode hop pulls its KV from: the prefill hop's ``kv_transfer_params``.

    In push mode the decode hop names only the prefill engine: ``request_id`` is then the
    decode hop's own (the X-Request-Id both hops share) and ``block_ids`` is empty.
    """

    engine_id: str
    request_id: str
    host: str
    port: int
    block_ids: list[int]
    # the prefill's own cache hits (vLLM 0.32 adds remote_prefill_cached_tokens to what a
    # prefill hop returns; the decode hop reports them as its cached_tokens)
    cached_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class SimRequest:
    chat: bool
    request_id: str
    prompt: str | list[int]  # seeds the output text
    prompt_tokens: int
    max_tokens: int
    stream: bool
    include_usage: bool
    remote_decode: bool  # prefill hop: keep the KV for a decode engine
    remote_prefill: RemoteKv | None  # decode hop: pull the KV from here
    token_ids: list[int] = field(default_factory=list)  # the prompt's, as the engine counts


def _int_field(body: dict[str, Any], key: str, minimum: int) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise EngineError(f"{key} must be an integer >= {minimum}, got {value!r}")
    return value


def _bool_field(body: dict[str, Any], key: str) -> bool:
    value = body.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise EngineError(f"{key} must be a boolean, got {value!r}")
    return value


def _require_prompt(body: dict[str, Any], chat: bool) -> None:
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise EngineError("messages must be a non-empty list")
        if not all(isinstance(m, dict) for m in messages):
            raise EngineError("each message must be an object")
        return
    prompt = body.get("prompt")
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt)):
        return
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        return
    raise EngineError("prompt must be a string, a list of token ids or a list of one string "
                   "(the simulated engine serves one prompt per request)")


def _max_tokens(body: dict[str, Any], chat: bool) -> int:
    value = _int_field(body, "max_completion_tokens", 1) if chat else None
    if value is None:
        value = _int_field(body, "max_tokens", 1)
    return DEFAULT_MAX_TOKENS if value is None else value


def _push_remote_kv(params: dict[str, Any], request_id: str) -> RemoteKv:
    """A push-mode decode hop's prefill: its engine id and side channel (vLLM 0.32's
    NixlPushConnector reads remote_engine_id, remote_host, remote_port and tp_size; the
    prefill's request id and blocks, unknown to the router, are not needed)."""
    keys = ("remote_engine_id", "remote_host", "remote_port")
    missing = [k for k in keys if k not in params]
    if missing:
        raise EngineError(f"kv_transfer_params with do_remote_prefill lacks {', '.join(missing)}")
    engine_id, host, port = (params[k] for k in keys)
    if not (isinstance(engine_id, str) and isinstance(host, str) and isinstance(port, int)
            and not isinstance(port, bool)):
        raise EngineError("kv_transfer_params: remote_engine_id and remote_host must be "
                          "strings, remote_port an integer")
    cached = params.get("remote_prefill_cached_tokens")
    return RemoteKv(engine_id, request_id, host, port, [],
                    cached if isinstance(cached, int) and not isinstance(cached, bool) else None)


def _remote_kv(params: dict[str, Any], push: bool = False, request_id: str = "") -> RemoteKv:
    if push:
        return _push_remote_kv(params, request_id)
    keys = ("remote_engine_id", "remote_request_id", "remote_host", "remote_port",
            "remote_block_ids")
    missing = [k for k in keys if k not in params]
    if missing:
        raise EngineError(f"kv_transfer_params with do_remote_prefill lacks {', '.join(missing)}")
    engine_id, request_id, host, port, block_ids = (params[k] for k in keys)
    ok = (isinstance(engine_id, str) and isinstance(request_id, str) and isinstance(host, str)
          and isinstance(port, int) and isinstance(block_ids, list)
          and all(isinstance(b, int) for b in block_ids))
    if not ok:
        raise EngineError("kv_transfer_params: remote_engine_id, remote_request_id and remote_host "
                       "must be strings, remote_port an integer, remote_block_ids integers")
    cached = params.get("remote_prefill_cached_tokens")
    return RemoteKv(engine_id, request_id, host, port, block_ids,
                    cached if isinstance(cached, int) and not isinstance(cached, bool) else None)


def _kv_params(body: dict[str, Any], push: bool, request_id: str
               ) -> tuple[bool, RemoteKv | None]:
    params = body.get("kv_transfer_params")
    if params is None:
        return False, None
    if not isinstance(params, dict):
        raise EngineError("kv_transfer_params must be an object")
    decode, prefill = _bool_field(params, "do_remote_decode"), _bool_field(
        params, "do_remote_prefill")
    if decode and prefill:
        raise EngineError(
            "kv_transfer_params: do_remote_decode and do_remote_prefill are exclusive")
    return decode, _remote_kv(params, push, request_id) if prefill else None


def rejected_remote_prefill(body: Any, push: bool = False, request_id: str = ""
                            ) -> RemoteKv | None:
    """Where a rejected request's prefill KV waits, if its body names it completely.

    For a body ``parse_request`` refused: vLLM's serving layer still tells the connector about
    a rejected ``do_remote_prefill`` request (``notify_kv_transfer_request_rejected``) so the
    prefill frees its blocks. Never raises.
    """
    params = body.get("kv_transfer_params") if isinstance(body, dict) else None
    if not isinstance(params, dict) or params.get("do_remote_prefill") is not True:
        return None
    try:
        return _remote_kv(params, push, request_id)
    except EngineError:
        return None


def _include_usage(body: dict[str, Any]) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict):
        raise EngineError("stream_options must be an object")
    return _bool_field(options, "include_usage")


def parse_request(body: Any, *, chat: bool, request_id: str, model_name: str,
                  max_model_len: int, push: bool = False) -> SimRequest:
    """Validate a completion or chat body; raise ``EngineError`` as vLLM would answer.

    ``push``: the engine runs NixlPushConnector (a decode hop names only its prefill).
    """
    if not isinstance(body, dict):
        raise EngineError("request body must be a JSON object")
    model = body.get("model")
    if model is not None and model != model_name:
        raise EngineError(f"The model `{model}` does not exist.", 404, "NotFoundError")
    _require_prompt(body, chat)
    if body.get("n", 1) != 1:
        raise EngineError("n must be 1 (the simulated engine returns one choice)")
    max_tokens = _max_tokens(body, chat)
    token_ids = _COUNTER.token_ids(body)
    prompt_tokens = len(token_ids)
    if prompt_tokens < 1:
        raise EngineError("the prompt is empty")
    if prompt_tokens + max_tokens > max_model_len:
        raise EngineError(
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, "
            f"{max_tokens} in the completion). Please reduce the length of the messages or "
            "completion.")
    remote_decode, remote_prefill = _kv_params(body, push, request_id)
    stream = _bool_field(body, "stream")
    return SimRequest(
        chat=chat, request_id=request_id, prompt=prompt_of(body), prompt_tokens=prompt_tokens,
        max_tokens=1 if remote_decode else max_tokens, stream=stream,
        include_usage=stream and _include_usage(body), remote_decode=remote_decode,
        remote_prefill=remote_prefill, token_ids=token_ids)
