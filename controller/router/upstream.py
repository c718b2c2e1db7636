"""What the proxy needs from its HTTP client to engine instances: ``post`` a JSON body and read
the answer, ``open`` one to relay as it arrives, and one error type for "the engine could not
be reached or the connection failed". ``controller.router.h1`` implements it; a test can
stand in a fake engine without sockets.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol


class UpstreamError(Exception):
    """The instance could not be reached, or the connection failed before an answer.

    ``sent`` is False only when the request surely never reached the engine (connecting
    failed); otherwise the engine may have received, and acted on, the request.
    """

    def __init__(self, message: str, sent: bool = True) -> None:
        super().__init__(message)
        self.sent = sent


@dataclass
class UpstreamReply:
    status: int
    body: bytes


class Stream(Protocol):
    """An open response: status and content type read, body not yet consumed."""

    status: int
    content_type: str

    def chunks(self) -> AsyncIterator[bytes]:
        """Body bytes as they arrive; raises UpstreamError if the connection fails."""
        ...

    async def read(self) -> bytes: ...

    def close(self) -> None:
        """Release the connection; an unread body closes it rather than reuse it."""
        ...


class Upstream(Protocol):
    """``resend=False``: never send the request a second time, not even on a new connection
    after a reused one was lost (a body carrying a KV handle must reach at most one engine
    once). ``on_sent`` is called once the request is written to a connection: a caller
    cancelled before then knows the engine never saw it."""

    async def post(self, url: str, payload: bytes, headers: Mapping[str, str],
                   resend: bool = True) -> UpstreamReply: ...

    async def open(self, url: str, payload: bytes, headers: Mapping[str, str],
                   resend: bool = True, on_sent: Callable[[], None] | None = None
                   ) -> Stream: ...

    def cut(self, url: str, message: str) -> int:
        """End every connection to the engine at ``url`` now (its exchanges fail with
        ``message``); how many were open."""
        ...

    @property
    def closed(self) -> str | None:
        """Why no request may start any more (``cut_all``); None while they may."""
        ...

    def cut_all(self, message: str) -> int:
        """End every connection now and start no request any more (each fails with
        ``message``); how many were open."""
        ...

    async def close(self) -> None: ...
