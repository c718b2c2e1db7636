"""The simulated engine as an app and a command: ``create_engine_app`` and the CLI entry points."""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import time
import uuid
from collections.abc import AsyncIterator

import httpx
import uvicorn
from prometheus_client import disable_created_metrics
from starlette.applications import Starlette
from starlette.routing import Route

from controller.engines.sim import routes
from controller.engines.sim.config import (
    KV_CONNECTORS,
    SimConfigError,
    SimEngineConfig,
    parse_kv_events_config,
    validate_config,
)
from controller.engines.sim.engine import SimEngine
from controller.engines.sim.kv_pull import (
    HEARTBEAT_PATH,
    PULL_PATH,
    PUSHED_PATH,
    REGISTER_PATH,
    RELEASE_PATH,
    KvPuller,
    Peers,
    advertised_host,
)
from controller.engines.sim.metrics import SimMetrics
from controller.signals import clean_stop_signals
from pdctl_api import profiles

GRACEFUL_SHUTDOWN_S = 2


__all__ = ["GRACEFUL_SHUTDOWN_S", "add_arguments", "advertised_host", "config_from_args",
           "create_engine_app", "run_from_args"]


def create_engine_app(cfg: SimEngineConfig, kv_transport: httpx.AsyncBaseTransport | None = None,
               kv_peers: Peers | None = None) -> Starlette:
    """The engine's Starlette app. ``kv_transport`` lets tests route KV pulls in-process;
    ``kv_peers`` finds prefill engines of this process, whose side channel is called directly.

    Raises ``SimConfigError`` for a config that names unknown profiles or does not fit.
    """
    validate_config(cfg)
    engine_id = cfg.engine_id or uuid.uuid4().hex
    engine = SimEngine(cfg, engine_id, SimMetrics(cfg.model_name), KvPuller(kv_transport, kv_peers))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            await engine.start_events()  # binds the KV-event sockets, if configured
            yield
        finally:
            await engine.close()

    app = Starlette(routes=[
        Route("/health", routes.health, methods=["GET"]),
        Route("/v1/models", routes.models, methods=["GET"]),
        Route("/v1/completions", routes.completions, methods=["POST"]),
        Route("/v1/chat/completions", routes.chat_completions, methods=["POST"]),
        Route("/metrics", routes.metrics, methods=["GET"]),
        Route("/sim/info", routes.info, methods=["GET"]),
        Route(PULL_PATH, routes.kv_pull, methods=["POST"]),
        Route(RELEASE_PATH, routes.kv_release, methods=["POST"]),
        Route(HEARTBEAT_PATH, routes.kv_heartbeat, methods=["POST"]),
        Route(REGISTER_PATH, routes.kv_register, methods=["POST"]),
        Route(PUSHED_PATH, routes.kv_pushed, methods=["POST"]),
        Route("/sim/fault", routes.fault, methods=["GET", "POST"]),
        Route("/sim/traces", routes.traces, methods=["GET"]),
        Route("/reset_prefix_cache", routes.reset_prefix_cache, methods=["POST"]),
    ], lifespan=lifespan)
    kv_endpoint = {"remote_engine_id": engine_id, "remote_host": advertised_host(cfg.host),
                   "remote_port": cfg.port, "tp_size": cfg.tp}
    if cfg.kv_transfer_mode == "push":  # vLLM 0.32 names the mode in what a prefill returns
        kv_endpoint["transfer_mode"] = "push"
    app.state.sim = routes.SimState(cfg, engine, time.monotonic() + cfg.startup_delay_s,
                                    int(time.time()), kv_endpoint)
    return app


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``engine-sim`` flags; names follow vLLM's where vLLM has one."""
    p = parser.add_argument
    p("--port", type=int, required=True, help="HTTP port (also the KV side channel)")
    p("--host", default="127.0.0.1", help="bind address, advertised to decode engines "
      "as remote_host (default: %(default)s)")
    p("--role", choices=["prefill", "decode", "both"], default="both",
      help="what the instance reports; every role serves every request (default: %(default)s)")
    p("--hardware", default="h100-sxm",
      help=f"accelerator profile: {', '.join(sorted(profiles.HARDWARE))} (default: %(default)s)")
    p("--model", default="llama-3-70b",
      help=f"model profile: {', '.join(sorted(profiles.MODELS))} (default: %(default)s)")
    p("--served-model-name", default=None, help="model name clients use (default: --model)")
    p("--tp", "--tensor-parallel-size", dest="tp", type=int, default=1,
      help="tensor parallelism: accelerators per instance (default: %(default)s)")
    p("--link", default="ib-ndr",
      help=f"KV transfer link: {', '.join(sorted(profiles.LINKS))} (default: %(default)s)")
    p("--time-scale", type=float, default=1.0, help="wall seconds slept per modelled second; "
      "0.05 runs 20x faster than the hardware would (default: %(default)s)")
    p("--kv-load-failure-policy", choices=["fail", "recompute"], default="fail",
      help="decode hop whose KV pull fails: error, or prefill locally (default: %(default)s)")
    p("--max-num-seqs", type=int, default=256,
      help="most sequences in the running batch (default: %(default)s)")
    p("--max-num-batched-tokens", type=int, default=8192,
      help="token budget of one step, decodes plus prefill chunks (default: %(default)s)")
    p("--kv-lease-duration", type=float, default=30.0, metavar="SECONDS",
      help="wall seconds a prefill keeps KV no decode engine read, renewed by the decode "
      "engine's heartbeats; NixlConnector's kv_lease_duration (default: %(default)s)")
    p("--block-size", type=int, default=16, help="tokens per KV block (default: %(default)s)")
    p("--engine-id", default=None, help="NIXL engine id (default: a fresh uuid4 hex)")
    p("--startup-delay-s", type=float, default=0.0,
      help="wall seconds /health answers 503, modelling engine load (default: %(default)s)")
    p("--max-model-len", type=int, default=None, metavar="N",
      help="context served, prompt + completion tokens (default: the model profile's; at "
      "most that)")
    p("--kv-events-config", default=None, metavar="JSON",
      help="vLLM's KV-event publisher config, e.g. {\"enable_kv_cache_events\": true, "
      "\"publisher\": \"zmq\", \"endpoint\": \"tcp://*:5557\", \"replay_endpoint\": "
      "\"tcp://*:5558\"} (default: no events)")
    p("--enable-prompt-tokens-details", action="store_true", default=False,
      help="usage carries prompt_tokens_details.cached_tokens, as in vLLM")
    p("--kv-connector", choices=list(KV_CONNECTORS), default="NixlConnector",
      help="vLLM's kv_connector: NixlConnector and NixlPullConnector read the KV from the "
      "prefill (pull mode), NixlPushConnector has the prefill write it into the decode "
      "engine's blocks, both hops sent at once (push mode) (default: %(default)s)")
    p("--push-registration-timeout", type=float, default=None, metavar="SECONDS",
      help="push mode: wall seconds a decode engine's registration waits for the prefill's "
      "write before the KV load fails (default: --kv-lease-duration)")
    p("--fault-kv-unreachable", action="store_true", default=False,
      help="fault injection: every prefill's side channel is unreachable from this engine, "
      "so its KV loads fail (toggle at run time with POST /sim/fault)")


