"""``python -m bench.scale`` = ``python -m bench scale`` (``bench.scenarios``)."""
from bench.cli import run_alias

if __name__ == "__main__":
    raise SystemExit(run_alias("scale"))
