"""Server verbs: ``pdctl controller``, ``pdctl lab`` and ``pdctl engine-sim``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from controller.api import create_app
from controller.api.data import WireLane
from controller.api.listener import (
    ControllerServer,
    end_requests,
    event_loop_factory,
    raise_fd_limit,
    server_config,
)
from controller.api.state import AppState
from controller.cli import console
from controller.cli.args import SubParsers
from controller.cli.make_model import is_model_dir, make_model
from controller.config import Settings, deep_merge, load_settings
from controller.errors import ConfigError, InvalidChange
from controller.launchers import external_model
from controller.launchers.process import spawn, stop_group
from controller.models import InstanceState, Role
from controller.obs import prometheus
from controller.obs.logs import LOG_FORMATS, log_format, setup_logging
from controller.signals import clean_stop_signals
from controller.sizing import cpu_features
from controller.workers.hub import WorkerHub
from controller.workers.pool import WorkerPool
from controller.workers.sockets import listen_socket

log = logging.getLogger("pdctl.controller")


def _common_server_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, help="YAML configuration file")
    p.add_argument("--host", help="listen address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="listen port (default 8080)")
    p.add_argument("--state-dir", type=Path,
                   help="state directory: token, SQLite store, engine logs (default .pdctl)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning"])
    p.add_argument("--log-format", default="text", choices=list(LOG_FORMATS),
                   help="text (default) or json: one object per line with a dated UTC "
                        "timestamp, level, logger, message, and the request and trace ids "
                        "of the client request it is about")
    p.add_argument("--api-key", help="the data plane's API key (as vLLM's): OpenAI clients "
                   "send it as a bearer token on /v1/*, else 401. Off by default; the "
                   "environment (PDCTL_CONTROLLER__API_KEY) keeps it out of the process list")


def add_controller_parser(sub: SubParsers) -> None:
    p = sub.add_parser("controller", help="run the controller alone",
                       description="Run the controller: REST API, router and reconciler.")
    _common_server_flags(p)
    p.set_defaults(run=run_controller)


def add_lab_parser(sub: SubParsers) -> None:
    p = sub.add_parser(
        "lab", help="controller + prefill/decode pools on this machine",
        description="Start a controller with its pools on this machine, print the URLs and "
                    "where the API token is, and stop everything on Ctrl-C or SIGTERM.")
    _common_server_flags(p)
    p.add_argument("--backend", choices=["vllm", "sim"],
                   help="vllm: real vLLM instances on this machine's CPU with the tiny lab "
                        "model, KV over NIXL (GPU hosts: pass --config); sim: simulated "
                        "engines (Llama-3-70B on H100 unless configured). Default: the "
                        "config file's or PDCTL_BACKEND's backend, else vllm")
    p.add_argument("--launcher", choices=["local", "ray"],
                   help="where the engines run: local processes (default), or actors on Ray: "
                        "a head started for the lab and stopped with it unless ray.address "
                        "names a cluster (docs/ray.md)")
    p.add_argument("--prefill", type=int, metavar="N", help="prefill pool size (default 1)")
    p.add_argument("--decode", type=int, metavar="N", help="decode pool size (default 1)")
    p.add_argument("--model-dir", type=Path, default=Path("lab-model"),
                   help="vllm backend: the lab model's directory, written if missing "
                        "(default ./lab-model)")
    p.add_argument("--time-scale", type=float,
                   help="sim only: wall seconds per modelled second (default 1.0)")
    p.add_argument("--no-dashboard", action="store_true", help="do not start the console")
    p.add_argument("--dashboard-port", type=int, default=console.DEFAULT_PORT,
                   help=f"console port (default {console.DEFAULT_PORT})")
    p.add_argument("--no-prometheus", action="store_true",
                   help="do not start Prometheus (started when its binary is on PATH)")
    p.add_argument("--prometheus-port", type=int, metavar="PORT",
                   help="Prometheus port (default: a free one)")
    p.set_defaults(run=run_lab)


def add_engine_sim_parser(sub: SubParsers) -> None:
    from controller.engines.sim import server

    p = sub.add_parser("engine-sim", help="one simulated vLLM-compatible engine",
                       description="Serve one simulated vLLM-compatible engine (OpenAI API, "
                                   "NixlConnector handshake, vLLM metrics).")
    server.add_arguments(p)
    p.set_defaults(run=server.run_from_args)


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    ctl: dict[str, Any] = {}
    for flag in ("host", "port", "state_dir", "api_key"):
        if getattr(args, flag, None) is not None:
            ctl[flag] = getattr(args, flag)
    return {"controller": ctl} if ctl else {}


def _router_workers(st: AppState) -> tuple[WorkerPool | None, list[socket.socket] | None]:
    """With ``controller.data_workers`` above 1: the workers' pool (started with the server)
    and the sockets the controller serves on -- its address, shared with the workers, and
    the control socket they relay to."""
    cs = st.settings.controller
    if cs.data_processes <= 1:
        return None, None
    tcp = listen_socket(cs.host, cs.port)
    level = logging.getLevelName(logging.getLogger().level).lower()
    pool = WorkerPool(st.settings, tcp.getsockname()[1], WorkerHub(st), st.store, level,
                      log_format())
    st.workers = pool
    return pool, [tcp, pool.control_socket()]


def _serve(settings: Settings, after_start: Any = None) -> int:
    """Serve the controller until SIGINT/SIGTERM; the lifespan stops every instance."""
    raise_fd_limit()
    try:
        settings = external_model.resolve(settings)  # the model external engines serve
        app = create_app(settings)
    except ConfigError as exc:  # e.g. a Ray cluster that cannot be joined
        print(f"pdctl: {exc}", file=sys.stderr)
        return 2
    cs = settings.controller
    st: AppState = app.state.pdctl
    pool, sockets = _router_workers(st)
    server = ControllerServer(server_config(app, cs, WireLane(st.proxy, cs)),
                              lambda: end_requests(st.upstream),
                              pool.terminate if pool else None)

    async def main() -> None:
        if pool is not None:
            await pool.start()
        extra = asyncio.create_task(after_start(st)) if after_start else None
        try:
            await server.serve(sockets=sockets)
        finally:
            if extra:
                extra.cancel()
                with contextlib.suppress(BaseException):
                    await extra

    with clean_stop_signals(), asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        runner.run(main())
    return 0


def configured(verb: str, build: Callable[[], Settings]) -> Settings | None:
    """The settings ``build`` loads for ``pdctl VERB``, or None after saying on stderr why
    they are refused (the verb then exits with status 2)."""
    try:
        return build()
    except ConfigError as exc:
        print(f"pdctl {verb}: {exc}", file=sys.stderr)
        return None


def run_controller(args: argparse.Namespace) -> int:
    setup_logging(args.log_level, args.log_format)
    settings = configured("controller", lambda: load_settings(args.config, **_overrides(args)))
    return 2 if settings is None else _serve(settings)


def vllm_missing() -> str | None:
    """Why the vllm backend cannot run here, or None."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return ("vLLM is not installed in this environment. `make lab` installs the CPU build "
                "(pip install -e '.[lab]'); on GPU hosts install `vllm` and `nixl`.")
    if importlib.util.find_spec("nixl") is None:
        return "NIXL is not installed in this environment (pip install nixl)."
    return None


