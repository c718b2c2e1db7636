#!/usr/bin/env python3
"""``make bench``: every benchmark in turn, then BENCHMARKS.md rewritten from what they printed.

Runs, one after the other on an otherwise idle machine (each loads both cores):

1. ``scripts/bench_router.py``  router cost: pdctl vs vllm-router vs the client's own two hops
2. ``scripts/bench_lab.py``     the real CPU lab under guidellm: disaggregated vs colocated,
                                and the simulator's prediction of the same workload
3. ``scripts/bench_scale.py``   a 16P + 48D simulated 70B/H100 fleet at 1,000 requests/s

Each script's whole output goes to ``bench-results/<name>.log`` and its raw results to
``bench-results/<name>.json`` (git-ignored); its report (from the line its ``marker`` matches)
goes into BENCHMARKS.md with the machine, the commit and the run's date. A part that fails is
recorded as failed in BENCHMARKS.md and makes this script exit 1.

    .venv/bin/python scripts/bench_all.py [--only router lab scale] [--quick]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench-results"
DOC = ROOT / "BENCHMARKS.md"


@dataclass(frozen=True)
class Part:
    name: str
    script: str
    title: str
    marker: str  # regex of the line where the script's report starts
    about: str


PARTS = (
    Part("router", "bench_router.py", "Router cost: pdctl vs vllm-router 0.1.17",
         r"^router cost:",
         "One simulated prefill and one simulated decode engine (llama-3-8b, h100-sxm, TP1, "
         "time scale 0.1), reached three ways in interleaved rounds: `direct` (the client does "
         "the NixlConnector two-hop flow itself, the no-router baseline), `pdctl` (the "
         "controller, `external` backend) and `vllm-router` (`--vllm-pd-disaggregation`, in "
         "its own virtualenv). Streaming completions, closed-loop clients at concurrency 1, "
         "16, 64 and 256. Added TTFT is each router's client TTFT minus direct's; CPU per "
         "request is each router process's CPU time over the requests it served (robust to a "
         "noisy machine, unlike latency and rate)."),
    Part("lab", "bench_lab.py", "The real CPU lab under guidellm; simulator validity",
         r"^synchronous\b",
         "Real vLLM (CPU build) engines on this machine's two cores, the lab model, guidellm "
         "0.8.1 offline (local tokenizer, a generated mix of long and short prompts), "
         "synchronous and concurrent profiles. 1 prefill + 1 decode (KV over NIXL) started "
         "by pdctl, against 2 colocated engines without a KV connector behind the same "
         "router. Then the same workload on the simulated lab (`cpu-lab` profile) and the "
         "error of its predictions."),
    Part("scale", "bench_scale.py", "Scale: 16 prefill + 48 decode simulated 70B/H100 instances",
         r"^fleet\s{2,}",
         "`pdctl controller` starts 16 prefill (TP4) and 48 decode (TP2) simulated "
         "Llama-3-70B/H100 instances on 20 nodes x 8 and is driven open-loop at 1,000 "
         "requests/s (Poisson). Reported: achieved rate, errors, TTFT, where the CPU went, "
         "and the routing decision's latency from `pdctl_routing_decision_seconds`."),
)


def machine() -> list[str]:
    cpu = "unknown CPU"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem_kb = next(int(line.split()[1]) for line in open("/proc/meminfo")
                  if line.startswith("MemTotal"))
    return [f"{os.cpu_count()} CPUs ({cpu}), {mem_kb / 2**20:.0f} GiB memory, no GPU",
            f"{platform.system()} {platform.release()}, Python {platform.python_version()}"]


def commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                         capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                           capture_output=True, text=True).stdout.strip()
    return out.stdout.strip() + (" (with uncommitted changes)" if dirty else "")


def run_part(part: Part, quick: bool) -> tuple[int, str, float]:
    """Run one script, echoing its output; returns (exit status, output, seconds)."""
    RESULTS.mkdir(exist_ok=True)
    argv = [sys.executable, str(ROOT / "scripts" / part.script),
            "--json", str(RESULTS / f"{part.name}.json")] + (["--quick"] if quick else [])
    print(f"\n===== {part.name}: {' '.join(argv[1:])}", flush=True)
    t0 = time.monotonic()
    lines: list[str] = []
    with subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, bufsize=1) as proc:
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                sys.stdout.write(line)
                lines.append(line)
        except KeyboardInterrupt:
            proc.terminate()  # the scripts stop what they started on SIGTERM
            proc.wait()
            raise
    out = "".join(lines)
    (RESULTS / f"{part.name}.log").write_text(out)
    return proc.returncode, out, time.monotonic() - t0


def report_of(part: Part, out: str) -> str:
    lines = out.splitlines()
    start = next((i for i, line in enumerate(lines) if re.search(part.marker, line)), 0)
    return "\n".join(lines[start:]).strip()


def render(results: dict[str, tuple[int, str, float]], started: dt.datetime,
           load: tuple[float, float, float], quick: bool) -> str:
    out = [
        "# Benchmarks",
        "",
        "Written by `make bench` (`scripts/bench_all.py`); do not edit by hand -- rerun it.",
        "",
        f"- Run: {started:%Y-%m-%d %H:%M} UTC, commit {commit()}"
        + (" (`--quick`: smoke-test sizes, not figures to quote)" if quick else ""),
        *(f"- Machine: {m}" for m in machine()),
        f"- Load average when it started: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}",
        "- Reproduce: `make bench` (creates `.bench/venv-router` with vllm-router 0.1.17 and "
        "`.bench/venv-guidellm` with guidellm 0.8.1 on the CPU build of torch, writes the lab "
        "model, runs every part, rewrites this file). Whole output per part in "
        "`bench-results/<part>.log`, raw results in `bench-results/<part>.json`.",
        "- Two cores run the client, the router and every engine: latency and rate move with "
        "anything else on the machine; ratios come from runs interleaved in one session, and "
        "CPU time per request is the steadiest figure.",
        "",
    ]
    for i, part in enumerate(PARTS, 1):
        if part.name not in results:
            continue
        code, text, seconds = results[part.name]
        out += [f"## {i}. {part.title}", "", part.about, "",
                f"`scripts/{part.script}`: {'finished' if code == 0 else f'FAILED (exit {code})'}"
                f" in {seconds / 60:.1f} min.", "", "```text", report_of(part, text), "```", ""]
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="+", choices=[p.name for p in PARTS],
                    help="run these parts only (BENCHMARKS.md then holds only them)")
    ap.add_argument("--quick", action="store_true", help="each script's smoke-test size")
    args = ap.parse_args()
    started, load = dt.datetime.now(dt.UTC), os.getloadavg()
    results: dict[str, tuple[int, str, float]] = {}
    for part in PARTS:
        if args.only and part.name not in args.only:
            continue
        results[part.name] = run_part(part, args.quick)
    DOC.write_text(render(results, started, load, args.quick) + "\n")
    failed = [name for name, (code, _, _) in results.items() if code != 0]
    verdict = f"failed: {', '.join(failed)}" if failed else "all parts finished"
    print(f"\nBENCHMARKS.md rewritten; {verdict}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
