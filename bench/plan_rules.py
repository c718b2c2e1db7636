"""``python -m bench.plan_rules`` = ``python -m bench plan-rules`` (``bench.scenarios``)."""
from bench.cli import run_alias

if __name__ == "__main__":
    raise SystemExit(run_alias("plan-rules"))