def cpu_lab_defaults(model_dir: Path) -> dict[str, Any]:
    """The real lab on this machine's CPU: the tiny model, one core per instance, KV over
    NIXL in host memory; more instances than cores share cores (correct, slow)."""
    return {
        "model": {"name": "lab-tiny", "path": str(model_dir)},
        "hardware": {"accelerator": "cpu-lab", "accelerators_per_node": os.cpu_count() or 1,
                     "nodes": 1, "kv_link": "host-memory", "share": 2},
        "pools": {"prefill": {"size": 1, "tp": 1}, "decode": {"size": 1, "tp": 1}},
        "routing": {"disagg_min_prompt_tokens": 128},
        # Eager mode: no torch.compile at start, which on 2 busy cores can take many minutes.
        "vllm": {"enforce_eager": True},
        "controller": {"start_timeout_s": 600.0, "health_interval_s": 5.0,
                       "unhealthy_after": 6},
    }


def lab_settings(args: argparse.Namespace) -> Settings:
    """The lab's settings, each layer over the one before: the lab's defaults (backend vllm;
    without a config file, the CPU lab's machine defaults), the config file, the environment
    (``PDCTL_...``), then the flags actually given."""
    over = _lab_flags(args)
    base: dict[str, Any] = {"backend": "vllm", "ray": {"address": "local"}}
    settings = load_settings(args.config, defaults=base, **over)
    if settings.backend == "vllm" and args.config is None:
        base = deep_merge(base, cpu_lab_defaults(args.model_dir))
        settings = load_settings(None, defaults=base, **over)
    elif settings.backend == "sim" and args.config is None:
        base = deep_merge(base, SIM_LAB_DEFAULTS)
        settings = load_settings(None, defaults=base, **over)
    return settings


