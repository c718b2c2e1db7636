"""An engine pair that answers at once: the router-bound benchmark's prefill and decode.

One process, two ports (a prefill and a decode "instance"), answering vLLM's OpenAI surface
with the NixlConnector two-hop protocol the simulated engine speaks, but with no model, no
scheduler and no waiting: every answer is written the moment its request is parsed. With
engines this cheap, what a router adds -- its CPU per request and its latency -- decides
the rate, not the engines.

The two hops, as in ``controller.engines.sim``:

- prefill hop (``kv_transfer_params.do_remote_decode``): one token, ``stream: false``; the
  answer's ``kv_transfer_params`` name a *KV handle* (``remote_engine_id``,
  ``remote_request_id``, ``remote_block_ids``, ``remote_host``, ``remote_port``);
- decode hop (``kv_transfer_params.do_remote_prefill``): the handle is "pulled" -- looked up
  in the table both ports share, and removed (a handle is read at most once) -- then
  ``max_tokens`` tokens are streamed (or returned) at once. A hop whose handle is unknown
  (never issued, or already read) is still answered, and counted in
  ``vllm:nixl_num_notifications_after_expiry_total`` on the prefill: a flow check sees it.
- a decode hop with ``max_tokens`` below 1 is a release (pdctl's way to free an unread
  handle): the handle is dropped and the hop refused with 400, as vLLM does.

``/health``, ``/v1/models`` and ``/metrics`` (vLLM's metric names: request and token
counters, KV pulls, prompt tokens by source) answer as a vLLM server's do. HTTP/1.1 with
keep-alive, parsed by ``httptools``; the loop is uvloop's.

    python -m bench.instant_engine --prefill-port 8100 --decode-port 8200 [--model NAME]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import itertools
import signal
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, cast

import httptools
import orjson
import uvloop

MAX_HANDLES = 100_000  # unread handles kept; the oldest go first (no lease timer)
CREATED = int(time.time())
METRICS_ZERO = {"queue_time_ms": 0.0, "time_to_first_token_ms": 0.0, "generation_time_ms": 0.0,
                "mean_itl_ms": 0.0, "tokens_per_second": 0.0, "kv_transfer_ms": 0.0}
_IDS = itertools.count(1)


@dataclass
class PortCounters:
    """One port's vLLM-named counters."""

    requests: int = 0  # vllm:request_success_total
    generated: int = 0  # vllm:generation_tokens_total
    prompt_local: int = 0  # vllm:prompt_tokens_by_source_total{source="local_compute"}
    prompt_external: int = 0  # ... {source="external_kv_transfer"}
    kv_pulls: int = 0  # vllm:nixl_xfer_time_seconds_count (decode side)
    stale_reads: int = 0  # vllm:nixl_num_notifications_after_expiry_total (prefill side)
    released: int = 0  # handles freed by a release hop (prefill side)


@dataclass
class Shared:
    """The KV handles the prefill issued and nobody has read yet: (engine id, request id)
    -> prompt tokens."""

    model: str
    handles: OrderedDict[tuple[str, str], int] = field(default_factory=OrderedDict)


