"""Where a request's router CPU goes: ``python -m bench.hotpath``.

The router-bound case of ``bench router`` (an instant engine pair, so the router's own cost
decides; streaming completions, closed loop) with the controller sampled by ``py-spy``
(``pip install py-spy``; not a project dependency) for the measured window. Prints the
requests served, the controller's CPU per request, and its functions by own and total
sampled CPU (``--top``); the raw profile is written as speedscope JSON beside the logs.
The profile's shares are steady on a loaded machine; CPU per request is the figure to
compare between checkouts (``--pdctl-root``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil

from bench.fleet import SIM_MODEL_8B, free_port, instant_engine_argv, start_controller
from bench.loadgen import closed_loop
from bench.processes import ProcessFleet
from bench.scenarios.router.model import ROUTER_PROMPT, ROUTING
from bench.scenarios.router.traffic import Urls, request_fn


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.hotpath", description=__doc__.split(
        "\n\n")[0])
    ap.add_argument("--concurrency", type=int, default=64, help="closed-loop clients")
    ap.add_argument("--duration", type=float, default=15.0, help="sampled seconds")
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("--policy", default="round_robin",
                    help="routing policy of both pools (round_robin, least_loaded, "
                    "cache_aware)")
    ap.add_argument("--top", type=int, default=30, help="functions listed")
    ap.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    ap.add_argument("--pdctl-root", type=Path, default=None,
                    help="profile the controller of that source tree")
    ap.add_argument("--data-workers", type=int, default=1,
                    help="data-plane processes (controller.data_workers); CPU and profile "
                    "cover the controller and its router workers")
    ap.add_argument("--no-profile", action="store_true",
                    help="measure requests/s and CPU per request only")
    return ap.parse_args(argv)


def profile_summary(profile: Path, top: int) -> str:
    """Own and total shares of the sampled frames (speedscope's sampled profile)."""
    doc = json.loads(profile.read_text())
    frames = doc["shared"]["frames"]
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    n = 0
    for prof in doc["profiles"]:
        for stack, weight in zip(prof["samples"], prof["weights"], strict=True):
            n += weight
            if stack:
                f = frames[stack[-1]]
                own[f"{f['name']} ({Path(f.get('file', '?')).name}:{f.get('line', 0)})"] += weight
            seen = set()
            for idx in stack:
                f = frames[idx]
                key = f"{f['name']} ({Path(f.get('file', '?')).name})"
                if key not in seen:
                    seen.add(key)
                    total[key] += weight
    lines = [f"{n:.1f} s of the processes' main threads sampled; own share (the frame "
             "itself):"]
    lines += [f"  {100 * w / n:5.1f}%  {k}" for k, w in own.most_common(top)]
    lines.append("total share (the frame and what it calls):")
    lines += [f"  {100 * w / n:5.1f}%  {k}" for k, w in total.most_common(top)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not args.no_profile and not Path(spy).exists():
        print("py-spy is not installed: pip install py-spy (or use --no-profile)")
        return 2
    work = Path(tempfile.mkdtemp(prefix="pdctl-hotpath-"))
    with ProcessFleet(work) as fleet:
        pp, dp = free_port(), free_port()
        fleet.start("engines", instant_engine_argv(pp, dp, SIM_MODEL_8B))
        routing = {**ROUTING, "prefill_policy": args.policy, "decode_policy": args.policy}
        ctl = start_controller(work, {
            "backend": "external", "model": {"name": SIM_MODEL_8B},
            "pools": {"prefill": {"urls": [f"http://127.0.0.1:{pp}"], "tp": 1},
                      "decode": {"urls": [f"http://127.0.0.1:{dp}"], "tp": 1}},
            "routing": routing, "controller": {"data_workers": args.data_workers}},
            fleet=fleet, pdctl_root=args.pdctl_root,
            log_level="warning", wait="converged")
        urls = Urls(f"http://127.0.0.1:{pp}", f"http://127.0.0.1:{dp}", ctl.url, "")
        body: dict[str, Any] = {"model": SIM_MODEL_8B, "prompt": ROUTER_PROMPT,
                                "max_tokens": args.max_tokens, "stream": True}
        fn = request_fn("pdctl", urls, body)
        asyncio.run(closed_loop(fn, args.concurrency, 2.0))  # warm-up
        proc = psutil.Process(ctl.proc.pid)
        procs = [proc, *proc.children()]  # the router workers, with --data-workers
        if len(procs) != args.data_workers:
            print(f"expected {args.data_workers} data-plane processes, found {len(procs)}")
            return 1
        spy_proc = None
        profile = work / "hotpath.speedscope.json"
        if not args.no_profile:
            spy_proc = subprocess.Popen(
                [spy, "record", "--pid", str(proc.pid), "--subprocesses", "--rate",
                 str(args.rate),
                 "--duration", str(int(args.duration) + 1), "--format", "speedscope",
                 "--output", str(profile), "--nonblocking"],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            time.sleep(0.5)
        cpu0 = [p.cpu_times() for p in procs]
        res = asyncio.run(closed_loop(fn, args.concurrency, args.duration))
        cpu1 = [p.cpu_times() for p in procs]
        served = res.total_done + res.errors
        cpu = sum((b.user + b.system) - (a.user + a.system) for a, b in zip(cpu0, cpu1,
                                                                              strict=True))
        print(f"policy {args.policy}, {args.data_workers} data-plane process(es), "
              f"concurrency {args.concurrency}, {args.duration:g} s: "
              f"{res.rps:,.0f} requests/s, {res.errors} errors, "
              f"controller CPU {1e6 * cpu / max(served, 1):,.0f} us/request"
              + (" (sampled by py-spy: add its overhead)" if spy_proc else ""))
        if spy_proc is not None:
            _, err = spy_proc.communicate(timeout=60)
            if not profile.exists():
                print(f"py-spy wrote no profile: {err.decode(errors='replace')[-500:]}")
                return 1
            print(profile_summary(profile, args.top))
            print(f"profile: {profile}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