def config_from_args(args: argparse.Namespace) -> SimEngineConfig:
    """The validated config; ``SimConfigError`` names the bad value and the known choices."""
    cfg = SimEngineConfig(
        port=args.port, host=args.host, role=args.role, hardware=args.hardware,
        model=args.model, served_model_name=args.served_model_name, tp=args.tp, link=args.link,
        time_scale=args.time_scale, kv_load_failure_policy=args.kv_load_failure_policy,
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        kv_lease_duration_s=args.kv_lease_duration, block_size=args.block_size,
        engine_id=args.engine_id, startup_delay_s=args.startup_delay_s,
        max_model_len=args.max_model_len,
        kv_events_config=parse_kv_events_config(args.kv_events_config),
        enable_prompt_tokens_details=args.enable_prompt_tokens_details,
        kv_connector=args.kv_connector,
        push_registration_timeout_s=args.push_registration_timeout,
        fault_kv_unreachable=args.fault_kv_unreachable)
    validate_config(cfg)
    return cfg


def run_from_args(args: argparse.Namespace) -> int:
    """Serve until SIGINT or SIGTERM; 0 after a clean stop, 2 for a bad configuration."""
    try:
        cfg = config_from_args(args)
    except SimConfigError as exc:
        print(f"engine-sim: {exc}", file=sys.stderr)
        return 2
    # This process is the engine alone: drop the *_created series process-wide, which halves
    # what a fleet of engines makes Prometheus scrape. Apps built in-process keep the default.
    disable_created_metrics()
    # The lease warnings and errors (vLLM's own words) go to stderr, in vLLM's log format.
    logging.basicConfig(level=logging.WARNING,
                        format="%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s")
    # ... and one INFO line per KV handle a decode hop brings (which engine got which handle).
    logging.getLogger("controller.engines.sim.engine").setLevel(logging.INFO)
    app = create_engine_app(cfg)
    with clean_stop_signals():
        uvicorn.run(app, host=cfg.host, port=cfg.port, log_level="warning", access_log=False,
                    timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S)
    return 0
