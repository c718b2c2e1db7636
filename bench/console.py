"""``python -m bench.console`` = ``python -m bench console`` (``bench.scenarios``)."""
from bench.cli import run_alias

if __name__ == "__main__":
    raise SystemExit(run_alias("console"))
