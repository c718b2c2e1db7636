"""``python -m bench.plan_check`` = ``python -m bench plan-check`` (``bench.scenarios``)."""
from bench.cli import run_alias

if __name__ == "__main__":
    raise SystemExit(run_alias("plan-check"))
