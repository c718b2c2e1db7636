"""Per-hop latencies and NIXL bandwidth of a running lab, one request at a time.

Sends ``--n`` sequential disaggregated requests (and as many colocated ones) through the
controller, then prints medians (``bench.stats``) of the TTFT parts the controller recorded,
the client-side end-to-end time, and the NIXL bandwidth the decode engines report. Run it
against ``pdctl lab`` (real vLLM) or ``pdctl lab --backend sim``.

    .venv/bin/python -m bench measure-lab --controller http://127.0.0.1:8080 \\
        --state-dir .pdctl [--n 10] [--model lab-tiny]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench import stats
from bench.scenario import Scenario
from pdctl_api.schema import PARTS as TTFT_PARTS

RECORD_FIELDS = (*(f"{p}_ms" for p in TTFT_PARTS), "ttft_ms", "itl_ms")
LONG_PROMPT = "the model layer decode cache token batch " * 60


@dataclass
class MeasureLabOptions:
    controller: str = "http://127.0.0.1:8080"
    state_dir: Path = Path(".pdctl")
    model: str = "lab-tiny"
    n: int = 10
    max_tokens: int = 16


@dataclass
class PathMedians:
    """One path's successful requests: how many, their prompt length, the medians (ms) of
    the controller's TTFT parts and of the client's end-to-end time."""

    requests: int
    prompt_tokens: int
    medians: dict[str, float]
    client_e2e_ms: float


@dataclass
class MeasureLabResult:
    options: MeasureLabOptions
    paths: dict[str, PathMedians | None] = field(default_factory=dict)  # None: none recorded
    nixl: dict[str, Any] = field(default_factory=dict)  # the decode pool's NIXL counters


def send_requests(api: httpx.Client, o: MeasureLabOptions) -> dict[str, list[float]]:
    """``o.n`` disaggregated and colocated requests, alternating; client ms of each."""
    e2e: dict[str, list[float]] = {"disaggregated": [], "colocated": []}
    for i in range(o.n):
        for path, prompt in (("disaggregated", LONG_PROMPT), ("colocated", "hello")):
            body = {"model": o.model, "prompt": f"{i} {prompt}", "max_tokens": o.max_tokens,
                    "ignore_eos": True}
            t0 = time.perf_counter()
            r = api.post("/v1/completions", json=body)
            r.raise_for_status()
            e2e[path].append((time.perf_counter() - t0) * 1e3)
    return e2e


class MeasureLabTool(Scenario[MeasureLabOptions, MeasureLabResult],
                     name="measure-lab", alias="bench.measure_lab", in_suite=False):
    """Per-hop latencies and NIXL bandwidth of a running lab

    Sequential disaggregated and colocated requests through a running lab's controller: medians
    of its TTFT parts, the client's end-to-end time, and the decode engines' NIXL bandwidth."""

    def add_options(self, ap: argparse.ArgumentParser) -> None:
        d = MeasureLabOptions()
        ap.add_argument("--controller", default=d.controller)
        ap.add_argument("--state-dir", type=Path, default=d.state_dir)
        ap.add_argument("--model", default=d.model)
        ap.add_argument("--n", type=int, default=d.n)
        ap.add_argument("--max-tokens", type=int, default=d.max_tokens)

    def options(self, args: argparse.Namespace) -> MeasureLabOptions:
        return MeasureLabOptions(args.controller, args.state_dir, args.model, args.n,
                                 args.max_tokens)

    def defaults(self, quick: bool) -> MeasureLabOptions:
        return MeasureLabOptions()

    def run(self, options: MeasureLabOptions) -> MeasureLabResult:
        o = options
        token = (o.state_dir / "token").read_text().strip()
        api = httpx.Client(base_url=o.controller, timeout=300,
                           headers={"Authorization": f"Bearer {token}"})
        e2e = send_requests(api, o)
        records = api.get("/api/v1/requests", params={"limit": 2 * o.n}).json()
        res = MeasureLabResult(o)
        for path in ("disaggregated", "colocated"):
            rows = [r for r in records if r["path"] == path and r["status"] == "ok"]
            res.paths[path] = PathMedians(
                len(rows), rows[0]["prompt_tokens"],
                {p.removesuffix("_ms"): stats.median(r[p] for r in rows)
                 for p in RECORD_FIELDS},
                stats.median(e2e[path])) if rows else None
        res.nixl = api.get("/api/v1/stats").json()["pools"]["decode"]["nixl"]
        return res

    def report(self, result: MeasureLabResult) -> str:
        lines = []
        for path, m in result.paths.items():
            if m is None:
                lines.append(f"{path}: no successful requests recorded")
                continue
            lines += [f"{path} ({m.requests} requests, prompt ~{m.prompt_tokens} tokens, "
                      f"{result.options.max_tokens} output tokens), medians:",
                      "  " + "  ".join(f"{k} {v:.1f}" for k, v in m.medians.items()) + " ms",
                      f"  client end-to-end {m.client_e2e_ms:.1f} ms"]
        nixl = result.nixl
        lines.append(f"NIXL (decode engines' own counters): {nixl['transfers']:.0f} transfers, "
                     f"{nixl['bytes'] / 1e6:.2f} MB in {nixl['seconds'] * 1e3:.1f} ms -> "
                     f"{nixl['gbps']:.3f} GB/s")
        return "\n".join(lines)
