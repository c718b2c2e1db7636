"""Where the console finds its controller and token, and how it is launched."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path

import pytest

from controller.cli import console as launch
from dashboard.config import ConsoleConfig, load_config


def test_defaults() -> None:
    cfg = load_config([], {})
    assert cfg.controller_url == "http://127.0.0.1:8080"
    assert cfg.token_path == Path(".pdctl/token")
    assert cfg.refresh_s == 2.0


def test_arguments_win_over_environment() -> None:
    env = {"PDCTL_URL": "http://env:1", "PDCTL_STATE_DIR": "/env", "PDCTL_TOKEN": "t",
           "PDCTL_CONSOLE_REFRESH_S": "1"}
    cfg = load_config(["--controller", "http://arg:2/", "--state-dir", "/arg"], env)
    assert (cfg.controller_url, cfg.state_dir) == ("http://arg:2", Path("/arg"))
    assert (cfg.env_token, cfg.refresh_s) == ("t", 1.0)
    cfg = load_config([], env)
    assert (cfg.controller_url, cfg.state_dir) == ("http://env:1", Path("/env"))


def test_bad_refresh_falls_back() -> None:
    assert load_config([], {"PDCTL_CONSOLE_REFRESH_S": "soon"}).refresh_s == 2.0
    assert load_config([], {"PDCTL_CONSOLE_REFRESH_S": "0.01"}).refresh_s == 0.5


def test_token_from_env_then_file(tmp_path: Path) -> None:
    cfg = ConsoleConfig(state_dir=tmp_path)
    assert cfg.token() == (None, str(tmp_path / "token"))
    (tmp_path / "token").write_text("abc\n")
    assert cfg.token() == ("abc", str(tmp_path / "token"))
    assert ConsoleConfig(state_dir=tmp_path, env_token="env").token()[0] == "env"


def test_the_app_is_found_without_importing_the_console() -> None:
    assert launch.APP == Path(__file__).resolve().parents[2] / "dashboard" / "app.py"


def test_streamlit_argv_and_env(tmp_path: Path) -> None:
    argv = launch.streamlit_argv("http://c:9", tmp_path, 8765, host="0.0.0.0")
    assert argv[:5] == [sys.executable, "-m", "streamlit", "run", str(launch.APP)]
    flags = dict(zip(argv[5:argv.index("--"):2], argv[6:argv.index("--"):2], strict=True))
    assert flags["--server.headless"] == "true"
    assert flags["--server.port"] == "8765" and flags["--server.address"] == "0.0.0.0"
    assert flags["--server.fileWatcherType"] == "none"
    assert flags["--browser.gatherUsageStats"] == "false"
    assert argv[argv.index("--") + 1:] == ["--controller", "http://c:9",
                                           "--state-dir", str(tmp_path)]
    env = launch.console_env("http://c:9", tmp_path)
    assert env["PDCTL_URL"] == "http://c:9" and env["PDCTL_STATE_DIR"] == str(tmp_path)
    # What the app reads back from them.
    cfg = load_config(argv[argv.index("--") + 1:], env)
    assert (cfg.controller_url, cfg.state_dir) == ("http://c:9", tmp_path)


def test_dashboard_subcommand(tmp_path: Path) -> None:
    p = argparse.ArgumentParser()
    launch.add_dashboard_parser(p.add_subparsers(dest="verb"))
    args = p.parse_args(["dashboard", "--controller", "http://c:9", "--state-dir",
                         str(tmp_path), "--port", "9999", "--host", "0.0.0.0"])
    assert args.run is launch.run_dashboard
    assert (args.controller, args.state_dir, args.port, args.host) == (
        "http://c:9", tmp_path, 9999, "0.0.0.0")
    defaults = p.parse_args(["dashboard"])
    assert defaults.port == 8501 and defaults.host == "127.0.0.1"


def test_run_dashboard_exits_0_and_stops_the_child_on_sigterm(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    marker = tmp_path / "child-stopped"
    child = ("import signal, sys, time, pathlib\n"
             "def stop(*_):\n"
             f"    pathlib.Path({str(marker)!r}).write_text('x'); sys.exit(0)\n"
             "signal.signal(signal.SIGTERM, stop)\n"
             "time.sleep(30)\n")
    monkeypatch.setattr(launch, "streamlit_argv",
                        lambda *a, **k: [sys.executable, "-c", child])
    args = argparse.Namespace(controller="http://c:9", state_dir=tmp_path, port=1, host="h")
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    try:
        assert launch.run_dashboard(args) == 0
    finally:
        timer.cancel()
    assert marker.exists()


def test_run_dashboard_reports_a_failed_start(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launch, "streamlit_argv",
                        lambda *a, **k: [sys.executable, "-c", "raise SystemExit(3)"])
    args = argparse.Namespace(controller="http://c:9", state_dir=tmp_path, port=1, host="h")
    assert launch.run_dashboard(args) == 3
