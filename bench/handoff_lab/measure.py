"""The hand-off lab's requests and measures: request bodies, the prefill and decode hops (plain
and streamed), one disaggregated request in pull or push mode, a trial against the colocated
reference, ``/metrics`` scrapes and per-length summaries."""

from __future__ import annotations

import json
import random
import re
import statistics
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.handoff_lab.engines import HOST, MAX_TOKENS, METRIC_RE, MODEL_NAME, LabEngine


def scrape_metrics(client: httpx.Client, url: str) -> dict[str, float]:
    out: dict[str, float] = {}
    text = client.get(url + "/metrics", timeout=10).text
    for line in text.splitlines():
        m = METRIC_RE.match(line)
        if not m:
            continue
        name, labels, value = m.group(1), m.group(2) or "", float(m.group(3))
        if name == "vllm:prompt_tokens_by_source_total":
            src = re.search(r'source="([^"]+)"', labels)
            key = f"by_source.{src.group(1) if src else '?'}"
        elif name in ("vllm:nixl_num_failed_transfers_total",
                      "vllm:nixl_num_failed_notifications_total",
                      "vllm:nixl_num_kv_expired_reqs_total",
                      "vllm:prompt_tokens_total", "vllm:prefix_cache_hits_total",
                      "vllm:nixl_xfer_time_seconds_count", "vllm:nixl_xfer_time_seconds_sum",
                      "vllm:request_success_total"):
            key = name.removeprefix("vllm:")
        else:
            continue
        out[key] = out.get(key, 0.0) + value
    return out


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: round(v - before.get(k, 0.0), 6) for k, v in after.items()
            if v - before.get(k, 0.0) != 0}


def make_prompt(rng: random.Random, n_tokens: int, vocab: int) -> list[int]:
    # Token ids 5.. (skip specials); random per request so no two prompts share a block.
    return [rng.randrange(5, vocab) for _ in range(n_tokens)]


def base_body(prompt: list[int]) -> dict[str, Any]:
    return {"model": MODEL_NAME, "prompt": prompt, "max_tokens": MAX_TOKENS,
            "temperature": 0.0, "ignore_eos": True, "return_token_ids": True}


def prefill_hop_body(prompt: list[int]) -> dict[str, Any]:
    # controller/router/bodies.py prefill_hop_body + NULL_KV_PARAMS
    return {**base_body(prompt), "max_tokens": 1, "stream": False,
            "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False,
                                   "remote_engine_id": None, "remote_block_ids": None,
                                   "remote_host": None, "remote_port": None}}


def push_decode_params(prefill: LabEngine, request_id: str) -> dict[str, Any]:
    """What D needs in push mode, known before P answers (fixed engine_id)."""
    return {"do_remote_prefill": True, "do_remote_decode": False,
            "remote_engine_id": prefill.engine_id,
            "remote_request_id": f"cmpl-{request_id}-0",
            "remote_host": HOST, "remote_port": prefill.side_port, "tp_size": 1,
            "remote_block_ids": []}


@dataclass
class HopResult:
    status: int = 0
    t_done: float = 0.0  # perf_counter at the end of the answer
    t_first: float | None = None  # perf_counter at the first token (streams)
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    usage: dict[str, Any] | None = None
    metrics: dict[str, Any] | None = None
    kv_params: dict[str, Any] | None = None
    error: str | None = None


def post_json(client: httpx.Client, url: str, body: dict[str, Any], rid: str,
              timeout: float) -> HopResult:
    res = HopResult()
    try:
        r = client.post(url + "/v1/completions", json=body, headers={"X-Request-Id": rid},
                        timeout=timeout)
        res.t_done = time.perf_counter()
        res.status = r.status_code
        data = r.json()
        if r.status_code != 200:
            res.error = json.dumps(data)[:500]
            return res
        res.text = data["choices"][0]["text"]
        res.token_ids = list(data["choices"][0].get("token_ids") or [])
        res.usage = data.get("usage")
        res.metrics = data.get("metrics")
        res.kv_params = data.get("kv_transfer_params")
    except (httpx.HTTPError, ValueError) as exc:
        res.t_done = time.perf_counter()
        res.error = f"{type(exc).__name__}: {exc}"
    return res


def post_stream(client: httpx.Client, url: str, body: dict[str, Any], rid: str,
                timeout: float) -> HopResult:
    res = HopResult()
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    parts: list[str] = []
    try:
        with client.stream("POST", url + "/v1/completions", json=body,
                           headers={"X-Request-Id": rid}, timeout=timeout) as r:
            res.status = r.status_code
            if r.status_code != 200:
                res.error = r.read().decode(errors="replace")[:500]
                res.t_done = time.perf_counter()
                return res
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("error"):
                    res.error = json.dumps(chunk)[:500]
                choices = chunk.get("choices") or []
                if choices:
                    if res.t_first is None:
                        res.t_first = time.perf_counter()
                    parts.append(choices[0].get("text") or "")
                    res.token_ids += list(choices[0].get("token_ids") or [])
                if chunk.get("usage"):
                    res.usage = chunk["usage"]
                if chunk.get("metrics"):
                    res.metrics = chunk["metrics"]
    except (httpx.HTTPError, ValueError) as exc:
        res.error = f"{type(exc).__name__}: {exc}"
    res.t_done = time.perf_counter()
    res.text = "".join(parts)
    return res


