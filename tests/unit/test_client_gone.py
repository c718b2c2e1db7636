"""A client that goes away before its answer is complete is told to the data plane: by the
controller's listener (``listener.ClientGone``, no task per request), or, under a server that
does not tell it, by a watch on ``receive()``. Either cancels the request's task (which closes
its engine hops) -- and neither does once the answer is complete."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

from controller.api.data import _Exchange, _watch
from controller.api.listener import client_gone
from tests.unit.listener_server import serve_listener

REQUEST = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"


async def _exchange(port: int, read_all: bool) -> None:
    """Send the request, read its answer's start (or all of it), and hang up."""
    loop = asyncio.get_running_loop()
    s = socket.create_connection(("127.0.0.1", port))
    s.setblocking(False)
    await loop.sock_sendall(s, REQUEST)
    got = b""
    while b"\r\n\r\n" not in got or (read_all and not got.endswith(b"0\r\n\r\n")):
        got += await loop.sock_recv(s, 65536)
    s.close()


@pytest.mark.parametrize("complete", [False, True])
async def test_the_listener_tells_a_client_gone_mid_answer_only(complete: bool) -> None:
    told = asyncio.Event()
    finished = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        gone = client_gone(scope)
        assert gone is not None  # the controller's listener gives every request one
        gone.callback = told.set
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        if complete:
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        await finished.wait()

    server, task, port = await serve_listener(app)
    try:
        await _exchange(port, read_all=complete)
        if complete:
            await asyncio.sleep(0.3)
            assert not told.is_set()
        else:
            await asyncio.wait_for(told.wait(), 5)
    finally:
        finished.set()
        server.should_exit = True
        await task


async def test_without_the_listener_a_watch_on_receive_cancels_the_request() -> None:
    messages: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def request() -> None:
        await asyncio.sleep(30)

    for complete in (False, True):
        task = asyncio.create_task(request())
        ex = _Exchange(lambda m: asyncio.sleep(0))
        ex.complete = complete
        watch = asyncio.create_task(_watch(messages.get, task, ex))
        await messages.put({"type": "http.disconnect"})
        await watch
        await asyncio.sleep(0)
        assert task.cancelled() is not complete and ex.client_gone is not complete
        task.cancel()
