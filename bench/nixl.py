"""``python -m bench.nixl`` = ``python -m bench nixl`` (``bench.scenarios``)."""
from bench.cli import run_alias

if __name__ == "__main__":
    raise SystemExit(run_alias("nixl"))
