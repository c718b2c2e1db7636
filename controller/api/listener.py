"""The controller's listener: uvicorn with the limits an exposed server needs.

- ``keep_alive_s``: an idle keep-alive connection is closed (uvicorn's own timer).
- ``header_timeout_s``: a connection must send a request's headers within this, from when it
  opens or from the first byte of each next request; otherwise it gets ``408`` and is closed.
  uvicorn has no such timer: a connection that never sends a request would be held forever.
- ``max_connections``: beyond this many connections (or requests) at once, uvicorn answers
  ``503`` and closes the connection.
- On SIGTERM/SIGINT it stops accepting connections and lets the requests in flight finish for
  ``SHUTDOWN_GRACE_S``. uvicorn then cancels those left, and their clients would see the
  connection drop with no answer. So ``ANSWER_S`` before that, ``ControllerServer`` has the
  router end its engine connections. Each request left gets its error the usual way: an error
  answer, or an error event ending its stream.
- A client that goes away before its answer is complete is told to the data plane at once
  (``ClientGone``, in the request's scope), without a task per request waiting on
  ``receive()`` for it.
- The inference requests are served by the protocol itself, not through the ASGI app
  (``lane``: ``data.WireLane``); uvicorn still parses them and keeps every limit above.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import socket
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, cast

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from controller.config import ControllerSettings
from controller.router.upstream import Upstream

log = logging.getLogger("pdctl.controller")

SHUTDOWN_GRACE_S = 10.0
LINGER_S = 0.5  # an idle connection's wait for a request already on its way, at shutdown
ANSWER_S = 1.0  # time left to write the error answers of the requests the grace did not cover
_BODY_408 = b'{"detail": "request headers not received in time"}'
TIMEOUT_408 = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
               b"connection: close\r\ncontent-length: %d\r\n\r\n%s"
               % (len(_BODY_408), _BODY_408))


CLIENT_GONE = "pdctl.client_gone"  # the scope extension holding a request's ``ClientGone``


class ClientGone:
    """Where the data plane puts what to do when the request's client goes away before its
    answer is complete; the protocol calls it when the connection is lost."""

    __slots__ = ("callback",)

    def __init__(self) -> None:
        self.callback: Callable[[], None] | None = None


def client_gone(scope: Mapping[str, Any]) -> ClientGone | None:
    """The request's ``ClientGone``: None where the server does not tell a client's going."""
    gone = scope.get("extensions", {}).get(CLIENT_GONE)
    return gone if isinstance(gone, ClientGone) else None


# Serves a request without its ASGI app: returns the coroutine that answers it, or None where
# the app should (``data.WireLane``).
Lane = Callable[[RequestResponseCycle], Coroutine[Any, Any, None] | None]


class HeaderTimeoutProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol plus a deadline for each request's headers, an idle
    connection kept ``LINGER_S`` at shutdown (``shutdown``), and the requests its ``lane``
    takes served without the ASGI app."""

    header_timeout_s = 10.0  # set per listener by ``protocol_class``
    lane: Lane | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None
        self._closing = False

    def shutdown(self) -> None:
        """The server is shutting down. uvicorn closes an idle keep-alive connection at once,
        and a busy one right after its answer, so a request its client wrote meanwhile is
        lost unanswered (the client reads a reset: HTTP/1.1's keep-alive race). Here a
        connection is kept ``LINGER_S`` once idle instead: a request that arrives meanwhile
        is answered, with ``Connection: close``."""
        self._closing = True
        if self.cycle is None or self.cycle.response_complete:
            self._linger()

    def _linger(self) -> None:
        self.loop.call_later(LINGER_S, self._close_if_idle)

    def _close_if_idle(self) -> None:
        if self.cycle is None or self.cycle.response_complete:
            if not self.transport.is_closing():
                self.transport.close()
        # else: the request that came meanwhile is answered with Connection: close

    def _arm(self) -> None:
        self._disarm()
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._header_timeout)

    def _disarm(self) -> None:
        timer, self._header_timer = self._header_timer, None
        if timer is not None:
            timer.cancel()

    def _header_timeout(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            self.transport.write(TIMEOUT_408)
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        cycle = self.cycle
        super().connection_lost(exc)
        if cycle is not None and not cycle.response_complete:
            gone = client_gone(cycle.scope)
            if gone is not None and gone.callback is not None:
                gone.callback()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        cast(dict[str, Any], self.scope)["extensions"] = {CLIENT_GONE: ClientGone()}
        if self._header_timer is None:
            self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()
        if self._closing and self.cycle is not None:
            self.cycle.keep_alive = False

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        # ``app`` is not the app when uvicorn answers 503 over its connection cap.
        served = self.lane(cycle) if self.lane is not None and app is self.app else None
        if served is None:
            super()._start_asgi_task(cycle, app)
            return
        task = self.loop.create_task(served)
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)  # counted against the cap, and waited for at shutdown

    def on_response_complete(self) -> None:
        self._disarm()  # the keep-alive timer takes over until the next request begins
        super().on_response_complete()
        if self._closing and not self.transport.is_closing():
            self._linger()


