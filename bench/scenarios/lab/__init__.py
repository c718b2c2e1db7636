"""guidellm against the real CPU lab: disaggregated vs colocated, and the simulator's error.

Three setups, one after the other, on this machine's cores, each measured with the same
guidellm 0.8.1 workload (a mixed JSONL data file: half short prompts below the lab's
disaggregation threshold, half long ones above it; fixed output length; a synchronous and a
concurrent profile):

  disagg     ``pdctl controller`` with backend vllm and ``cpu_lab_defaults`` (what ``pdctl lab``
             runs): 1 prefill + 1 decode, each pinned to its own core, KV over NIXL.
  colocated  two plain vLLM OpenAI servers started here (the launcher's flags minus
             ``--kv-transfer-config``: no NixlConnector, so no busy-polling UCX progress
             thread), one pinned to each core, same KV space, behind ``pdctl controller``
             with backend external (empty prefill pool: every request is served colocated).
  sim        ``pdctl controller`` with backend sim, the lab's pools, TP, threshold and link,
             hardware ``cpu-lab``, model ``lab-tiny``, time scale 1.

guidellm runs offline (HF_HUB_OFFLINE, TRANSFORMERS_OFFLINE) from its own venv
(``.bench/venv-guidellm``), with the lab model directory as its tokenizer. TTFT and ITL
percentiles are computed here from guidellm's per-request records with ``bench.stats`` (the
controller's percentile definition): TTFT = first token - request start; ITL = a request's
(last token - first token) / (tokens - 1), counted once per gap, which is how guidellm
weighs its own ITL distribution. Throughput is successful requests and output tokens over
the benchmark's duration. Every process is stopped (``bench.processes``) when a setup ends, on
error and on Ctrl-C.

    .venv/bin/python -m bench lab            # 10-18 min on 2 cores (each run is capped at
                                             # 120 s; engines start in 1-2 min)
    .venv/bin/python -m bench lab --quick    # 5-8 min
    .venv/bin/python -m bench lab --only sim --real-from bench-results/lab.json \\
        --json bench-results/lab-sim.json    # the sim again, against earlier real runs

Create the guidellm venv (CPU torch from the local wheel, not a CUDA one) with
    python3.11 -m venv .bench/venv-guidellm
    .bench/venv-guidellm/bin/pip install torch==2.13.0 guidellm==0.8.1
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import httpx

from bench.processes import FleetError
from bench.report import ROOT
from bench.scenario import Scenario, take_given
from bench.scenarios.lab.calibrate import suggest_calibration
from bench.scenarios.lab.engines import lab_config
from bench.scenarios.lab.model import (
    GUIDELLM,
    LAB_SETUPS,
    LabOptions,
    LabResult,
    SetupResult,
    note,
)
from bench.scenarios.lab.setups import run_setup
from bench.scenarios.lab.text import lab_report
from bench.scenarios.lab.workload import write_data
from controller.config import load_settings


def ready_to_run(o: LabOptions) -> None:
    """``FleetError`` without guidellm's venv; the lab model written where it is missing."""
    if not GUIDELLM.exists():
        raise FleetError(f"{GUIDELLM} is missing. Create guidellm's venv with the CPU torch:\n"
                         "  python3.11 -m venv .bench/venv-guidellm\n"
                         "  .bench/venv-guidellm/bin/pip install torch==2.13.0 guidellm==0.8.1\n"
                         "(plain `pip install guidellm` pulls a multi-GB CUDA torch)")
    if not (o.model_dir / "tokenizer.json").is_file():
        note(f"no lab model in {o.model_dir}; writing it (pdctl make-model)")
        from controller.cli.make_model import make_model
        make_model(o.model_dir)


