"""``python -m controller.engines.sim --port N ...``: run one simulated engine."""

from __future__ import annotations

import argparse
import sys

from controller.engines.sim.server import add_arguments, run_from_args


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m controller.engines.sim",
        description="Simulated vLLM-compatible engine (OpenAI API, NixlConnector handshake, "
                    "roofline timing). See docs/engine-sim.md.")
    add_arguments(parser)
    # Pools share engine_args with real vLLM; flags the simulator does not model are ignored
    # out loud rather than refused, so one pool config serves both backends.
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        print(f"engine-sim: ignoring flags the simulator does not model: {' '.join(unknown)}",
              file=sys.stderr)
    return run_from_args(args)


if __name__ == "__main__":
    sys.exit(main())
