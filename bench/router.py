"""``python -m bench.router`` = ``python -m bench router`` (``bench.scenarios``)."""
from bench.cli import run_alias

if __name__ == "__main__":
    raise SystemExit(run_alias("router"))
