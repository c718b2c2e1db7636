"""``pdctl plan`` from the command line: bad input is a clear error (exit 2) before any run;
a small trace gets a ranked table, the best layout's configuration and its JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from controller.cli.commands import main


def trace(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "t.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return path


def mooncake(n: int, gap_ms: int = 500) -> list[str]:
    return [json.dumps({"timestamp": i * gap_ms, "input_length": 600 + 10 * i,
                        "output_length": 8, "hash_ids": [0, 100 + i]}) for i in range(n)]


BASE = ["--model", "llama-3.1-8b", "--accelerator", "h100-sxm", "--context", "8192"]


@pytest.mark.parametrize(("args", "message"), [
    (["--model", "gpt-9", "--accelerator", "h100-sxm", "--budget", "4"],
     "no model profile 'gpt-9'; known: llama-3-8b"),
    (["--model", "llama-3.1-8b", "--accelerator", "tpu", "--budget", "4"],
     "no accelerator profile 'tpu'"),
    (["--model", "llama-3.1-405b", "--accelerator", "h100-sxm", "--budget", "64"],
     "no TP to try: TP 1: llama-3.1-405b at TP=1 needs"),
    (["--model", "llama-3.1-70b", "--accelerator", "h100-sxm", "--budget", "1",
      "--context", "8192"], "a budget of 1 accelerators holds no instance"),
    (BASE + ["--budget", "4", "--start-s", "99999"], "no requests between 99999 s"),
    (BASE + ["--budget", "1", "--only", "disaggregated"], "needs at least 2"),
])
def test_bad_input_is_a_clear_error_before_any_run(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str],
                                                   args: list[str], message: str) -> None:
    path = trace(tmp_path, mooncake(3))
    assert main(["plan", str(path), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "run " not in err


def test_a_trace_with_no_requests_is_refused(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = trace(tmp_path, [])
    assert main(["plan", str(path), *BASE, "--budget", "4"]) == 2
    assert "pdctl plan:" in capsys.readouterr().err


def test_a_small_trace_gets_layouts_best_first_and_the_best_configuration(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = trace(tmp_path, mooncake(40))
    out_json = tmp_path / "plan.json"
    code = main(["plan", str(path), *BASE, "--budget", "4", "--tp", "1",
                 "--json", str(out_json)])
    out, err = capsys.readouterr()
    assert code == 0
    assert "run   1:" in err and "planning for 40 requests" in err
    assert out.splitlines()[0].split()[:2] == ["#", "layout"]
    result = json.loads(out_json.read_text())
    best = result["best"]
    assert best["meets"] and best["layout"]["accelerators"] <= 4
    assert result["layouts"][0] == best
    lay = best["layout"]
    assert f"decode:  {{size: {lay['decode']['count']}, tp: 1}}" in out
    assert "best: " in out
