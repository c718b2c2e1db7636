"""``python -m bench.planner_rehearse`` = ``python -m bench planner-rehearse``
(``bench.scenarios``)."""
from bench.cli import run_alias

if __name__ == "__main__":
    raise SystemExit(run_alias("planner-rehearse"))