@dataclass
class Trial:
    mode: str
    tokens: int
    ttft_s: float | None
    handoff_s: float | None
    prefill_s: float
    decode_total_s: float
    equal: bool
    disagg_tokens: list[int]
    ref_tokens: list[int]
    prefill_status: int
    decode_status: int
    cached_tokens: Any
    decode_metrics: dict[str, Any] | None
    prefill_metrics: dict[str, Any] | None
    prefill_kv_params: dict[str, Any] | None
    error: str | None


def disagg(client: httpx.Client, pool: ThreadPoolExecutor, mode: str, p: LabEngine, d: LabEngine,
           prompt: list[int], timeout: float = 120.0, decode_delay_s: float = 0.0,
           decode_params: dict[str, Any] | None = None) -> tuple[HopResult, HopResult, float]:
    """One disaggregated request; returns (prefill hop, decode hop, t0).

    pull: prefill hop, then the decode hop with the prefill's kv_transfer_params.
    push: both hops at once (the decode hop ``decode_delay_s`` later; negative = the prefill
    hop later), same X-Request-Id."""
    rid = f"hl-{uuid.uuid4().hex[:12]}"
    t0 = time.perf_counter()
    if mode == "pull":
        ph = post_json(client, p.url, prefill_hop_body(prompt), rid, timeout)
        params = decode_params if decode_params is not None else ph.kv_params
        if ph.status != 200 or params is None:
            return ph, HopResult(error="no kv_transfer_params from prefill"), t0
        dh = post_stream(client, d.url, {**base_body(prompt), "kv_transfer_params": params},
                         rid, timeout)
        return ph, dh, t0
    params = decode_params if decode_params is not None else push_decode_params(p, rid)
    dbody = {**base_body(prompt), "kv_transfer_params": params}

    def later(seconds: float, fn: Any, *args: Any) -> HopResult:
        if seconds > 0:
            time.sleep(seconds)
        result: HopResult = fn(*args)
        return result

    fp: Future[HopResult] = pool.submit(later, -decode_delay_s, post_json, client, p.url,
                                        prefill_hop_body(prompt), rid, timeout)
    fd: Future[HopResult] = pool.submit(later, decode_delay_s, post_stream, client, d.url,
                                        dbody, rid, timeout)
    return fp.result(), fd.result(), t0


def same(a: HopResult, b: HopResult) -> bool:
    """Both answered fully and generated the same MAX_TOKENS token ids."""
    return (a.status == b.status == 200 and a.error is None and b.error is None
            and len(a.token_ids) == MAX_TOKENS and a.token_ids == b.token_ids
            and a.text == b.text)


def reference(client: httpx.Client, d: LabEngine, prompt: list[int]) -> HopResult:
    body = {**base_body(prompt), "cache_salt": f"ref-{uuid.uuid4().hex[:8]}"}
    return post_json(client, d.url, body, f"ref-{uuid.uuid4().hex[:12]}", 120.0)


def trial(client: httpx.Client, pool: ThreadPoolExecutor, mode: str, p: LabEngine, d: LabEngine,
          prompt: list[int]) -> Trial:
    ph, dh, t0 = disagg(client, pool, mode, p, d, prompt)
    ref = reference(client, d, prompt)
    cached = (dh.usage or {}).get("prompt_tokens_details")
    return Trial(
        mode=mode, tokens=len(prompt),
        ttft_s=None if dh.t_first is None else dh.t_first - t0,
        handoff_s=None if dh.t_first is None or not ph.t_done else dh.t_first - ph.t_done,
        prefill_s=ph.t_done - t0, decode_total_s=dh.t_done - t0,
        equal=same(dh, ref), disagg_tokens=dh.token_ids, ref_tokens=ref.token_ids,
        prefill_status=ph.status,
        decode_status=dh.status, cached_tokens=cached, decode_metrics=dh.metrics,
        prefill_metrics=ph.metrics,
        prefill_kv_params=ph.kv_params, error=ph.error or dh.error or ref.error)


def median_of(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return round(statistics.median(vals), 4) if vals else None


def summarize_trials(trials: list[Trial], lengths: list[int]) -> dict[str, Any]:
    return {str(n): {"ttft_s": median_of([t.ttft_s for t in trials if t.tokens == n]),
                     "handoff_s": median_of([t.handoff_s for t in trials if t.tokens == n]),
                     "prefill_hop_s": median_of([t.prefill_s for t in trials if t.tokens == n]),
                     "equal": all(t.equal for t in trials if t.tokens == n),
                     "n": sum(1 for t in trials if t.tokens == n)}
            for n in lengths}


