"""The control API's view of one fleet when router workers serve beside the controller
(``controller.workers``): each control request waits first for the workers to send what
they did (``DataWorkers.sync``), so that a record, a metric or a count a client's answer
already reflects is in what it reads next; a change is answered only once every worker has
applied it. Liveness and readiness answer at once."""

from __future__ import annotations

from collections.abc import Callable

from controller.api.asgi import ASGIApp, Message, Receive, Scope, Send
from controller.api.state import DataWorkers

READS = frozenset({"GET", "HEAD", "OPTIONS"})
UNSYNCED = frozenset({"/healthz", "/health", "/readyz"})  # liveness answers at once


class Synced:
    def __init__(self, app: ASGIApp, hub: Callable[[], DataWorkers | None]) -> None:
        """``hub()``: the router workers, None while the controller has none."""
        self.app, self.hub = app, hub

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        hub = self.hub()
        if hub is None or scope["type"] != "http" or scope["path"] in UNSYNCED:
            await self.app(scope, receive, send)
            return
        await hub.sync()
        if scope["method"] in READS:
            await self.app(scope, receive, send)
            return

        async def answered(msg: Message) -> None:
            if msg["type"] == "http.response.start":
                await hub.sync()  # the change reached every worker before its answer
            await send(msg)
        await self.app(scope, receive, answered)
