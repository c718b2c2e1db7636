"""``python -m bench.ray_start`` = ``python -m bench ray`` (``bench.scenarios``)."""
from bench.cli import run_alias

if __name__ == "__main__":
    raise SystemExit(run_alias("ray"))
