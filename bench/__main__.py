"""``python -m bench`` (``make bench``): the suite, or one scenario (``bench.cli``)."""

import sys

from bench.cli import run_command

if __name__ == "__main__":
    sys.exit(run_command())
