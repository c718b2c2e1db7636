"""How the console is started, for programs that start it themselves: the Streamlit command
line (``streamlit_argv``), its environment (``console_env``) and ``pdctl dashboard``. They live
in ``controller.console_launch`` (the controller starts the console and must not import
``dashboard``); this module keeps the console's own name for them."""

from __future__ import annotations

from controller.console_launch import (
    APP,
    DEFAULT_PORT,
    add_dashboard_parser,
    console_env,
    run_dashboard,
    streamlit_argv,
)

__all__ = ["APP", "DEFAULT_PORT", "add_dashboard_parser", "console_env", "run_dashboard",
           "streamlit_argv"]