def protocol_class(header_timeout_s: float, lane: Lane | None = None
                   ) -> type[HeaderTimeoutProtocol]:
    return type("ControllerHttpProtocol", (HeaderTimeoutProtocol,),
                {"header_timeout_s": header_timeout_s, "lane": staticmethod(lane)
                 if lane is not None else None})


def server_config(app: Any, cs: ControllerSettings, lane: Lane | None = None) -> uvicorn.Config:
    """``lane``: the requests served without ``app`` (``data.WireLane``)."""
    # log_config=None: uvicorn's loggers go through the controller's own handler and format.
    return uvicorn.Config(app, host=cs.host, port=cs.port, log_level="warning", log_config=None,
                          access_log=False, proxy_headers=False,
                          http=protocol_class(cs.header_timeout_s, lane),
                          # the kernel spreads connections evenly over the processes
                          limit_concurrency=-(-cs.max_connections // cs.data_processes),
                          timeout_keep_alive=cs.keep_alive_s,  # type: ignore[arg-type]
                          timeout_graceful_shutdown=int(SHUTDOWN_GRACE_S))


class ControllerServer(uvicorn.Server):
    """uvicorn's server; ``before_cancel`` runs ``ANSWER_S`` before the shutdown's grace ends
    (the module docstring)."""

    def __init__(self, config: uvicorn.Config, before_cancel: Callable[[], None],
                 on_shutdown: Callable[[], None] | None = None) -> None:
        """``on_shutdown``: told as the shutdown starts (the router workers', to stop in the
        same grace)."""
        super().__init__(config)
        self._before_cancel = before_cancel
        self._on_shutdown = on_shutdown

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self._on_shutdown is not None:
            self._on_shutdown()
        timer = asyncio.get_running_loop().call_later(SHUTDOWN_GRACE_S - ANSWER_S,
                                                      self._before_cancel)
        try:
            await super().shutdown(sockets)
        finally:
            timer.cancel()


def raise_fd_limit() -> tuple[int, int]:
    """Soft open-file limit up to the hard one: every open client request holds about two
    sockets (client and engine), so a 1,024 soft limit would refuse connections at about 500
    requests in flight. Returns (before, after)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft == resource.RLIM_INFINITY or soft >= hard:
        return soft, soft
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return soft, hard


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop where it is installed (``uvicorn[standard]`` brings it): its transports cost the
    data path about half of asyncio's per socket write. The controller times requests with
    ``time.perf_counter``, never ``loop.time()`` (millisecond-grained under uvloop)."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def end_requests(upstream: Upstream) -> None:
    """The shutdown's grace is nearly over (``ControllerServer``'s ``before_cancel``): the
    requests still in flight end with an error their clients can read, rather than a dropped
    connection."""
    n = upstream.cut_all("the controller is shutting down")
    if n:
        log.warning("shutting down: %d engine connection(s) still in use ended; their requests "
                    "answered with an error", n)