def prepare(o: LabOptions) -> LabResult:
    """The workload's data files (one per profile), and the result they start."""
    settings = load_settings(None, **lab_config(o.model_dir))
    threshold = settings.routing.disagg_min_prompt_tokens
    max_len = settings.model_profile.max_model_len
    short = (max(8, threshold // 8), threshold // 2)
    long = (2 * threshold, min(8 * threshold, max_len - o.output_tokens - 64))
    o.work.mkdir(parents=True, exist_ok=True)
    data: dict[str, Path] = {}
    lengths: dict[str, dict[str, dict[str, float]]] = {}
    for i, (profile, n) in enumerate((("synchronous", o.sync_requests),
                                      ("concurrent", o.conc_requests))):
        data[profile] = o.work / f"mixed-{profile}.jsonl"
        rows = 2 * (n // 2) + 2 * o.streams + 8
        lengths[profile] = write_data(data[profile], o.model_dir, rows, short, long,
                                      o.output_tokens, seed=7 + i, tag=profile[0])
        note(f"workload {profile}: {data[profile]} ({rows} rows; threshold {threshold}, "
             f"max_model_len {max_len}): {lengths[profile]}, {o.output_tokens} output "
             "tokens each")
    res = LabResult(o, time.strftime("%Y-%m-%d %H:%M:%S"), threshold, max_len, lengths,
                    {k: str(v) for k, v in data.items()}, os.cpu_count(), os.getloadavg()[0])
    if o.real_from is not None:
        earlier = json.loads(o.real_from.read_text()).get("setups", {})
        for name in LAB_SETUPS:
            if name not in o.setups and name in earlier:
                res.setups[name] = SetupResult.from_json(earlier[name], str(o.real_from))
    return res


class LabScenario(Scenario[LabOptions, LabResult], name="lab", alias="bench.lab"):
    """The real CPU lab under guidellm; simulator validity

    Real vLLM (CPU build) engines on this machine's two cores, the lab model, guidellm 0.8.1
    offline (local tokenizer, a generated mix of long and short prompts), synchronous and
    concurrent profiles. 1 prefill + 1 decode (KV over NIXL) started by pdctl, against 2
    colocated engines without a KV connector behind the same router. Then the same workload on
    the simulated lab (`cpu-lab` profile) and the error of its predictions."""

    def add_options(self, ap: argparse.ArgumentParser) -> None:
        ap.add_argument("--quick", action="store_true",
                        help="fewer requests and shorter caps (about half the time)")
        ap.add_argument("--only", choices=LAB_SETUPS, action="append",
                        help="run only this setup (repeatable); default: all three")
        ap.add_argument("--model-dir", type=Path, default=ROOT / "lab-model")
        ap.add_argument("--streams", type=int, default=4, help="concurrent profile's streams")
        ap.add_argument("--sync-requests", type=int, default=None,
                        help="default 40 (quick 12)")
        ap.add_argument("--sync-seconds", type=float, default=None,
                        help="cap of the synchronous run, default 120 (quick 45)")
        ap.add_argument("--conc-requests", type=int, default=None,
                        help="default 80 (quick 24)")
        ap.add_argument("--conc-seconds", type=float, default=None,
                        help="cap of the concurrent run, default 120 (quick 45)")
        ap.add_argument("--output-tokens", type=int, default=64)
        ap.add_argument("--pdctl-root", "--src", dest="pdctl_root", type=Path, default=None,
                        help="source tree the controllers run from (default: this checkout); "
                             "e.g. a `git worktree` or `git archive HEAD | tar -x -C DIR` to "
                             "pin the code")
        ap.add_argument("--real-from", type=Path, default=None,
                        help="take the setups not run now from this earlier --json result "
                             "(e.g. `--only sim --real-from bench-results/lab.json` after a "
                             "calibration)")
        ap.add_argument("--start-timeout", type=float, default=420,
                        help="seconds allowed for vLLM engines to become ready")
        ap.add_argument("--idle-probe", type=float, default=5.0,
                        help="seconds of idle CPU sampling with the engines up")

    def options(self, args: argparse.Namespace) -> LabOptions:
        o = LabOptions.defaults(args.quick)
        o.setups = tuple(args.only or LAB_SETUPS)
        o.work = args.json.resolve().parent / "lab-work"
        o.model_dir = args.model_dir.resolve()
        o.streams, o.output_tokens = args.streams, args.output_tokens
        take_given(o, args, ("sync_requests", "sync_seconds", "conc_requests", "conc_seconds"))
        o.pdctl_root = args.pdctl_root.resolve() if args.pdctl_root else None
        o.real_from = args.real_from
        o.start_timeout, o.idle_probe = args.start_timeout, args.idle_probe
        return o

    def defaults(self, quick: bool) -> LabOptions:
        return LabOptions.defaults(quick)

    def run(self, options: LabOptions) -> LabResult:
        """Every setup, one after the other; a failed setup is recorded, not raised."""
        ready_to_run(options)
        res = prepare(options)
        data = {k: Path(v) for k, v in res.data.items()}
        t0 = time.monotonic()
        try:
            for name in options.setups:
                note(f"== {name} ==")
                res.setups[name] = SetupResult()
                try:
                    run_setup(name, options, data, res.threshold, res.setups[name])
                except (FleetError, httpx.HTTPError) as exc:
                    note(f"{name} FAILED: {exc}")
                    res.setups[name].error = str(exc)
        finally:
            res.total_s = time.monotonic() - t0
        res.calibration = suggest_calibration(res, data["synchronous"])
        return res

    def report(self, result: LabResult) -> str:
        return lab_report(result)

    def check(self, result: LabResult) -> str | None:
        """The setups that failed, with why."""
        failed = [f"{name}: {s.error}" for name, s in result.setups.items() if s.error]
        return "; ".join(failed) or None
