"""``python -m bench.cache`` = ``python -m bench cache`` (``bench.scenarios``)."""
from bench.cli import run_alias

if __name__ == "__main__":
    raise SystemExit(run_alias("cache"))