# The sim lab: Llama-3-70B on H100 with decode at TP4, not the configuration default's TP2:
# at TP2 a decode instance holds ~35k tokens of KV (five 7k-token contexts), which on the
# benchmarks' mixed long/short prompts gave short-prompt TTFT p99 of 32 s through head-of-line
# blocking and recompute preemptions; TP4 holds ~500k tokens (docs/planner.md).
SIM_LAB_DEFAULTS: dict[str, Any] = {"pools": {"decode": {"tp": 4}}}


def _lab_flags(args: argparse.Namespace) -> dict[str, Any]:
    over = _overrides(args)
    if args.backend is not None:
        over["backend"] = args.backend
    if getattr(args, "launcher", None) is not None:
        over["launcher"] = args.launcher
    if args.time_scale is not None:
        over["sim"] = {"time_scale": args.time_scale}
    prom: dict[str, Any] = {}
    if args.no_prometheus:
        prom["enabled"] = False
    if args.prometheus_port is not None:
        prom["port"] = args.prometheus_port
    if prom:
        over["prometheus"] = prom
    return over


def run_lab(args: argparse.Namespace) -> int:
    setup_logging(args.log_level, args.log_format)
    settings = configured("lab", lambda: lab_settings(args))
    if settings is None:
        return 2
    if settings.backend == "vllm":
        missing = vllm_missing()
        if missing:
            print(f"pdctl lab: {missing}\n"
                  "Run `pdctl lab --backend sim` for a simulated fleet.", file=sys.stderr)
            return 2
        if args.config is None and not is_model_dir(args.model_dir):
            print(f"pdctl lab: no model in {args.model_dir}; writing the lab model there",
                  flush=True)
            make_model(args.model_dir)
    return _serve(settings, after_start=lambda st: _lab_session(st, args))


def _apply_lab_sizes(st: AppState, args: argparse.Namespace) -> None:
    for role, size in ((Role.PREFILL, args.prefill), (Role.DECODE, args.decode)):
        if size is not None and size != st.fleet.targets[role].size:
            st.fleet.set_pool(role, size, None, "pdctl lab")


def controller_url(st: AppState) -> str:
    cs = st.settings.controller
    host = "127.0.0.1" if cs.host in ("0.0.0.0", "::") else cs.host
    return f"http://{host}:{cs.port}"


def engine_attention(settings: Settings) -> cpu_features.AttentionPath | None:
    """The CPU attention kernel vLLM will pick for this lab's engines; None off the CPU
    vllm backend."""
    if settings.backend != "vllm" or not settings.hardware.is_cpu:
        return None
    m = settings.model_profile
    dtype = settings.engine_dtype or ("float32" if m.dtype_bytes == 4 else "bfloat16")
    return cpu_features.attention_path(cpu_features.cpu_flags(), dtype,
                                       settings.kv_block_size, m.head_dim)


def _attention_lines(settings: Settings) -> list[str]:
    path = engine_attention(settings)
    if path is None:
        return []
    lines = [f"  attention    vLLM CPU kernel {path.describe()}"]
    if path.crash_prone:
        lines.append("  WARNING      vLLM 0.32's amx kernel runs without AMX permission: a decode "
                     "engine can die (SIGILL) on its first disaggregated step; see "
                     "docs/vllm-lab.md (set vllm.dtype: float32)")
    return lines


def _ray_lines(settings: Settings) -> list[str]:
    if settings.launcher != "ray":
        return []
    r = settings.ray
    where = ("a Ray head started for this lab" if r.address == "local"
             else f"the Ray cluster at {r.address or 'auto'}")
    return [f"  engines      Ray actors on {where} (namespace {r.namespace}, "
            f"{settings.ray_accelerator} per TP rank)"]


