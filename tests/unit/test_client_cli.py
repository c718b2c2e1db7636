"""``pdctl status|scale|tp|route`` through ``pdctl_api``'s client against the real routes of an
in-process controller: what they print, what they change, how they fail."""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from controller.api.app import ensure_token
from controller.api.state import AppState
from controller.cli import clients
from controller.cli import commands as cli
from controller.models import Role
from pdctl_api.client import PdctlClient
from tests.unit.api_app import app_state, through

__all__ = ["app_state"]  # the fixture

App = tuple[TestClient, AppState]
Pdctl = Callable[..., tuple[int, str, str]]


@pytest.fixture
def pdctl(app_state: App, monkeypatch: pytest.MonkeyPatch,
          capsys: pytest.CaptureFixture[str]) -> Pdctl:
    """``pdctl(*argv) -> (exit status, stdout, stderr)`` against the in-process controller."""
    tc, st = app_state

    def connect(args: argparse.Namespace) -> PdctlClient:
        assert args.token == st.token
        return PdctlClient(args.controller, args.token, actor=clients.CLI_ACTOR,
                           transport=through(tc))

    monkeypatch.setattr(clients, "connect", connect)

    def run(*argv: str) -> tuple[int, str, str]:
        code = cli.main([*argv, "--token", st.token])
        out = capsys.readouterr()
        return code, out.out, out.err

    return run


def test_status(pdctl: Pdctl, app_state: App) -> None:
    code, out, _ = pdctl("status")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("model llama-3-70b  backend")
    assert lines[2].startswith("decode   desired 1 x TP2  ready 1 starting 0 draining 0  "
                               "converged")
    assert lines[4].split()[:4] == ["prefill-1", "prefill", "ready", "4"]
    assert lines[-1].startswith("routing: disaggregate prompts >= 512 tokens; prefill "
                                "round_robin, decode least_loaded")
    assert lines[3].split()[-1] == "URL" and "NODE" not in lines[3]  # local processes
    code, out, _ = pdctl("status", "--json")
    assert json.loads(out)["pools"]["decode"]["desired"] == {"size": 1, "tp": 2,
                                                             "kv_mode": "pull"}


def test_status_names_the_node_of_engines_on_ray(pdctl: Pdctl, app_state: App) -> None:
    _, st = app_state
    for inst in st.fleet.registry:
        inst.node = "10.0.0.7"
    _, out, _ = pdctl("status")
    lines = out.splitlines()
    assert lines[3].split()[-2:] == ["NODE", "URL"]
    assert lines[4].split()[-2] == "10.0.0.7"


def test_scale_dry_run_then_scale(pdctl: Pdctl, app_state: App) -> None:
    _, st = app_state
    code, out, _ = pdctl("scale", "decode", "3", "--dry-run")
    assert code == 0 and st.fleet.targets[Role.DECODE].size == 1
    assert out.splitlines() == [
        "decode: would set desired 3 x TP2 (dry run, nothing changed)",
        "  next step: start decode at TP2: decode pool below size (1/3)",
        "  next step: start decode at TP2: decode pool below size (1/3)"]
    code, out, _ = pdctl("scale", "decode", "3", "--dry-run", "--json")
    assert [a["kind"] for a in json.loads(out)["actions"]] == ["start", "start"]
    code, out, _ = pdctl("scale", "decode", "3")
    assert (code, out) == (0, "decode: desired 3 x TP2\n")
    assert st.fleet.targets[Role.DECODE].size == 3
    assert st.store.events(1)[0]["actor"] == "pdctl-cli"


def test_scale_wait_gives_up_after_the_timeout(pdctl: Pdctl) -> None:
    code, out, err = pdctl("scale", "decode", "2", "--wait", "--timeout", "0")
    assert (code, out) == (1, "decode: desired 2 x TP2\n") and "not converged after 0 s" in err


def test_refused_change_prints_the_reason(pdctl: Pdctl, app_state: App) -> None:
    code, _, err = pdctl("tp", "decode", "3")
    assert code == 1
    assert err == "pdctl tp: 422: TP 3 does not divide llama-3-70b's 64 attention heads\n"
    code, _, err = pdctl("tp", "decode", "3", "--dry-run")
    assert code == 1 and "does not divide" in err
    assert app_state[1].fleet.targets[Role.DECODE].tp == 2


def test_route(pdctl: Pdctl, app_state: App) -> None:
    code, out, _ = pdctl("route")
    assert code == 0 and json.loads(out)["max_attempts"] == 3
    code, out, _ = pdctl("route", "disagg_min_prompt_tokens=300", "decode_policy=round_robin")
    assert code == 0 and '"disagg_min_prompt_tokens": 300' in out
    assert app_state[1].table.settings.decode_policy == "round_robin"
    code, _, err = pdctl("route", "decode_policy=random")
    assert code == 1 and err.startswith("pdctl route: 422: decode_policy: Input should be")
    code, _, err = pdctl("route", "oops")
    assert (code, err) == (1, "pdctl route: expected KEY=VALUE, got 'oops'\n")


def test_no_token_and_unreachable_controller(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["status", "--state-dir", str(tmp_path), "--token", ""]) == 1
    assert "no API token: pass --token, set PDCTL_TOKEN" in capsys.readouterr().err
    assert cli.main(["status", "--token", "t", "--controller", "http://127.0.0.1:9"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("pdctl status: cannot reach the controller at http://127.0.0.1:9: "
                          "ConnectError")


def test_a_generated_token_is_never_read_as_an_option(tmp_path: Path) -> None:
    """CI once drew a url-safe token starting with ``-``: ``--token -va3…`` failed to parse."""
    for n in range(64):
        token = ensure_token(tmp_path / str(n))
        assert re.fullmatch(r"[0-9a-f]{64}", token)
        args = cli.build_parser().parse_args(["status", "--token", token])
        assert args.token == token
    assert oct((tmp_path / "0" / "token").stat().st_mode & 0o777) == "0o600"
    assert ensure_token(tmp_path / "0") == (tmp_path / "0" / "token").read_text().strip()


def test_version_is_the_installed_packages(capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.metadata

    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"pdctl {importlib.metadata.version('pdctl')}"
