"""``python -m bench.planner`` = ``python -m bench planner`` (``bench.scenarios``)."""
from bench.cli import run_alias

if __name__ == "__main__":
    raise SystemExit(run_alias("planner"))
