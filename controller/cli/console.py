"""Starting the console from the controller's side: the Streamlit command line, its
environment, and the ``pdctl dashboard`` verb, without importing the console (``dashboard``
may import ``controller``, never the reverse; the app is found by its package's location).

Streamlit runs headless, without usage statistics, file watcher or browser opening. The
controller URL, state directory and Prometheus URL (when there is one) reach the app both as
script arguments (after ``--``) and as environment variables (``PDCTL_URL``,
``PDCTL_STATE_DIR``, ``PDCTL_PROMETHEUS_URL``); the token is read from
``STATE_DIR/token`` or ``PDCTL_TOKEN`` by the app itself, on every refresh.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path

from controller.cli.args import SubParsers
from pdctl_api.client import DEFAULT_STATE_DIR, DEFAULT_URL


def _app_path() -> Path:
    """``dashboard/app.py``, located without importing the ``dashboard`` package: beside
    ``controller`` (one distribution installs both), else wherever ``dashboard`` is found."""
    sibling = Path(__file__).resolve().parents[2] / "dashboard" / "app.py"
    spec = None if sibling.exists() else importlib.util.find_spec("dashboard")
    if spec is not None and spec.origin:
        return Path(spec.origin).resolve().parent / "app.py"
    return sibling


APP = _app_path()
DEFAULT_PORT = 8501


def streamlit_argv(controller_url: str, state_dir: Path, port: int, host: str = "127.0.0.1",
                   prometheus_url: str | None = None) -> list[str]:
    """The command that runs the console with this interpreter."""
    prom = ["--prometheus", prometheus_url] if prometheus_url else []
    return [
        sys.executable, "-m", "streamlit", "run", str(APP),
        "--server.headless", "true",
        "--server.address", host,
        "--server.port", str(port),
        "--server.fileWatcherType", "none",
        "--server.runOnSave", "false",
        "--browser.gatherUsageStats", "false",
        "--client.toolbarMode", "viewer",
        "--runner.magicEnabled", "false",  # the pages use no magic; it costs a parse per run
        "--",
        "--controller", controller_url,
        "--state-dir", str(state_dir),
        *prom,
    ]


def console_env(controller_url: str, state_dir: Path, prometheus_url: str | None = None
                ) -> dict[str, str]:
    """Environment variables the console reads (merge them over ``os.environ``)."""
    env = {
        "PDCTL_URL": controller_url,
        "PDCTL_STATE_DIR": str(state_dir),
        "STREAMLIT_BROWSER_GATHER_USAGE_STATS": "false",
        "STREAMLIT_SERVER_HEADLESS": "true",
        "STREAMLIT_SERVER_FILE_WATCHER_TYPE": "none",
    }
    if prometheus_url:
        env["PDCTL_PROMETHEUS_URL"] = prometheus_url
    return env


def add_dashboard_parser(sub: SubParsers) -> None:
    p = sub.add_parser(
        "dashboard", help="the Streamlit operator console alone",
        description="Run the operator console against a running controller. The API token "
                    "is read from STATE_DIR/token, or PDCTL_TOKEN.")
    p.add_argument("--controller", default=os.environ.get("PDCTL_URL", DEFAULT_URL),
                   help=f"controller URL (env PDCTL_URL; default {DEFAULT_URL})")
    p.add_argument("--state-dir", type=Path,
                   default=Path(os.environ.get("PDCTL_STATE_DIR") or DEFAULT_STATE_DIR),
                   help="the controller's state directory, for its token (default .pdctl)")
    p.add_argument("--prometheus", default=os.environ.get("PDCTL_PROMETHEUS_URL") or None,
                   metavar="URL", help="Prometheus for the time-series panels (env "
                                       "PDCTL_PROMETHEUS_URL; default: none, the panels use "
                                       "the controller's API)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT,
                   help=f"console port (default {DEFAULT_PORT})")
    p.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    p.set_defaults(run=run_dashboard)


def run_dashboard(args: argparse.Namespace) -> int:
    """Run Streamlit in the foreground until Ctrl-C or SIGTERM (then exit 0), or until it
    exits by itself (then its exit status, e.g. when the port is taken)."""
    prom_url: str | None = getattr(args, "prometheus", None)
    argv = streamlit_argv(args.controller, args.state_dir, args.port, args.host, prom_url)
    env = {**os.environ, **console_env(args.controller, args.state_dir, prom_url)}
    source = "PDCTL_TOKEN" if os.environ.get("PDCTL_TOKEN") else args.state_dir / "token"
    prom = f", Prometheus {prom_url}" if prom_url else ""
    print(f"console  http://{args.host}:{args.port}  (controller {args.controller}, token "
          f"from {source}{prom})", flush=True)
    proc = subprocess.Popen(argv, env=env)
    stopping = False

    def forward(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, forward)
    try:
        proc.wait()
    except KeyboardInterrupt:  # the child got the same Ctrl-C from the terminal
        forward(signal.SIGINT, None)
    finally:
        signal.signal(signal.SIGTERM, previous)
        _reap(proc)
    return 0 if stopping else proc.returncode


def _reap(proc: subprocess.Popen[bytes], grace_s: float = 10.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
