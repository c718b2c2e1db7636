"""The listener's lane (``listener.protocol_class(..., lane)``): the requests it claims are
served without the ASGI app, on the connection itself (``data._WireExchange``), and framed
as uvicorn would frame them; everything else goes to the app."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import httpx
import pytest
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from controller.api.data import _WireExchange
from tests.unit.listener_server import serve_listener


async def _lane_answer(cycle: RequestResponseCycle) -> None:
    ex = _WireExchange(cycle)
    body = bytes(cycle.body)
    if cycle.scope["path"] == "/whole":
        await ex.respond(200, b'{"got": %d}' % len(body), "rid-1")
        return
    await ex.start(200, [(b"content-type", b"text/event-stream")])
    for part in (b"data: 1\n\n", b"data: 2\n\n"):
        await ex.write(part, True)
        await asyncio.sleep(0)
    await ex.write(b"data: [DONE]\n\n", False)


def lane(cycle: RequestResponseCycle) -> Coroutine[Any, Any, None] | None:
    if cycle.scope["method"] == "POST" and cycle.scope["path"] in ("/whole", "/stream"):
        return _lane_answer(cycle)
    return None


@pytest.fixture
async def served() -> Any:
    seen: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["path"])
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"3")]})
        await send({"type": "http.response.body", "body": b"app"})

    server, task, port = await serve_listener(app, lane)
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        server.should_exit = True
        await task


async def test_the_lane_serves_what_it_claims_and_the_app_the_rest(served: Any) -> None:
    url, seen = served
    async with httpx.AsyncClient(base_url=url, timeout=5) as c:
        for _ in range(3):  # on one kept-alive connection, alternately
            r = await c.post("/whole", content=b"x" * 100)
            assert (r.status_code, r.json(), r.headers["x-request-id"]) == (200, {"got": 100},
                                                                          "rid-1")
            assert r.headers["content-length"] == str(len(r.content))
            r = await c.post("/stream", content=b"{}")
            assert r.headers["transfer-encoding"] == "chunked"
            assert r.text == "data: 1\n\ndata: 2\n\ndata: [DONE]\n\n"
            r = await c.get("/whole")  # not claimed: a GET
            assert r.text == "app"
            r = await c.post("/other", content=b"{}")
            assert r.text == "app"
    assert seen == ["/whole", "/other"] * 3


async def test_a_closing_exchange_says_so_and_closes(served: Any) -> None:
    url, _ = served
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"POST /whole HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n"
                 b"connection: close\r\n\r\n{}")
    answer = await asyncio.wait_for(reader.read(), 5)  # to the server's close
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK") and b"connection: close" in head.lower()
    assert body == b'{"got": 2}'
    writer.close()
