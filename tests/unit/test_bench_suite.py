"""``python -m bench --only PART`` rewrites PART's section of BENCHMARKS.md and keeps the
others as an earlier run wrote them, in the suite's order."""

from __future__ import annotations

import datetime as dt

from bench.suite import PartRun, benchmarks_md, earlier_sections

EARLIER = """# Benchmarks

- Run: 2026-12-02 02:39 UTC, commit 4a8725a

## 1. Router cost

old router text

## 2. Lab

old lab text
"""


def test_only_one_part_keeps_the_others_sections_in_order() -> None:
    run_line, sections = earlier_sections(EARLIER)
    assert run_line == "2026-12-02 02:39 UTC, commit 4a8725a"
    assert sections["Lab"] == ["", "old lab text"]
    ran = PartRun(2, "cache", "Cache", "about cache", "bench.cache", 60.0, "new cache text")
    kept = {"Router cost": (1, sections["Router cost"]), "Lab": (3, sections["Lab"])}
    md = benchmarks_md([ran], dt.datetime(2026, 12, 3, 17, 0), (0.0, 0.0, 0.0), False, kept,
                       run_line)
    headings = [line for line in md.splitlines() if line.startswith("## ")]
    assert headings == ["## 1. Router cost", "## 2. Cache", "## 3. Lab"]
    assert "old router text" in md and "old lab text" in md and "new cache text" in md
    assert "parts 2 only: the others are kept from the run of 2026-12-02 02:39 UTC" in md
    assert "finished in 1.0 min (run 2026-12-03 17:00 UTC)." in md
