"""``pdctl replay TRACE``: replay a Mooncake JSONL or Azure LLM CSV trace against a controller's
OpenAI data plane on the trace's own schedule; print a summary per prompt-length class; write
the whole result with ``--json``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import httpx

from controller.cli.args import SubParsers, count_arg, positive_arg, seconds_arg
from controller.cli.replay_send import Planned, ReplayOutcome, send_trace
from controller.replay.prompts import fit_context
from controller.replay.schedule import Slice, due_times, select
from controller.replay.summary import by_class, render, result_json
from controller.replay.trace import TraceError, load_trace
from pdctl_api.client import DEFAULT_URL

DESCRIPTION = """\
Replay a request trace against a controller's OpenAI data plane (POST /v1/completions,
streamed, so TTFT and each request's inter-token gaps are measured here, client-side).

Formats, detected from the file: Mooncake JSONL (timestamp ms, input_length, output_length,
hash_ids of 512-token blocks) and Azure LLM CSV (TIMESTAMP, ContextTokens, GeneratedTokens).
The whole file is checked before anything is sent; a bad line is named (file:line: what).

Prompts are token ids ("prompt": [ids], as vLLM accepts): each 512-token block's ids follow
from its hash id, so two requests share exactly the blocks their hash ids share, and the
engine sees exactly input_length prompt tokens (Azure prompts share nothing). max_tokens is
output_length, with ignore_eos. A request longer than the model's context (max_model_len from
GET /v1/models) is cut to fit: its completion kept, its prompt cut from the end (its leading,
shared blocks kept); the count is printed and each row says `clamped`. --no-clamp sends them
as they are (the controller refuses them: they count as failed).

--text-prompts sends text instead ("prompt": "..."), each token id as a fixed 4-byte piece
(its three digits and a space), for routers that match prefixes on request text (vllm-router's
cache_aware). An engine counting one token per 4 bytes (the simulated engine without a
tokenizer) sees the same token count and the same sharing; a real tokenizer would not.

Schedule (open loop: a request is sent at its time whether earlier ones finished or not): a
request at trace time t is sent (t - START) x TIME_SCALE / RATE_SCALE seconds after the run
starts; the two scales multiply (--time-scale 0.5 is --rate-scale 2).

Summary per class of the trace's prompt length (<2k, 2k-8k, 8k-32k, >=32k tokens; k = 1,024)
and overall: requests, ok, failed by reason, TTFT p50/p90/p99, inter-token gap p99 (of each
request's own gap p99), end-to-end p50/p99, goodput (ok, TTFT <= --ttft-ms and own gap p99 <=
--gap-ms), and the engines' cache hit rate (usage.prompt_tokens_details.cached_tokens) when
they report it. Progress goes to stderr once a second; Ctrl-C stops sending, marks requests in
flight as failed (interrupted) and prints the summary of the run so far."""

EXAMPLE = """\
example:
  pdctl lab --backend sim --no-dashboard &
  pdctl replay ../shared/traces/mooncake_conversation.jsonl --limit 200 --time-scale 0.1 \\
      --ttft-ms 2000 --gap-ms 60 --json replay.json
"""


def add_replay_parser(sub: SubParsers) -> None:
    p = sub.add_parser("replay", help="replay a request trace (Mooncake JSONL, Azure CSV) "
                                      "against a controller", description=DESCRIPTION,
                       epilog=EXAMPLE, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", type=Path, metavar="TRACE", help="the trace file")
    p.add_argument("--controller", metavar="URL", default=os.environ.get("PDCTL_URL", DEFAULT_URL),
                   help=f"controller URL (env PDCTL_URL; default {DEFAULT_URL})")
    p.add_argument("--api-key", metavar="KEY",
                   default=os.environ.get("PDCTL_CONTROLLER__API_KEY"),
                   help="the controller's data-plane API key, sent as a bearer token (env "
                        "PDCTL_CONTROLLER__API_KEY, as the controller reads it)")
    p.add_argument("--time-scale", metavar="X", type=positive_arg, default=1.0,
                   help="wall seconds per trace second (0.1: 10x faster; default 1)")
    p.add_argument("--rate-scale", metavar="X", type=positive_arg, default=1.0,
                   help="multiply the request rate: trace times divided by it (default 1)")
    p.add_argument("--limit", metavar="N", type=count_arg,
                   help="send only the first N requests of the slice")
    p.add_argument("--start-s", metavar="S", type=seconds_arg, default=0.0,
                   help="skip to S seconds into the trace (default 0)")
    p.add_argument("--ttft-ms", metavar="MS", type=positive_arg, default=2000.0,
                   help="goodput's TTFT target (default 2000 ms, the planner's)")
    p.add_argument("--gap-ms", metavar="MS", type=positive_arg, default=60.0,
                   help="goodput's inter-token gap target, against each request's own gap "
                        "p99 (default 60 ms, the planner's)")
    p.add_argument("--json", type=Path, metavar="FILE",
                   help="write the whole result (summaries and one row per request)")
    p.add_argument("--max-prompt-tokens", metavar="N", type=count_arg,
                   help="cut longer prompts to this many tokens (besides the context fit)")
    p.add_argument("--no-clamp", action="store_true",
                   help="send requests longer than the model's context as they are")
    p.add_argument("--timeout-s", metavar="S", type=positive_arg, default=600.0,
                   help="give up on one request after this long (default 600)")
    p.add_argument("--text-prompts", action="store_true",
                   help="send text prompts, each token id as a 4-byte piece (for text-matching "
                        "routers; same count and sharing for a 4-bytes-per-token engine)")
    p.set_defaults(run=run_replay)


def _served(url: str, headers: dict[str, str]) -> tuple[str, int | None]:
    """The controller's model name and context length (``GET /v1/models``)."""
    r = httpx.get(f"{url}/v1/models", timeout=10.0, headers=headers)
    r.raise_for_status()
    first = r.json()["data"][0]
    ctx = first.get("max_model_len")
    return str(first["id"]), int(ctx) if isinstance(ctx, int) else None


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