def _banner(st: AppState, console_url: str | None, prom: str) -> str:
    cs = st.settings.controller
    base = controller_url(st)
    t = st.fleet.targets
    return "\n".join([
        "",
        f"pdctl lab ({st.settings.backend}: {st.settings.model.public_name} on "
        f"{st.settings.hardware.accelerator}, KV link {st.settings.hardware.kv_link})",
        *_ray_lines(st.settings),
        f"  pools        prefill {t[Role.PREFILL].size} x TP{t[Role.PREFILL].tp}, "
        f"decode {t[Role.DECODE].size} x TP{t[Role.DECODE].tp}",
        *_attention_lines(st.settings),
        f"  OpenAI API   {base}/v1   (model {st.settings.model.public_name!r})",
        f"  control API  {base}/api/v1   docs {base}/docs",
        f"  metrics      {base}/metrics",
        f"  API token    {(cs.state_dir / 'token').resolve()}",
        f"  console      {console_url or 'not started (--no-dashboard)'}",
        f"  prometheus   {prom}",
        "  stop         Ctrl-C",
        "",
    ])


async def _lab_session(st: AppState, args: argparse.Namespace) -> None:
    try:
        _apply_lab_sizes(st, args)
    except InvalidChange as exc:
        print(f"pdctl lab: --prefill/--decode refused: {exc}", file=sys.stderr)
    prom, prom_line = await start_lab_prometheus(st)
    proc = None
    console_url = None
    if not args.no_dashboard:
        url, state_dir = controller_url(st), st.settings.controller.state_dir
        prom_url = prom.url if prom else None
        proc = spawn(console.streamlit_argv(url, state_dir, args.dashboard_port,
                                            prometheus_url=prom_url),
                     state_dir / "logs" / "console.log",
                     console.console_env(url, state_dir, prom_url))
        console_url = f"http://127.0.0.1:{args.dashboard_port}"
    print(_banner(st, console_url, prom_line), flush=True)
    try:
        await report_progress(st)
    finally:
        if proc is not None:
            await stop_group(proc, 5.0)
        if prom is not None:
            await prom.stop()


async def start_lab_prometheus(st: AppState) -> tuple[prometheus.PrometheusProc | None, str]:
    """Prometheus scraping this controller and its engines, when its binary is here; and the
    banner's line: its URL, or why it was not started."""
    ps = st.settings.prometheus
    why = prometheus.unavailable(ps)
    if why is None:
        target = controller_url(st).removeprefix("http://")
        try:
            prom = await prometheus.start(st.settings, target)
        except prometheus.PrometheusError as exc:
            why = f"failed to start: {exc}"
        else:
            return prom, (f"{prom.url}   (scrapes the controller and every engine every "
                          f"{ps.scrape_interval_s:g} s; config {prom.config_path})")
    print(f"pdctl lab: Prometheus skipped: {why}", file=sys.stderr, flush=True)
    return None, f"not started: {why}"


def progress_line(st: AppState) -> str | None:
    """One line on how far the pools are from their desired state; None when converged."""
    views = {r: st.fleet.pool_view(r) for r in Role}
    if all(v["converged"] for v in views.values()):
        return None
    line = "converging: " + ", ".join(
        f"{r.value} {v['actual']['ready_at_desired_tp']}/{v['desired']['size']} ready"
        for r, v in views.items())
    starting = [i for i in st.fleet.registry if i.state is InstanceState.STARTING]
    if starting:
        now = st.fleet.clock()
        line += "; starting " + ", ".join(f"{i.id} {now - i.created_at:.0f}s" for i in starting)
    return line


async def report_progress(st: AppState, every_s: float = 2.0, quiet_s: float = 10.0) -> None:
    """Print progress while pools converge (on change, else every ``quiet_s`` seconds), and
    one line when they are ready."""
    last, last_at, ready_said = "", 0.0, False
    while True:
        line = progress_line(st)
        now = st.fleet.clock()
        if line is None and not ready_said:
            print("pools ready: " + ", ".join(
                f"{r.value} {len(st.fleet.ready(r))}" for r in Role), flush=True)
            ready_said = True
        elif line is not None:
            ready_said = False
            shape = line.split("; starting")[0]
            if shape != last or now - last_at >= quiet_s:
                print(line, flush=True)
                last, last_at = shape, now
        await asyncio.sleep(every_s)
