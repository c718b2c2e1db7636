"""The simulated vLLM-compatible engine (``pdctl engine-sim``).

An HTTP server that speaks the part of vLLM's OpenAI server a P/D router and its clients use,
including the NixlConnector handshake, with timing from a roofline model under continuous
batching. See ``docs/engine-sim.md``.
"""

from controller.engines.sim.config import SimConfigError, SimEngineConfig, validate_config
from controller.engines.sim.server import (
    add_arguments,
    config_from_args,
    create_engine_app,
    run_from_args,
)

__all__ = [
    "SimConfigError",
    "SimEngineConfig",
    "add_arguments",
    "config_from_args",
    "create_engine_app",
    "run_from_args",
    "validate_config",
]