async def _run_with_interrupt(url: str, model: str, plan: list[Planned], sl: Slice,
                             timeout_s: float, text_prompts: bool = False,
                             headers: dict[str, str] | None = None) -> ReplayOutcome:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_interrupt() -> None:
        if not stop.is_set():
            _say("replay: interrupted: no more requests sent; the summary follows")
        stop.set()

    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(signal.SIGINT, on_interrupt)
    try:
        return await send_trace(url, model, plan, sl, stop, timeout_s,
                                text_prompts=text_prompts, headers=headers)
    finally:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.remove_signal_handler(signal.SIGINT)


def run_replay(args: argparse.Namespace) -> int:
    url = args.controller.rstrip("/")
    try:
        trace = load_trace(args.trace)
        sl = Slice(args.start_s, args.limit, args.time_scale, args.rate_scale)
    except (TraceError, ValueError) as e:
        print(f"pdctl replay: {e}", file=sys.stderr)
        return 2
    requests = select(trace, sl)
    if not requests:
        print(f"pdctl replay: {trace.path}: no request at or after {sl.start_s:g} s (the "
              f"trace spans {trace.span_s:,.1f} s)", file=sys.stderr)
        return 2
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    try:
        model, context = _served(url, headers)
    except (httpx.HTTPError, ValueError, KeyError, IndexError) as e:
        print(f"pdctl replay: cannot read the model from {url}/v1/models: {e}",
              file=sys.stderr)
        return 1
    fitted = [fit_context(r, None if args.no_clamp else context, args.max_prompt_tokens)
              for r in requests]
    plan = [Planned(r, f, d) for r, f, d in zip(requests, fitted, due_times(requests, sl),
                                                  strict=True)]
    clamped = sum(f.clamped for f in fitted)
    _say(f"replay: {len(plan)} requests of {trace.path} ({trace.format}, from {sl.start_s:g} s, "
         f"trace span {requests[-1].time_s - requests[0].time_s:,.1f} s, sent over "
         f"{plan[-1].due_s:,.1f} s) to {url}, model {model}"
         + ("" if context is None else f", context {context:,} tokens"))
    if clamped:
        _say(f"replay: warning: {clamped} of {len(plan)} requests cut to fit "
             + (f"--max-prompt-tokens {args.max_prompt_tokens} / " if args.max_prompt_tokens
                else "") + f"the model's {context} tokens (prompt cut from its end)")
    elif args.no_clamp and context is not None:
        over = sum(r.input_length + r.output_length > context for r in requests)
        if over:
            _say(f"replay: warning: {over} requests exceed the model's {context} tokens and "
                 "are sent as they are (--no-clamp)")
    outcome = asyncio.run(_run_with_interrupt(url, model, plan, sl, args.timeout_s,
                                              args.text_prompts, headers))
    summaries = by_class(outcome.rows, args.ttft_ms, args.gap_ms, outcome.wall_s)
    print(render(summaries, args.ttft_ms, args.gap_ms))
    if outcome.not_sent:
        print(f"not sent (interrupted): {outcome.not_sent}")
    if args.json:
        meta: dict[str, Any] = {
            "trace": str(trace.path), "format": trace.format, "controller": url,
            "model": model, "context": context, "start_s": sl.start_s, "limit": sl.limit,
            "time_scale": sl.time_scale, "rate_scale": sl.rate_scale,
            "ttft_ms": args.ttft_ms, "gap_ms": args.gap_ms, "wall_s": round(outcome.wall_s, 3),
            "interrupted": outcome.interrupted, "not_sent": outcome.not_sent,
            "prompts": "text (4-byte piece per token id)" if args.text_prompts
            else "token ids"}
        args.json.write_text(json.dumps(result_json(meta, outcome.rows, summaries), indent=1))
    failed = summaries["all"]["failed"]
    return 130 if outcome.interrupted else (1 if failed else 0)
