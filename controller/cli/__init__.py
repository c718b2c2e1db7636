"""``pdctl``: every verb of the command line and its helpers (server verbs, API clients, the
profile sweep, the lab model, the console launcher). ``controller.cli:main`` is the entry point."""

from controller.cli.commands import main

__all__ = ["main"]
