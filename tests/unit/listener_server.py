"""The controller's listener protocol (``listener.protocol_class``) under a real uvicorn
server on a free loopback port, for the tests of what the protocol does."""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn

from controller.api.listener import Lane, protocol_class


async def serve_listener(app: Any, lane: Lane | None = None
                         ) -> tuple[uvicorn.Server, asyncio.Task[None], int]:
    """A started server for ``app`` (and ``lane``), its task, and its port; stop it with
    ``server.should_exit = True`` and await the task."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="off",
                                           log_config=None, http=protocol_class(5.0, lane)))
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    return server, task, port
