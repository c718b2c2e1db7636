"""``python -m bench.handoff`` = ``python -m bench handoff`` (``bench.scenarios``)."""
from bench.cli import run_alias

if __name__ == "__main__":
    raise SystemExit(run_alias("handoff"))
