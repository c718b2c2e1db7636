"""OpenAI response bodies and stream chunks for completions and chat, plus per-request metrics.

Pure functions of a finished (or progressing) ``RequestStream``; shapes follow vLLM's OpenAI
server, including its ``kv_transfer_params`` and ``--enable-per-request-metrics`` fields.

``usage.prompt_tokens_details.cached_tokens`` (with ``--enable-prompt-tokens-details``) is
vLLM 0.32's ``num_cached_tokens``: the prompt tokens the engine did not compute, its local
prefix-cache hits plus KV loaded from elsewhere (``v1/metrics/stats.py``, ``PrefillStats``).
On a decode hop vLLM reports the *prefill's* hits instead: the prefill hop adds
``remote_prefill_cached_tokens`` (its own ``num_cached_tokens``) to the
``kv_transfer_params`` it returns (``v1/core/sched/scheduler.py:2230-2241``), and the decode
engine, finding it in the request's ``kv_transfer_params``, reports that number
(``v1/engine/output_processor.py:238-249, 741-742``): "instead of its own (~100%) hit rate
from the KV transfer". The simulator does the same; without that field a decode hop reports
its local hits plus the tokens pulled.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from controller.engines.sim.protocol import EngineError, SimRequest
from controller.engines.sim.stream import RequestStream
from controller.engines.sim.text import output_text, token_text


@dataclass(frozen=True, slots=True)
class Reply:
    """What every body of one request shares."""

    req: SimRequest
    stream: RequestStream
    response_id: str
    created: int
    model: str
    seed: int
    kv_endpoint: dict[str, Any]  # remote_engine_id, remote_host, remote_port, tp_size
    prompt_tokens_details: bool = False  # --enable-prompt-tokens-details


def request_metrics(s: RequestStream) -> dict[str, float]:
    """Measured wall times of one request, as vLLM's per-request metrics (ms)."""
    scheduled = s.scheduled_at if s.scheduled_at is not None else s.arrival
    first = s.first_token_at if s.first_token_at is not None else scheduled
    last = s.last_token_at if s.last_token_at is not None else first
    generation = last - first
    n = s.num_tokens
    return {
        "queue_time_ms": round((scheduled - s.arrival) * 1e3, 3),
        "time_to_first_token_ms": round((first - scheduled) * 1e3, 3),
        "generation_time_ms": round(generation * 1e3, 3),
        "mean_itl_ms": round(generation / (n - 1) * 1e3, 3) if n > 1 else 0.0,
        "tokens_per_second": round(n / (last - scheduled), 3) if last > scheduled else 0.0,
        "kv_transfer_ms": round(s.kv_transfer_s * 1e3, 3),
    }


def kv_transfer_params(r: Reply) -> dict[str, Any] | None:
    """A prefill hop's answer to the decode engine: where its KV waits, NixlConnector style."""
    if not r.req.remote_decode or r.stream.handle_blocks is None:
        return None
    return {"do_remote_prefill": True, "do_remote_decode": False,
            "remote_block_ids": r.stream.handle_blocks,
            "remote_request_id": r.stream.seq_id, **r.kv_endpoint,
            "remote_prefill_cached_tokens": r.stream.cached_tokens}


def reported_cached_tokens(r: Reply) -> int:
    """What vLLM reports as the request's cached tokens (see the module's docstring)."""
    remote = r.req.remote_prefill
    if remote is not None and remote.cached_tokens is not None:
        return remote.cached_tokens
    return r.stream.cached_tokens


def usage(r: Reply) -> dict[str, Any]:
    n = r.stream.num_tokens
    body: dict[str, Any] = {"prompt_tokens": r.req.prompt_tokens, "completion_tokens": n,
                            "total_tokens": r.req.prompt_tokens + n}
    if r.prompt_tokens_details:
        body["prompt_tokens_details"] = {"cached_tokens": reported_cached_tokens(r)}
    return body


def full_body(r: Reply) -> dict[str, Any]:
    """The non-streaming response of a finished request."""
    text = output_text(r.seed, 0, r.stream.num_tokens)
    if r.req.chat:
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text},
                                  "logprobs": None, "finish_reason": "length",
                                  "stop_reason": None}
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length",
                  "stop_reason": None}
    return {"id": r.response_id, "object": "chat.completion" if r.req.chat else "text_completion",
            "created": r.created, "model": r.model, "choices": [choice], "usage": usage(r),
            "kv_transfer_params": kv_transfer_params(r), "metrics": request_metrics(r.stream)}


def _chunk(r: Reply, choices: list[dict[str, Any]]) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": r.response_id, "object": "chat.completion.chunk" if r.req.chat
        else "text_completion", "created": r.created, "model": r.model, "choices": choices}
    if r.req.include_usage:
        body["usage"] = None
    return body


def sse(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


STREAM_END = b"data: [DONE]\n\n"


def role_chunk(r: Reply) -> bytes:
    """Chat streams open with the assistant role, as OpenAI's do."""
    return sse(_chunk(r, [{"index": 0, "delta": {"role": "assistant", "content": ""},
                           "logprobs": None, "finish_reason": None}]))


def token_chunk(r: Reply, index: int) -> bytes:
    """Token ``index``; the last one carries finish_reason, metrics and kv_transfer_params."""
    text = token_text(r.seed, index)
    last = index + 1 == r.req.max_tokens
    finish = "length" if last else None
    if r.req.chat:
        choice: dict[str, Any] = {"index": 0, "delta": {"content": text}, "logprobs": None,
                                  "finish_reason": finish}
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    body = _chunk(r, [choice])
    if last:
        body["metrics"] = request_metrics(r.stream)
        body["kv_transfer_params"] = kv_transfer_params(r)
    return sse(body)


def usage_chunk(r: Reply) -> bytes:
    body = _chunk(r, [])
    body["usage"] = usage(r)
    body["metrics"] = request_metrics(r.stream)
    return sse(body)


def error_chunk(err: EngineError) -> bytes:
    return sse(err.body())
