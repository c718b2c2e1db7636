"""The scenarios' results as text and JSON: number formatting, ratios, the raw-results JSON
(strict: NaN as null) and the lines that describe this machine."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import platform
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "bench-results"  # every scenario's JSON and log (git-ignored)


def traces_dir() -> Path:
    """The shared production traces: ``$PDCTL_TRACES_DIR``, else ``../shared/traces`` beside
    the checkout, else the workplace's ``/work/shared/traces`` (a clone made elsewhere, as
    CI's may be); the first that holds the Mooncake trace (else the first place)."""
    places = [Path(os.environ["PDCTL_TRACES_DIR"])] if os.environ.get("PDCTL_TRACES_DIR") \
        else []
    places += [ROOT.parent / "shared" / "traces", Path("/work/shared/traces")]
    return next((p for p in places if (p / "mooncake_conversation.jsonl").is_file()), places[0])


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


def machine_lines() -> list[str]:
    """This machine in two lines: CPUs and memory, then the OS and Python."""
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
