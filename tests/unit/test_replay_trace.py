"""``pdctl replay``'s trace readers: both formats on the real traces in ``../shared/traces``
(read from there, never copied), and every bad input named by its line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.report import traces_dir
from controller.replay.trace import BLOCK_TOKENS, TraceError, load_trace

TRACES = traces_dir()
MOONCAKE = TRACES / "mooncake_conversation.jsonl"
AZURE = TRACES / "azure_llm_2023_conv.csv"
needs_traces = pytest.mark.skipif(not MOONCAKE.is_file() or not AZURE.is_file(),
                                  reason=f"the shared traces are not in {TRACES}")


@needs_traces
def test_mooncake_trace_reads_whole() -> None:
    t = load_trace(MOONCAKE)
    assert t.format == "mooncake" and t.shares_prefixes
    assert len(t.requests) == 12031  # the README's count
    first = t.requests[0]
    assert (first.line, first.time_s, first.input_length, first.output_length) == (
        1, 0.0, 6758, 500)
    assert first.hash_ids == tuple(range(14))
    assert 58 * 60 < t.span_s < 60 * 60  # 59 minutes
    mean_in = sum(r.input_length for r in t.requests) / len(t.requests)
    assert round(mean_in) == 12035
    assert all(len(r.hash_ids) == -(-r.input_length // BLOCK_TOKENS) for r in t.requests)
    assert [r.time_s for r in t.requests] == sorted(r.time_s for r in t.requests)


@needs_traces
def test_azure_trace_reads_whole_and_shares_nothing() -> None:
    t = load_trace(AZURE)
    assert t.format == "azure" and not t.shares_prefixes
    assert len(t.requests) == 19366
    first, second = t.requests[0], t.requests[1]
    assert (first.line, first.time_s, first.input_length, first.output_length) == (
        2, 0.0, 374, 44)
    assert second.line == 3 and second.time_s == pytest.approx(4.314579)
    assert 58 * 60 < t.span_s <= 60 * 60  # "1 h": 58.4 minutes
    ids = [i for r in t.requests for i in r.hash_ids]
    assert len(ids) == len(set(ids))  # no block shared between requests


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


GOOD = {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}


def _jsonl(*objs: object) -> str:
    return "".join((o if isinstance(o, str) else json.dumps(o)) + "\n" for o in objs)


@pytest.mark.parametrize(("line", "expected"), [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
    ({**GOOD, "input_length": -5}, "input_length must be at least 1, got -5"),
    ({**GOOD, "output_length": -1}, "output_length must be at least 1, got -1"),
    ({k: v for k, v in GOOD.items() if k != "output_length"}, "output_length missing"),
    ({**GOOD, "input_length": None}, "input_length is missing"),
    ({**GOOD, "input_length": "600"}, "input_length must be an integer"),
    ({**GOOD, "input_length": True}, "input_length must be an integer"),
    ({**GOOD, "timestamp": -3}, "timestamp must be a number of ms at least 0"),
    ({**GOOD, "hash_ids": [1, "x"]}, "hash_ids must be a list of non-negative integers"),
    ({**GOOD, "hash_ids": [1]}, "1 hash_ids but input_length 600 makes 2 blocks"),
])
def test_a_bad_mooncake_line_is_named(tmp_path: Path, line: object, expected: str) -> None:
    path = _write(tmp_path, "t.jsonl", _jsonl(GOOD, GOOD, line, GOOD))
    with pytest.raises(TraceError) as e:
        load_trace(path)
    assert str(e.value).startswith(f"{path}:3: ")
    assert expected in str(e.value)


HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
ROW = "2023-11-16 18:15:46.6805900,374,44\n"


@pytest.mark.parametrize(("line", "expected"), [
    ("2023-11-16 18:15:47.1,-3,44", "ContextTokens must be at least 1, got -3"),
    ("2023-11-16 18:15:47.1,374,", "GeneratedTokens is missing"),
    ("2023-11-16 18:15:47.1,abc,4", "ContextTokens must be an integer, got 'abc'"),
    ("yesterday,374,44", "TIMESTAMP 'yesterday' is not a date and time"),
    ("2023-11-16 18:15:47.1,374", "2 fields, the header has 3"),
])
def test_a_bad_azure_line_is_named(tmp_path: Path, line: str, expected: str) -> None:
    path = _write(tmp_path, "t.csv", HEADER + ROW + ROW + line + "\n" + ROW)
    with pytest.raises(TraceError) as e:
        load_trace(path)
    assert str(e.value).startswith(f"{path}:4: ")
    assert expected in str(e.value)


@pytest.mark.parametrize(("text", "line", "expected"), [
    ("\n\nhello,world\n1,2\n", 3, "unknown trace format"),
    ("", 1, "the trace is empty"),
    (HEADER, 1, "the trace has no requests"),
])
def test_unknown_or_empty_traces_are_named(tmp_path: Path, text: str, line: int,
                                           expected: str) -> None:
    path = _write(tmp_path, "t.txt", text)
    with pytest.raises(TraceError) as e:
        load_trace(path)
    assert str(e.value).startswith(f"{path}:{line}: ")
    assert expected in str(e.value)


def test_a_missing_file_is_an_error_not_a_traceback(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot read the trace"):
        load_trace(tmp_path / "nope.jsonl")


def test_times_are_from_the_first_request_in_time_order(tmp_path: Path) -> None:
    path = _write(tmp_path, "t.csv", HEADER + "2023-11-16 18:00:05,10,1\n"
                  "2023-11-16 18:00:02,20,1\n2023-11-16 18:00:02,30,1\n")
    t = load_trace(path)
    assert [(r.line, r.time_s, r.input_length) for r in t.requests] == [
        (3, 0.0, 20), (4, 0.0, 30), (2, 3.0, 10)]
    assert t.span_s == 3.0
