"""Many simulated engines in one process: each on its own port, with vLLM's API and metrics.

A fleet of simulated instances as one process each costs the machine an event loop, an
interpreter and a set of pollers per instance. A host runs them all on one event loop; what
a client, the controller or Prometheus sees of each engine is unchanged (its own port, its
own ``/metrics`` registry, its own NIXL engine id). A KV pull between two engines of the same
host calls the prefill engine's side channel directly (the modelled transfer time is
unchanged); pulls from an engine elsewhere go over HTTP as before.

The host's control API (its own port):

- ``POST /host/engines`` ``{"args": [engine-sim flags], "log_path": "..."}``: start one
  engine; 201 once it listens, 422 for a bad configuration, 409 for a taken port or id;
- ``DELETE /host/engines/{engine_id}?grace_s=5``: stop it (graceful, then forced);
- ``GET /host/engines``: each engine's port, role and state (``running`` or ``exited``, with
  the reason); ``GET /health``.

Each engine's log records go to its own ``log_path`` (a context variable names the engine
whose task logs); the host's own lines go to stderr.

    python -m controller.engines.sim.host --port 8700
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import contextvars
import functools
import logging
import math
import os
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import uvicorn
from prometheus_client import disable_created_metrics
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from controller.engines.sim.config import SimConfigError
from controller.engines.sim.engine import SimEngine
from controller.engines.sim.server import (
    GRACEFUL_SHUTDOWN_S,
    add_arguments,
    advertised_host,
    config_from_args,
    create_engine_app,
)
from controller.signals import clean_stop_signals

ENGINE: contextvars.ContextVar[str | None] = contextvars.ContextVar("sim_engine", default=None)
START_TIMEOUT_S = 10.0
log = logging.getLogger(__name__)


class _FlagError(SimConfigError):
    pass


class _Flags(argparse.ArgumentParser):
    """engine-sim's flags, with errors raised rather than printed and exited."""

    def error(self, message: str) -> NoReturn:
        raise _FlagError(message)


def _parser() -> _Flags:
    parser = _Flags(prog="engine-sim", add_help=False)
    add_arguments(parser)
    return parser