class RefusedRequest(Exception):
    """A request refused with ``status`` (400 unless said otherwise)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def _status_line(status: int) -> bytes:
    reason = {200: b"OK", 400: b"Bad Request", 404: b"Not Found"}.get(status, b"Error")
    return b"HTTP/1.1 %d %s\r\n" % (status, reason)


def whole_answer(rid: str, model: str, chat: bool, max_tokens: int, usage: dict[str, int],
                 kv_out: dict[str, Any] | None) -> bytes:
    """A non-streamed completion or chat answer of ``max_tokens`` tokens."""
    text = " x" * max_tokens
    choice: dict[str, Any] = (
        {"index": 0, "message": {"role": "assistant", "content": text},
         "finish_reason": "length"} if chat else
        {"index": 0, "text": text, "logprobs": None, "finish_reason": "length",
         "stop_reason": None})
    return orjson.dumps({
        "id": rid, "object": "chat.completion" if chat else "text_completion",
        "created": CREATED, "model": model, "choices": [choice], "usage": usage,
        "kv_transfer_params": kv_out, "metrics": METRICS_ZERO})


def stream_events(rid: str, model: str, chat: bool, max_tokens: int,
                  usage: dict[str, int] | None) -> list[dict[str, Any]]:
    """The SSE events of a streamed answer, a token each (``usage``: asked for with
    ``stream_options.include_usage``)."""
    obj = "chat.completion.chunk" if chat else "text_completion"
    events = []
    if chat:
        events.append({"id": rid, "object": obj, "created": CREATED, "model": model,
                       "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                    "finish_reason": None}]})
    for i in range(max_tokens):
        last = i + 1 == max_tokens
        finish = "length" if last else None
        choice = ({"index": 0, "delta": {"content": " x"}, "finish_reason": finish}
                  if chat else {"index": 0, "text": " x", "logprobs": None,
                                "finish_reason": finish})
        event: dict[str, Any] = {"id": rid, "object": obj, "created": CREATED,
                                 "model": model, "choices": [choice]}
        if usage is not None:
            event["usage"] = None
        if last:
            event["metrics"] = METRICS_ZERO
            event["kv_transfer_params"] = None
        events.append(event)
    if usage is not None:
        events.append({"id": rid, "object": obj, "created": CREATED, "model": model,
                       "choices": [], "usage": usage, "metrics": METRICS_ZERO})
    return events


class Engine:
    """One port: its identity and counters."""

    def __init__(self, role: str, host: str, port: int, shared: Shared) -> None:
        self.role, self.host, self.port, self.shared = role, host, port, shared
        self.engine_id = f"instant-{role}-{port}"
        self.c = PortCounters()

    # ---- generation ------------------------------------------------------------------

    def generate(self, body: Any, chat: bool) -> tuple[int, bytes, bytes]:
        """(status, content type, body) of a completion or chat request."""
        if not isinstance(body, dict):
            raise RefusedRequest("request body must be a JSON object")
        prompt = body.get("messages") if chat else body.get("prompt")
        prompt_tokens = max(1, len(orjson.dumps(prompt)) // 4)
        max_tokens = body.get("max_completion_tokens") if chat else None
        if max_tokens is None:
            max_tokens = body.get("max_tokens", 16)
        if not isinstance(max_tokens, int):
            raise RefusedRequest("max_tokens must be an integer")
        kv = body.get("kv_transfer_params")
        kv_out: dict[str, Any] | None = None
        if isinstance(kv, dict) and kv.get("do_remote_prefill"):
            self.pull(kv, max_tokens)
        elif max_tokens < 1:
            raise RefusedRequest("max_tokens must be at least 1")
        else:
            self.c.prompt_local += prompt_tokens
            if isinstance(kv, dict) and kv.get("do_remote_decode"):
                max_tokens = 1
                kv_out = self.issue_handle(prompt_tokens)
        self.c.requests += 1
        self.c.generated += max_tokens
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": max_tokens,
                 "total_tokens": prompt_tokens + max_tokens}
        rid = f"{'chatcmpl' if chat else 'cmpl'}-instant-{next(_IDS)}"
        if not body.get("stream"):
            return 200, b"application/json", whole_answer(rid, self.shared.model, chat,
                                                          max_tokens, usage, kv_out)
        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
        events = stream_events(rid, self.shared.model, chat, max_tokens,
                               usage if include_usage else None)
        data = b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events)
        return 200, b"text/event-stream", data + b"data: [DONE]\n\n"

    def pull(self, kv: dict[str, Any], max_tokens: int) -> None:
        """A decode hop: its KV handle read (and removed), or a release (``max_tokens``
        below 1) refused with 400 as vLLM does, the handle freed."""
        key = (str(kv.get("remote_engine_id")), str(kv.get("remote_request_id")))
        tokens = self.shared.handles.pop(key, None)
        if max_tokens < 1:  # a release: vLLM refuses the hop and frees the handle
            if tokens is not None:
                self.c.released += 1
            raise RefusedRequest("max_tokens must be at least 1")
        if tokens is None:
            self.c.stale_reads += 1  # reported by the prefill side, as in vLLM
        else:
            self.c.kv_pulls += 1
            self.c.prompt_external += tokens

    def issue_handle(self, prompt_tokens: int) -> dict[str, Any]:
        """A prefill hop's KV handle, kept for one read; its ``kv_transfer_params``."""
        rid = f"instant-{next(_IDS)}"
        handles = self.shared.handles
        handles[(self.engine_id, rid)] = prompt_tokens
        if len(handles) > MAX_HANDLES:
            handles.popitem(last=False)
        return {"do_remote_prefill": True, "do_remote_decode": False,
                "remote_block_ids": [0], "remote_request_id": rid,
                "remote_engine_id": self.engine_id, "remote_host": self.host,
                "remote_port": self.port, "tp_size": 1}

    # ---- plain endpoints -------------------------------------------------------------

    def metrics(self) -> bytes:
        c, m = self.c, f'model_name="{self.shared.model}"'
        lines = [
            "# TYPE vllm:num_requests_running gauge", f"vllm:num_requests_running{{{m}}} 0.0",
            "# TYPE vllm:num_requests_waiting gauge", f"vllm:num_requests_waiting{{{m}}} 0.0",
            "# TYPE vllm:kv_cache_usage_perc gauge",
            f"vllm:kv_cache_usage_perc{{{m}}} "
            f"{len(self.shared.handles) / MAX_HANDLES if self.role == 'prefill' else 0.0}",
            "# TYPE vllm:request_success counter",
            f'vllm:request_success_total{{{m},finished_reason="length"}} {c.requests}.0',
            "# TYPE vllm:generation_tokens counter",
            f"vllm:generation_tokens_total{{{m}}} {c.generated}.0",
            "# TYPE vllm:prompt_tokens counter",
            f"vllm:prompt_tokens_total{{{m}}} {c.prompt_local + c.prompt_external}.0",
            "# TYPE vllm:prompt_tokens_by_source counter",
            f'vllm:prompt_tokens_by_source_total{{{m},source="local_compute"}} '
            f"{c.prompt_local}.0",
            f'vllm:prompt_tokens_by_source_total{{{m},source="external_kv_transfer"}} '
            f"{c.prompt_external}.0",
            "# TYPE vllm:nixl_xfer_time_seconds summary",
            f"vllm:nixl_xfer_time_seconds_count{{{m}}} {c.kv_pulls}.0",
            f"vllm:nixl_xfer_time_seconds_sum{{{m}}} 0.0",
            "# TYPE vllm:nixl_num_kv_expired_reqs counter",
            f"vllm:nixl_num_kv_expired_reqs_total{{{m}}} 0.0",
            "# TYPE vllm:nixl_num_notifications_after_expiry counter",
            f"vllm:nixl_num_notifications_after_expiry_total{{{m}}} {c.stale_reads}.0",
        ]
        return ("\n".join(lines) + "\n").encode()

    def answer(self, method: bytes, path: bytes, body: bytes) -> tuple[int, bytes, bytes]:
        path = path.split(b"?", 1)[0]
        if method == b"GET":
            if path == b"/health":
                return 200, b"text/plain", b""
            if path == b"/metrics":
                return 200, b"text/plain; version=0.0.4", self.metrics()
            if path == b"/v1/models":
                card = {"id": self.shared.model, "object": "model", "created": CREATED,
                        "owned_by": "vllm", "root": self.shared.model, "parent": None}
                return 200, b"application/json", orjson.dumps({"object": "list",
                                                               "data": [card]})
        elif method == b"POST" and path in (b"/v1/completions", b"/v1/chat/completions"):
            try:
                try:
                    parsed = orjson.loads(body)
                except orjson.JSONDecodeError as exc:
                    raise RefusedRequest(f"request body is not valid JSON: {exc}") from None
                return self.generate(parsed, chat=path == b"/v1/chat/completions")
            except RefusedRequest as err:
                return err.status, b"application/json", orjson.dumps(
                    {"error": {"message": str(err), "type": "BadRequestError",
                               "param": None, "code": err.status}})
        return 404, b"application/json", b'{"detail":"Not Found"}'


