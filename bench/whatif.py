"""``python -m bench.whatif`` = ``python -m bench whatif`` (``bench.scenarios``)."""
from bench.cli import run_alias

if __name__ == "__main__":
    raise SystemExit(run_alias("whatif"))
