"""``python -m bench.measure_lab`` = ``python -m bench measure-lab`` (``bench.scenarios``)."""
from bench.cli import run_alias

if __name__ == "__main__":
    raise SystemExit(run_alias("measure-lab"))
