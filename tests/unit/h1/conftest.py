"""The HTTP client's tests run once on asyncio's own loop and once on uvloop, the loop the
controller serves on: their transports differ (uvloop's do not subclass asyncio's)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

import uvloop


def pytest_asyncio_loop_factories(config: Any, item: Any
                                  ) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
