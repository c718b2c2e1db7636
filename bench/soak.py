"""``python -m bench.soak`` = ``python -m bench soak`` (``bench.scenarios``)."""
from bench.cli import run_alias

if __name__ == "__main__":
    raise SystemExit(run_alias("soak"))
