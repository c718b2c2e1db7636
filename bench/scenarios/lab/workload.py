"""The lab scenario's workload and client: the mixed JSONL data file (exact token counts with
the lab tokenizer), guidellm's command line and run, and one run's result from guidellm's
per-request records (percentiles with ``bench.stats``)."""

from __future__ import annotations

import json
import random
import shlex
from pathlib import Path
from typing import Any

from bench import stats
from bench.processes import FleetError, ProcessFleet
from bench.scenarios.lab.model import GUIDELLM, OFFLINE, ProfileResult, note
from controller.launchers.process import tail

LAB_PROMPT_WORDS = ("the model layer decode cache token batch prefill router engine memory "
                    "core transfer stream block queue latency request kernel tensor value page "
                    "attention weight shard link host agent thread").split()


def write_data(path: Path, model_dir: Path, rows: int, short: tuple[int, int],
               long: tuple[int, int], output_tokens: int, seed: int, tag: str
               ) -> dict[str, dict[str, float]]:
    """A JSONL file of prompts with exact token counts (the lab tokenizer), short and long in
    a seeded random order. Each prompt starts with a unique ``tag``+index, so that vLLM's
    prefix cache never hits (the simulator has none) when a setup runs both profiles."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    rng = random.Random(seed)
    text_ids = tok.encode(" ".join(rng.choice(LAB_PROMPT_WORDS) for _ in range(6000)),
                          add_special_tokens=False).ids
    kinds = ["short", "long"] * (rows // 2)
    rng.shuffle(kinds)
    counts: dict[str, list[int]] = {"short": [], "long": []}
    with open(path, "w") as f:
        for i, kind in enumerate(kinds):
            lo, hi = short if kind == "short" else long
            n = rng.randint(lo, hi)
            start = rng.randint(0, len(text_ids) - n - 1)
            prompt = f"{tag}{i} " + tok.decode(text_ids[start:start + n])
            n_real = len(tok.encode(prompt, add_special_tokens=False).ids)
            counts[kind].append(n_real)
            f.write(json.dumps({"prompt": prompt, "prompt_tokens_count": n_real,
                                "output_tokens_count": output_tokens}) + "\n")
    return {k: {"n": len(v), "min": min(v), "median": stats.median(v), "max": max(v)}
            for k, v in counts.items()}


def guidellm_argv(target: str, model_dir: Path, data: Path, profile: str, streams: int,
                  requests: int, seconds: float, out: Path) -> list[str]:
    # The controller has no /health: guidellm validates against /v1/models instead.
    backend = json.dumps({"kind": "openai_http", "target": target, "model": "lab-tiny",
                          "request_format": "/v1/completions", "timeout": 600,
                          "api_routes": {"/health": "v1/models"}})
    prof = "kind=synchronous" if profile == "synchronous" else f"kind=concurrent,streams={streams}"
    return [
        str(GUIDELLM), "run",
        "--backend", backend,
        "--tokenizer", f"kind=huggingface_auto,model={model_dir}",
        "--data", f"kind=json_file,path={data}",
        "--profile", prof,
        "--constraint", f"kind=max_requests,count={requests}",
        "--constraint", f"kind=max_duration,seconds={seconds:g}",
        "--output", f"kind=json,path={out}",
        "--disable-console-interactive",
    ]


def run_guidellm(fleet: ProcessFleet, name: str, argv: list[str], log_path: Path,
                 timeout_s: float) -> None:
    note(f"  $ {shlex.join(argv)}")
    env = {**OFFLINE, "VIRTUAL_ENV": str(GUIDELLM.parents[1])}
    fleet.start(name, argv, env, log=log_path)
    code = fleet.finish(name, timeout_s)
    if code != 0:
        raise FleetError(f"guidellm exited {code}; tail of {log_path}:\n{tail(log_path, 20)}")


def _prompt_tokens(data: Path) -> dict[str, int]:
    """Each prompt of the data file and its length in lab-tokenizer tokens."""
    lengths = {}
    with open(data) as f:
        for line in f:
            row = json.loads(line)
            lengths[row["prompt"]] = row["prompt_tokens_count"]
    return lengths


def profile_result(out: Path, data: Path, threshold: int) -> ProfileResult:
    """TTFT and ITL percentiles (``bench.stats``) from guidellm's per-request records;
    throughput over its duration; TTFT medians of the long and short prompts."""
    bench = json.loads(out.read_text())["benchmarks"][0]
    reqs = bench["requests"]["successful"]
    dur = float(bench["duration"]) or 1.0
    ttft, itl, gaps, by_len, out_tokens = _timings(reqs, _prompt_tokens(data), threshold)
    ttft_q = stats.quantiles_or_nan(ttft, (0.5, 0.99))
    itl_q = stats.quantiles_or_nan(stats.weighted_expand(itl, gaps), (0.5, 0.99))
    return ProfileResult(
        requests_ok=len(reqs),
        requests_errored=int(bench["metrics"]["request_totals"]["errored"]),
        duration_s=dur, ttft_p50_ms=ttft_q[0], ttft_p99_ms=ttft_q[1], itl_p50_ms=itl_q[0],
        itl_p99_ms=itl_q[1], req_per_s=len(reqs) / dur, output_tok_per_s=out_tokens / dur,
        ttft_p50_long_ms=stats.median(by_len["long"]),
        ttft_p50_short_ms=stats.median(by_len["short"]),
        n_long=len(by_len["long"]), n_short=len(by_len["short"]))


def _timings(reqs: list[dict[str, Any]], lengths: dict[str, int], threshold: int
             ) -> tuple[list[float], list[float], list[int], dict[str, list[float]], int]:
    """TTFTs (ms), each request's mean ITL (ms) and its gaps, TTFTs of the long and short
    prompts, and the output tokens, of guidellm's successful requests."""
    ttft: list[float] = []
    itl: list[float] = []
    gaps: list[int] = []
    by_len: dict[str, list[float]] = {"long": [], "short": []}
    out_tokens = 0
    for r in reqs:
        t = r["info"]["timings"]
        n_out = (r.get("output_metrics") or {}).get("text_tokens") or 0
        out_tokens += n_out
        first, start, last = (t.get("first_token_iteration"), t.get("request_start"),
                              t.get("last_token_iteration"))
        if first is None or start is None:
            continue
        ttft.append(1e3 * (first - start))
        if n_out > 1 and last is not None:
            itl.append(1e3 * (last - first) / (n_out - 1))
            gaps.append(n_out - 1)
        # The prompt's length in lab-tokenizer tokens, from the data file (the sim's usage
        # counts UTF-8 bytes / 4, not tokens).
        try:
            n = lengths[json.loads(r["request_args"])["body"]["prompt"]]
        except (ValueError, KeyError, TypeError):
            n = (r.get("input_metrics") or {}).get("text_tokens") or 0
        by_len["long" if n >= threshold else "short"].append(1e3 * (first - start))
    return ttft, itl, gaps, by_len, out_tokens
