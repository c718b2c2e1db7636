"""``pdctl profile``: start one engine of a configuration, sweep it, write its profile."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from controller.cli.args import SubParsers
from controller.cli.serve import configured
from controller.config import Settings, deep_merge, load_settings
from controller.launchers.base import Launched, LaunchSpec
from controller.launchers.process import ProcessLauncher
from controller.launchers.sim import SimEngineKind
from controller.launchers.vllm import VllmEngineKind
from controller.models import Role
from controller.planner.profile import profile_key
from controller.planner.sweep import SweepPlan, sweep
from pdctl_api import profiles

SIM_SWEEP = {"prompts": [128, 512, 1024, 2048, 3072, 4096, 6144, 8000],
             "contexts": [512, 2048, 4096, 7680],
             "concurrency": [1, 4, 16, 32, 64, 128, 256], "decode_tokens": 32}
CPU_SWEEP = {"prompts": [32, 64, 128, 256, 512, 1024], "contexts": [128, 512, 1536],
             "concurrency": [1, 2, 4, 8], "decode_tokens": 16}


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated integers") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: positive integers")
    return sorted(set(values))


def add_profile_parser(sub: SubParsers) -> None:
    p = sub.add_parser(
        "profile", help="measure one engine; write its performance profile for the planner",
        description="Start one engine of the configured backend, model and accelerator at "
                    "TP N (or measure one at --url), sweep prompt lengths (prefill TTFT and "
                    "throughput) and concurrency x context (decode ITL and throughput), and "
                    "write OUT/{engine}-{model}-{accelerator}-tp{N}.json. The planner reads "
                    "the shipped profiles and those in planner.profile_dir.")
    p.add_argument("--config", type=Path, help="YAML configuration (as the controller's)")
    p.add_argument("--backend", choices=["sim", "vllm"],
                   help="engine kind (default: the config's, else vllm: the CPU lab)")
    p.add_argument("--model", help=f"sim: model profile name: {', '.join(sorted(profiles.MODELS))} "
                                   "(default: the config's)")
    p.add_argument("--hardware", help="sim: accelerator profile name (default: the config's)")
    p.add_argument("--tp", type=int, default=1, help="tensor parallelism (default 1)")
    p.add_argument("--time-scale", type=float, default=0.5,
                   help="sim: wall seconds per modelled second (default 0.5); the profile "
                        "holds modelled time")
    p.add_argument("--model-dir", type=Path, default=Path("lab-model"),
                   help="vllm without --config: the lab model's directory (default lab-model)")
    p.add_argument("--url", help="measure this running engine instead of starting one")
    p.add_argument("--out", type=Path, default=Path("profiles"),
                   help="directory for the profile file (default ./profiles)")
    p.add_argument("--prompts", type=_ints, help="prefill prompt lengths, e.g. 128,1024")
    p.add_argument("--contexts", type=_ints, help="decode context lengths")
    p.add_argument("--concurrency", type=_ints, help="decode concurrencies")
    p.add_argument("--decode-tokens", type=int, help="tokens per decode request")
    p.add_argument("--state-dir", type=Path, default=Path(".pdctl-profile"),
                   help="where the engine's log goes (default .pdctl-profile)")
    p.set_defaults(run=run_profile)


def profile_settings(args: argparse.Namespace) -> Settings:
    from controller.cli.serve import cpu_lab_defaults  # noqa: PLC0415 - serve imports uvicorn

    base: dict[str, Any] = {"backend": "vllm"}
    over: dict[str, Any] = {"controller": {"state_dir": str(args.state_dir)},
                            "sim": {"time_scale": args.time_scale}}
    if args.backend:
        over["backend"] = args.backend
    if args.model:
        over["model"] = {"name": args.model}
    if args.hardware:
        over["hardware"] = {"accelerator": args.hardware}
    settings = load_settings(args.config, defaults=base, **over)
    if settings.backend == "vllm" and args.config is None:
        base = deep_merge(base, cpu_lab_defaults(args.model_dir))
        settings = load_settings(None, defaults=base, **over)
    return settings


def kv_capacity(settings: Settings, tp: int) -> int | None:
    """KV cache tokens one engine of this configuration holds."""
    m, hw = settings.model_profile, settings.hardware.profile
    if settings.backend == "sim":
        return profiles.kv_capacity_tokens(profiles.model(settings.model.profile_name), hw, tp)
    if settings.hardware.is_cpu:
        return int(settings.vllm.cpu_kv_cache_gib * profiles.GIB // m.kv_bytes_per_token)
    return profiles.kv_capacity_tokens(m, hw, tp, settings.vllm.gpu_memory_utilization)


def sweep_plan(settings: Settings, args: argparse.Namespace, tp: int) -> SweepPlan:
    d: dict[str, Any] = dict(SIM_SWEEP if settings.backend == "sim" else CPU_SWEEP)
    for key in ("prompts", "contexts", "concurrency", "decode_tokens"):
        if getattr(args, key, None):
            d[key] = getattr(args, key)
    limit = settings.context_len
    if limit:
        d["prompts"] = [n for n in d["prompts"] if n + 1 <= limit] or [limit - 1]
    return SweepPlan(**d, repeats=3 if settings.backend == "sim" else 2,
                     kv_capacity_tokens=kv_capacity(settings, tp),
                     vocab=settings.model_profile.vocab, max_model_len=limit)


async def wait_healthy(url: str, launcher: ProcessLauncher, launched: Launched,
                       timeout_s: float) -> None:
    t0 = time.monotonic()
    said = 0.0
    async with httpx.AsyncClient(timeout=2.0) as client:
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get(f"{url}/health")).status_code == 200:
                    return
            why = launcher.exit_reason(launched)
            if why is not None:
                raise RuntimeError(f"the engine exited while starting: {why}")
            waited = time.monotonic() - t0
            if waited > timeout_s:
                raise RuntimeError(f"the engine was not healthy after {timeout_s:.0f} s")
            if waited - said >= 10:
                print(f"waiting for the engine ({waited:.0f} s)", flush=True)
                said = waited
            await asyncio.sleep(0.5)


async def _profile_engine(settings: Settings, args: argparse.Namespace) -> Path:
    tp = args.tp
    backend, name = settings.backend, settings.model.profile_name
    accel = settings.hardware.accelerator
    scale = settings.time_scale
    plan = sweep_plan(settings, args, tp)
    source = (f"pdctl profile --backend {backend} --tp {tp}"
              f"{f' --time-scale {scale:g}' if backend == 'sim' else ''}, "
              f"{datetime.now(UTC):%Y-%m-%d}")
    launcher = ProcessLauncher(SimEngineKind(settings) if backend == "sim"
                               else VllmEngineKind(settings))
    launched = None
    url = args.url
    try:
        if url is None:
            log = (settings.controller.state_dir / "logs" / "profile-engine.log").resolve()
            spec = LaunchSpec("profile", Role.DECODE, tp, tuple(range(tp)), log)
            launched = await launcher.start(spec)
            url = launched.url
            print(f"started a {backend} engine ({name} on {accel}, TP {tp}) at {url}; "
                  f"log {log}", flush=True)
            await wait_healthy(url, launcher, launched, settings.controller.start_timeout_s)
        profile = await sweep(url, settings.model.public_name, plan, scale,
                              lambda line: print(line, flush=True), backend, name, accel, tp,
                              source)
    finally:
        if launched is not None:
            await launcher.stop(launched)
        await launcher.close()
    path = args.out / f"{profile_key(backend, name, accel, tp)}.json"
    profile.save(path)
    return path


def run_profile(args: argparse.Namespace) -> int:
    if args.tp < 1:
        print("pdctl profile: --tp must be at least 1", file=sys.stderr)
        return 2
    settings = configured("profile", lambda: profile_settings(args))
    if settings is None:
        return 2
    if settings.backend == "external":
        print("pdctl profile: backend external: pass --backend sim or vllm (with --url to "
              "measure a running engine)", file=sys.stderr)
        return 2
    if settings.backend == "sim":
        fit = profiles.fit_problem(
            profiles.with_context(profiles.model(settings.model.profile_name),
                                  settings.model.max_model_len),
            settings.hardware.profile, args.tp)
        if fit:
            print(f"pdctl profile: {fit}", file=sys.stderr)
            return 2
    try:
        path = asyncio.run(_profile_engine(settings, args))
    except (RuntimeError, httpx.HTTPError, OSError) as exc:
        print(f"pdctl profile: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {path}\nthe planner reads it with planner.profile_dir: {path.parent}",
          flush=True)
    return 0
