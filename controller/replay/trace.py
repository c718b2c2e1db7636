"""Request traces, read and checked whole before anything is sent.

Two formats, told apart by the file's first non-empty line:

- Mooncake JSONL (FAST'25 release): one JSON object a line with ``timestamp`` (ms from the
  trace's start), ``input_length``, ``output_length`` and ``hash_ids`` (one id per 512-token
  prompt block; equal ids at the same position are a shared prefix).
- Azure LLM inference CSV (2023/2024 releases): a header with ``TIMESTAMP`` (wall clock),
  ``ContextTokens`` and ``GeneratedTokens``. No prefix information: each request gets block
  ids of its own, so no two share a block.

Every problem is a ``TraceError`` naming ``file:line`` and what is wrong.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, Protocol

BLOCK_TOKENS = 512  # the Mooncake trace's hash block
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
TraceFormat = Literal["mooncake", "azure"]


class TraceError(ValueError):
    """A trace that cannot be replayed; the message starts with ``file:line:``."""


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace: when (seconds from the trace's first request) and how long."""

    line: int  # 1-based line of the file
    time_s: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]  # one per 512-token block of the prompt, the last one partial


@dataclass(frozen=True, slots=True)
class Trace:
    path: Path
    format: TraceFormat
    requests: tuple[TraceRequest, ...]  # in time order (stable: file order among equals)

    @property
    def span_s(self) -> float:
        return self.requests[-1].time_s if self.requests else 0.0

    @property
    def shares_prefixes(self) -> bool:
        return self.format == "mooncake"


def blocks_for(tokens: int) -> int:
    return math.ceil(tokens / BLOCK_TOKENS)


def _is_integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _length(where: str, name: str, value: Any) -> int:
    if value is None:
        raise TraceError(f"{where}: {name} is missing")
    if not _is_integer(value):
        raise TraceError(f"{where}: {name} must be an integer, got {value!r}")
    if value < 1:
        raise TraceError(f"{where}: {name} must be at least 1, got {value}")
    return int(value)


def _mooncake_line(where: str, lineno: int, text: str) -> TraceRequest:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise TraceError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    missing = [k for k in MOONCAKE_FIELDS if k not in obj]
    if missing:
        raise TraceError(f"{where}: {', '.join(missing)} missing")
    stamp = obj["timestamp"]
    if not (isinstance(stamp, int | float) and not isinstance(stamp, bool)
            and math.isfinite(stamp) and stamp >= 0):
        raise TraceError(f"{where}: timestamp must be a number of ms at least 0, got {stamp!r}")
    inp = _length(where, "input_length", obj["input_length"])
    out = _length(where, "output_length", obj["output_length"])
    ids = obj["hash_ids"]
    if not isinstance(ids, list) or not all(_is_integer(i) and i >= 0 for i in ids):
        raise TraceError(f"{where}: hash_ids must be a list of non-negative integers")
    if len(ids) != blocks_for(inp):
        raise TraceError(f"{where}: {len(ids)} hash_ids but input_length {inp} makes "
                         f"{blocks_for(inp)} blocks of {BLOCK_TOKENS} tokens")
    return TraceRequest(lineno, stamp / 1e3, inp, out, tuple(ids))


def _read_mooncake(path: Path, lines: list[str]) -> list[TraceRequest]:
    out = []
    for lineno, text in enumerate(lines, 1):
        if text.strip():
            out.append(_mooncake_line(f"{path}:{lineno}", lineno, text))
    return out


def _wall_clock(where: str, text: str) -> datetime:
    try:
        return datetime.fromisoformat(text.strip())
    except ValueError:
        raise TraceError(f"{where}: TIMESTAMP {text!r} is not a date and time "
                         "(e.g. 2023-11-16 18:15:46.680590)") from None


def _csv_int(where: str, name: str, text: str) -> int:
    text = text.strip()
    if not text:
        raise TraceError(f"{where}: {name} is missing")
    try:
        value = int(text)
    except ValueError:
        raise TraceError(f"{where}: {name} must be an integer, got {text!r}") from None
    return _length(where, name, value)


