"""The engine-facing bodies of the two hops and of a KV release, and the client body they
are made from. Engine-internal fields (``kv_transfer_params``) are set here and nowhere
else."""

from __future__ import annotations

from typing import Any

import orjson

from controller.errors import BadRequest
from controller.router.upstream import UpstreamReply

NULL_KV_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False,
                  "remote_engine_id": None, "remote_block_ids": None,
                  "remote_host": None, "remote_port": None}


def push_params(peer: dict[str, Any], endpoint: str, rid: str) -> dict[str, Any]:
    """A push-mode decode hop's ``kv_transfer_params``: the prefill engine's NIXL identity
    (``Instance.kv_peer``), to which the decode engine registers the blocks it reserves, and
    the prefill's request id as vLLM forms it from the shared ``X-Request-Id`` (one prompt:
    ``cmpl-<id>-0``, ``chatcmpl-<id>``); the prefill's blocks are not known yet."""
    remote = f"chatcmpl-{rid}" if endpoint.endswith("/chat/completions") else f"cmpl-{rid}-0"
    return {"do_remote_prefill": True, "do_remote_decode": False,
            "remote_engine_id": peer["engine_id"], "remote_host": peer["host"],
            "remote_port": peer["port"], "tp_size": peer.get("tp_size", 1),
            "remote_request_id": remote, "remote_block_ids": []}


def parse_body(raw: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(raw)
    except ValueError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    return body


def prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    out = dict(body)
    out["stream"] = False
    out.pop("stream_options", None)
    out["max_tokens"] = 1
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    out["kv_transfer_params"] = dict(NULL_KV_PARAMS)
    return out


def decode_body(body: dict[str, Any], kv_params: dict[str, Any] | None) -> tuple[dict[str, Any],
                                                                                bool]:
    """The decode hop's body, and whether the router added a usage chunk to a stream.

    A streaming hop always asks for ``include_usage``: vLLM puts the request's usage and
    per-request ``metrics`` in that final chunk, which accounting needs. When the client did
    not ask for it, the relay drops that chunk again.
    """
    out = body if kv_params is None else {**body, "kv_transfer_params": kv_params}
    if not body.get("stream"):
        return out, False
    opts = body.get("stream_options")
    if isinstance(opts, dict) and opts.get("include_usage"):
        return out, False
    extra = opts if isinstance(opts, dict) else {}
    return {**out, "stream_options": {**extra, "include_usage": True}}, True


def release_body(model: str, kv_params: dict[str, Any]) -> dict[str, Any]:
    """A decode-engine request that carries a KV handle and that vLLM's serving layer rejects
    (``max_tokens`` below 1): vLLM then tells the prefill engine to free the handle's blocks
    (``notify_kv_transfer_request_rejected``), reading nothing."""
    return {"model": model, "prompt": [0], "max_tokens": -1, "stream": False,
            "kv_transfer_params": kv_params}


def client_answer(content: bytes) -> bytes:
    """A decode engine's whole JSON answer as the client gets it: without
    ``kv_transfer_params`` (vLLM always sends the key, null on a decode hop)."""
    if b'"kv_transfer_params"' not in content:
        return content
    try:
        data = orjson.loads(content)
    except ValueError:
        return content
    if not isinstance(data, dict):
        return content
    data.pop("kv_transfer_params", None)
    return orjson.dumps(data)


def prefill_answer(reply: UpstreamReply) -> dict[str, Any] | None:
    """A successful prefill answer, parsed, when it carries ``kv_transfer_params`` (a dict);
    else None."""
    if reply.status != 200:
        return None
    try:
        data = orjson.loads(reply.body)
    except ValueError:
        return None
    ok = isinstance(data, dict) and isinstance(data.get("kv_transfer_params"), dict)
    return data if ok else None
