"""``pdctl replay``'s summaries from a table of results, the sender against a fake data plane,
and the command's refusals before anything is sent."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from controller.cli import replay as replay_cli
from controller.cli.commands import build_parser, main
from controller.cli.replay_send import Planned, reason_of, send_trace
from controller.replay.prompts import fit_context
from controller.replay.schedule import Slice
from controller.replay.summary import NO_CACHE_REPORT, ReplayRow, by_class, class_of, render
from controller.replay.trace import TraceRequest


def _row(i: int, inp: int, ok: bool = True, ttft: float = 100.0, gap: float | None = 20.0,
         e2e: float = 500.0, reason: str | None = None, cached: int | None = None) -> ReplayRow:
    return ReplayRow(i, i + 1, float(i), float(i), inp, min(inp, 8000), 10, inp > 8000, ok=ok,
               reason=None if ok else reason, ttft_ms=ttft if ok else None,
               gap_p99_ms=gap if ok else None, e2e_ms=e2e if ok else None,
               cached_tokens=cached)


def test_classes_by_prompt_tokens() -> None:
    assert [class_of(n) for n in (1, 2047, 2048, 8191, 8192, 32767, 32768, 10**6)] == [
        "<2k", "<2k", "2k-8k", "2k-8k", "8k-32k", "8k-32k", ">=32k", ">=32k"]


ROWS = [
    _row(0, 1000, ttft=100), _row(1, 1500, ttft=300), _row(2, 1800, ttft=2500),
    _row(3, 3000, ttft=200, gap=80), _row(4, 5000, ok=False, reason="http 400: too long"),
    _row(5, 9000, ttft=400, gap=None), _row(6, 40000, ok=False, reason="timeout"),
    _row(7, 50000, ok=False, reason="http 400: too long"),
]


def test_summary_from_a_table() -> None:
    s = by_class(ROWS, ttft_ms=1000, gap_ms=60, wall_s=10.0)
    assert list(s) == ["<2k", "2k-8k", "8k-32k", ">=32k", "all"]
    small = s["<2k"]
    assert (small["requests"], small["ok"], small["failed"]) == (3, 3, 0)
    assert small["ttft_ms"] == {"p50": 300.0, "p90": 2500.0, "p99": 2500.0}  # nearest rank
    assert small["goodput"] == {"requests": 2, "share": round(2 / 3, 4), "per_s": 0.2}
    mid = s["2k-8k"]
    assert (mid["ok"], mid["failed"], mid["goodput"]["requests"]) == (1, 1, 0)  # gap 80 > 60
    assert mid["failed_by_reason"] == {"http 400: too long": 1}
    assert s["8k-32k"]["goodput"]["requests"] == 1  # no gaps: meets the gap target
    assert s["8k-32k"]["clamped"] == 1
    every = s["all"]
    assert (every["requests"], every["ok"], every["failed"]) == (8, 5, 3)
    assert every["failed_by_reason"] == {"http 400: too long": 2, "timeout": 1}
    assert every["gap_p99_ms"] == 80.0
    assert every["e2e_ms"] == {"p50": 500.0, "p99": 500.0}
    assert every["goodput"]["requests"] == 3 and every["goodput"]["per_s"] == 0.3
    assert every["cache_hit_rate"] is None
    text = render(s, 1000, 60)
    assert "failed: 2 x http 400: too long" in text and "failed: 1 x timeout" in text
    assert "goodput (TTFT <= 1000 ms and own gap p99 <= 60 ms): 3 of 8, 0.30 req/s" in text
    assert NO_CACHE_REPORT in text


def test_cache_hit_rate_from_the_engines_report() -> None:
    rows = [_row(0, 1000, cached=500), _row(1, 3000, cached=0), _row(2, 1000)]
    s = by_class(rows, 1000, 60)["all"]
    assert s["cache_hit_rate"] == 0.125 and s["cache_reported_by"] == 2
    assert "12.5% of the prompt tokens (2 requests reported)" in render(by_class(rows, 1000, 60),
                                                                         1000, 60)


def test_empty_classes_render() -> None:
    text = render(by_class([], 1000, 60), 1000, 60)
    assert "0 of 0" in text


def test_reasons_mask_numbers_so_alike_failures_count_together() -> None:
    body = json.dumps({"error": {"message": "maximum context length is 8192 tokens; this "
                                            "request needs 12000"}}).encode()
    reason, detail = reason_of(400, body)
    assert reason == "http 400: maximum context length is N tokens; this request needs N"
    assert "12000" in detail
    assert reason_of(502, b"bad gateway")[0] == "http 502: bad gateway"


def _sse(*events: Any) -> bytes:
    return b"".join(b"data: " + (e if isinstance(e, bytes) else json.dumps(e).encode())
                    + b"\n\n" for e in events)


def _handler(request: httpx.Request) -> httpx.Response:
    if request.url.path == "/v1/models":
        return httpx.Response(200, json={"data": [{"id": "m", "max_model_len": 4096}]})
    body = json.loads(request.content)
    assert body["stream"] and body["stream_options"] == {"include_usage": True}
    assert body["ignore_eos"] and body["model"] == "m"
    prompt, n = body["prompt"], body["max_tokens"]
    assert all(isinstance(t, int) for t in prompt)
    if len(prompt) == 700:
        return httpx.Response(400, json={"error": {"message": "too long: 700"}})
    if len(prompt) == 800:
        return httpx.Response(200, content=_sse({"choices": [{"text": "a"}]}))  # no [DONE]
    chunks = [{"choices": [{"text": "x"}]} for _ in range(n)]
    usage = {"choices": [], "usage": {"prompt_tokens": len(prompt), "completion_tokens": n,
                                      "prompt_tokens_details": {"cached_tokens": 512}}}
    return httpx.Response(200, headers={"x-request-id": f"r{len(prompt)}"},
                          content=_sse(*chunks, usage, b"[DONE]"))


def test_the_sender_measures_each_request_and_names_failures() -> None:
    reqs = [TraceRequest(i + 1, 0.01 * i, n, 4, tuple(range(-(-n // 512))))
            for i, n in enumerate([600, 700, 800, 900])]
    plan = [Planned(r, fit_context(r, 4096), 0.01 * i) for i, r in enumerate(reqs)]
    out = io.StringIO()

    def client(**kw: Any) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.MockTransport(_handler), **kw)

    got = asyncio.run(send_trace("http://x", "m", plan, Slice(0, None), asyncio.Event(),
                             progress_out=out, make_client=client))
    rows = {r.prompt_tokens: r for r in got.rows}
    assert got.not_sent == 0 and len(got.rows) == 4
    ok = rows[600]
    assert ok.ok and ok.output_chunks == 4 and ok.gaps == 3 and ok.completion_tokens == 4
    assert ok.cached_tokens == 512 and ok.request_id == "r600" and ok.ttft_ms is not None
    assert (rows[700].ok, rows[700].reason, rows[700].detail) == (
        False, "http 400: too long: N", "too long: 700")
    assert (rows[800].ok, rows[800].reason) == (False, "stream ended early")
    assert rows[900].ok
    assert "sent 4/4  finished 2  failed 2" in out.getvalue()


def test_a_stop_ends_sending_and_counts_what_was_not_sent() -> None:
    reqs = [TraceRequest(i + 1, float(i), 600, 4, (0, 1)) for i in range(3)]
    plan = [Planned(r, fit_context(r, None), 10.0 * i) for i, r in enumerate(reqs)]
    stop = asyncio.Event()

    def client(**kw: Any) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.MockTransport(_handler), **kw)

    async def go() -> Any:
        asyncio.get_running_loop().call_later(0.3, stop.set)
        return await send_trace("http://x", "m", plan, Slice(0, None), stop,
                            progress_out=io.StringIO(), make_client=client)

    got = asyncio.run(go())
    assert got.interrupted and len(got.rows) == 1 and got.not_sent == 2
    assert got.rows[0].ok


@pytest.mark.parametrize(("text", "expected"), [
    ('{"timestamp": 0, "input_length": -4, "output_length": 3, "hash_ids": [1]}\n',
     ":1: input_length must be at least 1, got -4"),
    ("what,is,this\n", ":1: unknown trace format"),
])
def test_bad_traces_exit_non_zero_before_anything_is_sent(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        text: str, expected: str) -> None:
    def never(url: str) -> None:
        raise AssertionError("the controller was asked")

    monkeypatch.setattr(replay_cli, "_served", never)
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    assert main(["replay", str(path), "--controller", "http://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"pdctl replay: {path}") and expected in err
    assert "Traceback" not in err


def test_help_names_the_flags_and_gives_an_example() -> None:
    sub = next(a for a in build_parser()._actions if a.dest == "verb")
    text = sub.choices["replay"].format_help()  # type: ignore[attr-defined]
    for flag in ("--controller", "--time-scale", "--rate-scale", "--limit", "--start-s",
                 "--ttft-ms", "--gap-ms", "--json", "--no-clamp", "example:"):
        assert flag in text


def test_an_empty_slice_and_an_unreachable_controller_are_clear_errors(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 4, "output_length": 3, "hash_ids": [1]}\n'
                    '{"timestamp": 2000, "input_length": 4, "output_length": 3, '
                    '"hash_ids": [1]}\n')
    assert main(["replay", str(path), "--start-s", "5", "--controller", "http://127.0.0.1:9"]) == 2
    assert "no request at or after 5 s (the trace spans 2.0 s)" in capsys.readouterr().err
    assert main(["replay", str(path), "--controller", "http://127.0.0.1:9"]) == 1
    err = capsys.readouterr().err
    assert "cannot read the model from http://127.0.0.1:9/v1/models" in err
    assert "Traceback" not in err


def test_the_send_lag_says_whether_the_client_kept_pace() -> None:
    rows = [_row(0, 1000), _row(1, 1000), _row(2, 1000)]
    for r, late in zip(rows, (0.001, 0.0, 0.25), strict=True):
        r.sent_s = r.due_s + late
    rows[1].sent_s = rows[1].due_s - 0.01  # early counts as on time
    s = by_class(rows, 1000, 60)
    assert s["all"]["send_lag_ms"] == {"p99": 250.0, "max": 250.0}
    assert "sent behind the trace's schedule: p99 250 ms, max 250 ms" in render(s, 1000, 60)