class _Server(uvicorn.Server):
    """One engine's server on the host's loop: the host owns the signals, not each engine."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    def install_signal_handlers(self) -> None:  # uvicorn before 0.29
        return None


@dataclass
class Hosted:
    engine_id: str
    host: str
    port: int
    role: str
    app: Starlette
    server: _Server
    task: asyncio.Task[None]
    log: logging.Handler | None
    stopping: bool = False
    reason: str | None = field(default=None)

    def state(self) -> dict[str, Any]:
        running = not self.task.done()
        return {"engine_id": self.engine_id, "port": self.port, "role": self.role,
                "state": "running" if running else "exited",
                "exit_reason": None if running else self.reason or "engine server ended"}


class _ByEngine(logging.Handler):
    """Sends a record to the log of the engine whose task emitted it, else to stderr."""

    def __init__(self, host: SimHost) -> None:
        super().__init__()
        self._host = host
        self._stderr = logging.StreamHandler(sys.stderr)

    def setFormatter(self, fmt: logging.Formatter | None) -> None:  # noqa: N802 - logging's
        super().setFormatter(fmt)
        self._stderr.setFormatter(fmt)

    def emit(self, record: logging.LogRecord) -> None:
        hosted = self._host.engines.get(ENGINE.get() or "")
        (hosted.log if hosted is not None and hosted.log is not None
         else self._stderr).handle(record)


class SimHost:
    """The engines of this process, by engine id."""

    def __init__(self) -> None:
        self.engines: dict[str, Hosted] = {}

    def engine_at(self, host: str, port: int) -> SimEngine | None:
        """The running engine of this process that serves ``host:port``, if any."""
        for e in self.engines.values():
            if e.port == port and host in (e.host, advertised_host(e.host)) \
                    and not e.task.done():
                engine: SimEngine = e.app.state.sim.engine
                return engine
        return None

    async def start(self, args: list[str], log_path: str | None) -> Hosted:
        """Start one engine from its flags; ``SimConfigError`` for a bad one, ``OSError`` for a
        port that cannot be bound, ``KeyError`` for an engine id already running here."""
        ns, _unknown = _parser().parse_known_args(args)
        cfg = config_from_args(ns)
        if cfg.engine_id is None:
            raise SimConfigError("--engine-id is required on a sim host")
        old = self.engines.get(cfg.engine_id)
        if old is not None and not old.task.done():
            raise KeyError(cfg.engine_id)
        sock = socket.socket(socket.AF_INET6 if ":" in cfg.host else socket.AF_INET)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((cfg.host, cfg.port))
            sock.listen(2048)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        handler = _file_log(log_path, self._formatter())
        app = create_engine_app(cfg, kv_peers=self.engine_at)
        server = _Server(uvicorn.Config(app, log_level="warning", access_log=False,
                                        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S))
        ctx = contextvars.copy_context()
        ctx.run(ENGINE.set, cfg.engine_id)
        task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]),
                                                      context=ctx)
        hosted = Hosted(cfg.engine_id, cfg.host, cfg.port, cfg.role, app, server, task, handler)
        self.engines[cfg.engine_id] = hosted
        task.add_done_callback(functools.partial(self._ended, hosted, sock=sock))
        deadline = asyncio.get_running_loop().time() + START_TIMEOUT_S
        while not server.started and not task.done():
            if asyncio.get_running_loop().time() > deadline:
                await self.stop(cfg.engine_id, 0.0)
                raise OSError(f"engine {cfg.engine_id} did not start serving within "
                              f"{START_TIMEOUT_S:g} s")
            await asyncio.sleep(0.01)
        if task.done():
            raise OSError(f"engine {cfg.engine_id} ended while starting: {hosted.reason}")
        token = ENGINE.set(cfg.engine_id)  # this line goes to the engine's own log
        log.info("engine-sim %s %s TP%d serving on %s:%d in sim host pid %d",
                 cfg.role, cfg.model, cfg.tp, cfg.host, cfg.port, os.getpid())
        ENGINE.reset(token)
        return hosted

    def _ended(self, hosted: Hosted, task: asyncio.Task[None], *, sock: socket.socket
               ) -> None:
        sock.close()
        if hosted.reason is None:
            exc = None if task.cancelled() else task.exception()
            hosted.reason = ("stopped" if hosted.stopping
                             else f"engine server ended: {type(exc).__name__}: {exc}"
                             if exc is not None else "engine server ended by itself")
        if hosted.log is not None:
            hosted.log.close()

    async def stop(self, engine_id: str, grace_s: float) -> Hosted:
        """Graceful stop within ``grace_s``, then forced; ``KeyError`` for an unknown id."""
        hosted = self.engines[engine_id]
        hosted.stopping = True
        hosted.server.config.timeout_graceful_shutdown = max(0, math.ceil(grace_s))
        hosted.server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(hosted.task), grace_s + 2.0)
        except (TimeoutError, asyncio.CancelledError):
            hosted.server.force_exit = True
            hosted.task.cancel()
            with contextlib.suppress(BaseException):
                await hosted.task
        except Exception:  # noqa: BLE001 - its reason is recorded by _ended
            pass
        return hosted

    async def close(self) -> None:
        await asyncio.gather(*(self.stop(i, GRACEFUL_SHUTDOWN_S) for i, e in
                               self.engines.items() if not e.task.done()))

    @staticmethod
    def _formatter() -> logging.Formatter:
        return logging.Formatter(
            "%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s")


def _file_log(path: str | None, fmt: logging.Formatter) -> logging.Handler | None:
    if not path:
        return None
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path)
    handler.setFormatter(fmt)
    return handler


def _host_error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "code": status}}, status_code=status)


def create_host_app(host: SimHost) -> Starlette:
    async def health(request: Request) -> Response:
        return Response(status_code=200)

    async def listing(request: Request) -> JSONResponse:
        return JSONResponse({"pid": os.getpid(),
                             "engines": [e.state() for e in host.engines.values()]})

    async def start(request: Request) -> JSONResponse:
        try:
            body = await request.json()
            args, log_path = body["args"], body.get("log_path")
            if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
                raise TypeError("args must be a list of strings")
            if log_path is not None and not isinstance(log_path, str):
                raise TypeError("log_path must be a string")
        except (ValueError, KeyError, TypeError) as exc:
            return _host_error(422, f"expected {{\"args\": [flags], \"log_path\": path}}: {exc}")
        try:
            hosted = await host.start(args, log_path)
        except SimConfigError as exc:
            return _host_error(422, f"engine-sim: {exc}")
        except KeyError as exc:
            return _host_error(409, f"engine {exc.args[0]} already runs on this host")
        except OSError as exc:
            return _host_error(409, f"cannot serve the engine: {exc}")
        return JSONResponse({**hosted.state(),
                             "url": f"http://{advertised_host(hosted.host)}:{hosted.port}"},
                            status_code=201)

    async def stop(request: Request) -> JSONResponse:
        engine_id = request.path_params["engine_id"]
        try:
            grace_s = float(request.query_params.get("grace_s", GRACEFUL_SHUTDOWN_S))
        except ValueError:
            return _host_error(422, "grace_s must be a number of seconds")
        if engine_id not in host.engines:
            return _host_error(404, f"no engine {engine_id} on this host")
        return JSONResponse((await host.stop(engine_id, grace_s)).state())

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> Any:
        yield
        await host.close()

    return Starlette(routes=[
        Route("/health", health, methods=["GET"]),
        Route("/host/engines", listing, methods=["GET"]),
        Route("/host/engines", start, methods=["POST"]),
        Route("/host/engines/{engine_id}", stop, methods=["DELETE"]),
    ], lifespan=lifespan)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m controller.engines.sim.host",
        description="Host many simulated engines in one process, each on its own port; "
                    "engines are started and stopped through this host's control API.")
    parser.add_argument("--port", type=int, required=True, help="the control API's port")
    parser.add_argument("--host", default="127.0.0.1",
                        help="the control API's bind address (default: %(default)s)")
    args = parser.parse_args(argv)
    disable_created_metrics()  # as a one-engine process does: halves what Prometheus scrapes
    host = SimHost()
    router = _ByEngine(host)
    router.setFormatter(SimHost._formatter())
    logging.basicConfig(level=logging.WARNING, handlers=[router])
    for name in ("controller.engines.sim.engine", __name__):
        logging.getLogger(name).setLevel(logging.INFO)
    with clean_stop_signals():
        uvicorn.run(create_host_app(host), host=args.host, port=args.port, log_level="warning",
                    access_log=False, timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S + 3)
    return 0


if __name__ == "__main__":
    sys.exit(main())
