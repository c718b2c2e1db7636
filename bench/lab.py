"""``python -m bench.lab`` = ``python -m bench lab`` (``bench.scenarios``)."""
from bench.cli import run_alias

if __name__ == "__main__":
    raise SystemExit(run_alias("lab"))