class Connection(asyncio.Protocol):
    """One client connection: requests parsed by httptools, each answered in one write."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self.transport is not None:
                self.transport.write(_status_line(400) + b"Content-Length: 0\r\n"
                                     b"Connection: close\r\n\r\n")
                self.transport.close()

    def on_message_begin(self) -> None:
        self.url = b""
        self.body = []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        status, ctype, payload = self.engine.answer(
            self.parser.get_method(), self.url, b"".join(self.body))
        keep = self.parser.should_keep_alive()
        head = (_status_line(status) + b"Content-Type: " + ctype
                + b"\r\nContent-Length: " + str(len(payload)).encode()
                + (b"\r\n\r\n" if keep else b"\r\nConnection: close\r\n\r\n"))
        if self.transport is not None:
            self.transport.write(head + payload)
            if not keep:
                self.transport.close()


async def serve_instant_engines(host: str, ports: dict[str, int], model: str) -> None:
    """Both ports served until SIGTERM or SIGINT."""
    loop = asyncio.get_running_loop()
    shared = Shared(model)
    servers = []
    for role, port in ports.items():
        engine = Engine(role, host, port, shared)
        servers.append(await loop.create_server(functools.partial(Connection, engine), host,
                                                port, backlog=1024))
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for s in servers:
        s.close()


def serve_from_command_line(argv: list[str] | None = None) -> int:
    """``python -m bench.instant_engine``: its own process, started by the router scenario
    (``bench.fleet.instant_engine_argv``); not a scenario: it measures nothing."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prefill-port", type=int, required=True)
    ap.add_argument("--decode-port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--model", default="llama-3-8b", help="the served model name")
    args = ap.parse_args(argv)
    ports = {"prefill": args.prefill_port, "decode": args.decode_port}
    uvloop.run(serve_instant_engines(args.host, ports, args.model))
    return 0


if __name__ == "__main__":
    raise SystemExit(serve_from_command_line())
