"""Serving engines that the controller runs or talks to; ``sim`` is the simulated vLLM engine."""