def _read_azure(path: Path, lines: list[str], skipped: int) -> list[TraceRequest]:
    """``lines`` from the header on; ``skipped``: the blank lines before it."""
    reader = csv.reader(lines)
    header = [h.strip() for h in next(reader)]
    col = {c: header.index(c) for c in AZURE_COLUMNS}
    rows: list[tuple[int, datetime, int, int]] = []
    for cells in reader:
        lineno = reader.line_num + skipped
        where = f"{path}:{lineno}"
        if not cells or not any(c.strip() for c in cells):
            continue
        if len(cells) != len(header):
            raise TraceError(f"{where}: {len(cells)} fields, the header has {len(header)}")
        stamp = _wall_clock(where, cells[col["TIMESTAMP"]])
        if rows and (stamp.tzinfo is None) != (rows[0][1].tzinfo is None):
            raise TraceError(f"{where}: TIMESTAMP mixes time zones with line {rows[0][0]}")
        rows.append((lineno, stamp,
                     _csv_int(where, "ContextTokens", cells[col["ContextTokens"]]),
                     _csv_int(where, "GeneratedTokens", cells[col["GeneratedTokens"]])))
    if not rows:
        return []
    first = min(r[1] for r in rows)
    return unshared([(lineno, (stamp - first).total_seconds(), inp, gen)
                     for lineno, stamp, inp, gen in rows])


class Recorded(Protocol):
    """A request as the controller recorded it (``RequestRecord``, or the API's view)."""

    started_at: float
    status: str
    prompt_tokens: int
    output_tokens: int


def from_records(records: Iterable[Recorded], time_scale: float = 1.0) -> list[TraceRequest]:
    """The traffic the controller saw: every recorded request but refused ones, at its start
    time (wall seconds / ``time_scale``: a simulated fleet's modelled time) and lengths, with
    no prefix information."""
    kept = sorted((r for r in records if r.status != "rejected"), key=lambda r: r.started_at)
    if not kept:
        return []
    t0 = kept[0].started_at
    return unshared([(i + 1, (r.started_at - t0) / time_scale, max(1, r.prompt_tokens),
                      max(1, r.output_tokens)) for i, r in enumerate(kept)])


def unshared(rows: list[tuple[int, float, int, int]]) -> list[TraceRequest]:
    """Requests (line, seconds from the first, prompt tokens, output tokens) that share no
    prefix: each gets block ids of its own (a trace with no prefix information)."""
    out, next_id = [], 0
    for lineno, time_s, inp, gen in rows:
        n = blocks_for(inp)
        out.append(TraceRequest(lineno, time_s, inp, gen, tuple(range(next_id, next_id + n))))
        next_id += n
    return out


def detect_format(path: Path, first_line: str, lineno: int) -> TraceFormat:
    text = first_line.strip()
    if text.startswith("{"):
        return "mooncake"
    header = {h.strip() for h in text.split(",")}
    if all(c in header for c in AZURE_COLUMNS):
        return "azure"
    raise TraceError(
        f"{path}:{lineno}: unknown trace format: expected Mooncake JSONL (a JSON object with "
        f"{', '.join(MOONCAKE_FIELDS)}) or an Azure LLM CSV header "
        f"({','.join(AZURE_COLUMNS)}), got {text[:60]!r}")


def load_trace(path: Path) -> Trace:
    """The whole trace, checked line by line, in time order, times from its first request;
    raises ``TraceError`` (file:line: what is wrong)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TraceError(f"{path}: cannot read the trace: {e}") from None
    lines = text.splitlines()
    first = next(((i, t) for i, t in enumerate(lines, 1) if t.strip()), None)
    if first is None:
        raise TraceError(f"{path}:1: the trace is empty")
    fmt = detect_format(path, first[1], first[0])
    if fmt == "mooncake":
        requests = _read_mooncake(path, lines)
    else:
        requests = _read_azure(path, lines[first[0] - 1:], first[0] - 1)
    if not requests:
        raise TraceError(f"{path}:{first[0]}: the trace has no requests")
    start = min(r.time_s for r in requests)
    ordered = sorted(requests, key=lambda r: r.time_s)  # stable: file order among equals
    return Trace(path, fmt, tuple(
        TraceRequest(r.line, r.time_s - start, r.input_length, r.output_length, r.hash_ids)
        for r in ordered))
