"""Per-hop latencies and NIXL bandwidth of a running lab, one request at a time.

Sends ``--n`` sequential disaggregated requests (and as many colocated ones) through the
controller, then prints medians (``bench.stats``) of the TTFT parts the controller recorded,
the client-side end-to-end time, and the NIXL bandwidth the decode engines report. Run it
against ``pdctl lab`` (real vLLM) or ``pdctl lab --backend sim``.

    .venv/bin/python -m bench.measure_lab --controller http://127.0.0.1:8080 \\
        --state-dir .pdctl [--n 10] [--model lab-tiny]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import httpx

from bench import stats

PARTS = ("queue_ms", "prefill_ms", "transfer_ms", "decode_sched_ms", "overhead_ms", "ttft_ms",
         "itl_ms")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.measure_lab",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--controller", default="http://127.0.0.1:8080")
    ap.add_argument("--state-dir", type=Path, default=Path(".pdctl"))
    ap.add_argument("--model", default="lab-tiny")
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=16)
    args = ap.parse_args(argv)
    token = (args.state_dir / "token").read_text().strip()
    api = httpx.Client(base_url=args.controller, timeout=300,
                       headers={"Authorization": f"Bearer {token}"})
    long_prompt = "the model layer decode cache token batch " * 60
    e2e: dict[str, list[float]] = {"disaggregated": [], "colocated": []}
    for i in range(args.n):
        for path, prompt in (("disaggregated", long_prompt), ("colocated", "hello")):
            body = {"model": args.model, "prompt": f"{i} {prompt}",
                    "max_tokens": args.max_tokens, "ignore_eos": True}
            t0 = time.perf_counter()
            r = api.post("/v1/completions", json=body)
            r.raise_for_status()
            e2e[path].append((time.perf_counter() - t0) * 1e3)
    records = api.get("/api/v1/requests", params={"limit": 2 * args.n}).json()
    for path in ("disaggregated", "colocated"):
        rows = [r for r in records if r["path"] == path and r["status"] == "ok"]
        if not rows:
            print(f"{path}: no successful requests recorded")
            continue
        print(f"{path} ({len(rows)} requests, prompt ~{rows[0]['prompt_tokens']} tokens, "
              f"{args.max_tokens} output tokens), medians:")
        medians = {p.removesuffix("_ms"): stats.median(r[p] for r in rows) for p in PARTS}
        print("  " + "  ".join(f"{k} {v:.1f}" for k, v in medians.items()) + " ms")
        print(f"  client end-to-end {stats.median(e2e[path]):.1f} ms")
    nixl = api.get("/api/v1/stats").json()["pools"]["decode"]["nixl"]
    print(f"NIXL (decode engines' own counters): {nixl['transfers']:.0f} transfers, "
          f"{nixl['bytes'] / 1e6:.2f} MB in {nixl['seconds'] * 1e3:.1f} ms -> "
          f"{nixl['gbps']:.3f} GB/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
