"""The report around the scenarios' results: number formatting, the raw-results JSON, the
machine and commit lines, and BENCHMARKS.md rendered from the parts that ran."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import os
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def fmt(x: float | None, spec: str = "7.2f") -> str:
    """``format(x, spec)``, or ``n/a`` (as wide) for None and NaN."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        width = len(format(0.0, spec)) if spec else 3
        return "n/a".rjust(width)
    return format(x, spec)


def ratio(a: float | None, b: float | None) -> float:
    """a / b, NaN when either is missing or b is 0."""
    if a is None or b is None or not b or math.isnan(a) or math.isnan(b):
        return math.nan
    return a / b


def jsonable(x: Any) -> Any:
    """Dataclasses as dicts, paths as strings, NaN and infinities as null (strict JSON)."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: jsonable(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, Path):
        return str(x)
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple | set):
        return [jsonable(v) for v in x]
    return x


def write_json(path: Path, result: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(jsonable(result), indent=1))


def finish(text: str, result: Any, path: Path, why: str | None) -> int:
    """The end of a part run alone (``python -m bench.<part>``): print its report, write its
    JSON, and exit 1 with ``why`` when its check found a problem, else 0."""
    import sys  # noqa: PLC0415

    print("\n" + text)
    write_json(path, result)
    print(f"results: {path}")
    if why:
        print(f"ERROR: {why}", file=sys.stderr)
        return 1
    return 0


def machine() -> list[str]:
    cpu = "unknown CPU"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        mem_kb = next(int(line.split()[1]) for line in f if line.startswith("MemTotal"))
    return [f"{os.cpu_count()} CPUs ({cpu}), {mem_kb / 2**20:.0f} GiB memory, no GPU",
            f"{platform.system()} {platform.release()}, Python {platform.python_version()}"]


def commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                         capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                           capture_output=True, text=True).stdout.strip()
    return out.stdout.strip() + (" (with uncommitted changes)" if dirty else "")


@dataclass
class PartRun:
    """One part of ``python -m bench`` as it ran: its report text, or why it failed."""

    number: int  # the part's place in ``python -m bench``'s order
    name: str
    title: str
    about: str
    module: str
    seconds: float
    text: str  # the report, or the end of the output of a failed part
    failed: str | None = None


def benchmarks_md(parts: list[PartRun], started: dt.datetime,
                  load: tuple[float, float, float], quick: bool) -> str:
    """BENCHMARKS.md, with a section per part that ran."""
    out = [
        "# Benchmarks",
        "",
        "Written by `make bench` (`python -m bench`); do not edit by hand -- rerun it.",
        "",
        f"- Run: {started:%Y-%m-%d %H:%M} UTC, commit {commit()}"
        + (" (`--quick`: smoke-test sizes, not figures to quote)" if quick else ""),
        *(f"- Machine: {m}" for m in machine()),
        f"- Load average when it started: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}",
        "- Reproduce: `make bench` (creates `.bench/venv-router` with vllm-router 0.1.17 and "
        "`.bench/venv-guidellm` with guidellm 0.8.1 on the CPU build of torch, writes the lab "
        "model, runs every part, rewrites this file). Whole output per part in "
        "`bench-results/<part>.log`, raw results in `bench-results/<part>.json`.",
        "- Two cores run the client, the router and every engine: latency and rate move with "
        "anything else on the machine; ratios come from runs interleaved in one session, and "
        "CPU time per request is the steadiest figure.",
        "- Every percentile and median is the controller's definition (numpy "
        "`inverted_cdf`, nearest rank; `bench/stats.py`); quantiles from Prometheus "
        "histograms are Prometheus's `histogram_quantile` estimate.",
        "",
    ]
    for part in parts:
        verdict = "finished" if part.failed is None else f"FAILED ({part.failed})"
        out += [f"## {part.number}. {part.title}", "", part.about, "",
                f"`python -m {part.module}`: {verdict} in {part.seconds / 60:.1f} min.", "",
                "```text", part.text.strip(), "```", ""]
    return "\n".join(out)
