"""``pdctl plan --recent``: the layout search on the requests a running controller recorded
(its real routes, through ``pdctl_api``'s client), with the controller's model, accelerator and
link as defaults and a simulated fleet's times in modelled seconds; and the input errors."""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from controller.api.state import AppState
from controller.cli import clients
from controller.cli.commands import main
from pdctl_api.client import PdctlClient
from tests.unit.api_app import app_state, record, through

__all__ = ["app_state"]  # the fixture

App = tuple[TestClient, AppState]


@pytest.fixture
def recorded(app_state: App, monkeypatch: pytest.MonkeyPatch) -> App:
    """The in-process controller with 30 more requests over the last minute (one refused),
    its simulated engines at 2 wall seconds per modelled second."""
    tc, st = app_state
    now = time.time()
    for k in range(30):
        rec = dataclasses.replace(record(100 + k), started_at=now - 60 + 2 * k,
                                  prompt_tokens=1500 + k, output_tokens=40)
        st.requests.add(dataclasses.replace(rec, status="rejected") if k == 7 else rec)
    monkeypatch.setattr(st.settings.sim, "time_scale", 2.0)

    def connect(args: argparse.Namespace) -> PdctlClient:
        assert args.token == st.token
        return PdctlClient(args.controller, args.token, actor=clients.CLI_ACTOR,
                           transport=through(tc))

    monkeypatch.setattr(clients, "connect", connect)
    return app_state


def test_the_recent_requests_are_planned_with_the_controllers_model(
        recorded: App, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, st = recorded
    out = tmp_path / "plan.json"
    code = main(["plan", "--recent", "--minutes", "5", "--budget", "8", "--tp", "2",
                 "--only", "colocated", "--token", st.token, "--json", str(out)])
    err = capsys.readouterr().err
    assert code in (0, 1), err
    result = json.loads(out.read_text())
    assert result["trace"] == "recent"
    assert result["requests"] == 5 + 29  # the refused one is not traffic
    assert (result["model"], result["accelerator"]) == (st.settings.model.name,
                                                        st.settings.hardware.accelerator)
    assert result["link"] == st.settings.hardware.kv_link
    # 58 wall seconds from the first of the 29 to the last at time scale 2: 29 modelled
    assert "planning for 34 requests over 0.5 min" in err
    assert result["layouts"] and all(c["layout"]["decode"]["tp"] == 2
                                     for c in result["layouts"])


def test_no_recent_requests_is_a_clear_error(recorded: App,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    _, st = recorded  # every request started more than 0.06 s ago
    code = main(["plan", "--recent", "--minutes", "0.001", "--budget", "8",
                 "--token", st.token])
    assert code == 2
    assert "recorded no requests in the last 0.001 min" in capsys.readouterr().err


def test_an_unreachable_controller_is_a_clear_error(capsys: pytest.CaptureFixture[str]
                                                    ) -> None:
    code = main(["plan", "--recent", "--budget", "8", "--token", "t",
                 "--controller", "http://127.0.0.1:9"])
    assert code == 2
    assert "pdctl plan: cannot reach the controller at http://127.0.0.1:9" in \
        capsys.readouterr().err


@pytest.mark.parametrize(("args", "message"), [
    (["--budget", "4"], "give a TRACE file or --recent"),
    (["t.jsonl", "--recent", "--budget", "4"], "give a TRACE file or --recent"),
    (["t.jsonl", "--budget", "4", "--model", "llama-3-8b"],
     "with a TRACE, --model and --accelerator are required"),
])
def test_trace_or_recent_one_of_them(args: list[str], message: str,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", *args]) == 2
    assert message in capsys.readouterr().err
