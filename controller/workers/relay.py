"""A router worker's way to everything that is not an inference route: the request goes to
the controller over its control socket and the answer comes back as it is (status, headers,
body streamed), so the control API, ``/metrics``, ``/healthz`` and ``/v1/models`` answer the
same on every connection, whichever process the kernel gave it to."""

from __future__ import annotations

from pathlib import Path

import httpx

from controller.api.asgi import Receive, Scope, Send

# Hop-by-hop headers (RFC 9110 7.6.1): each side's own. The answer keeps the controller's
# Content-Length (the raw body is relayed unchanged), so a client that reads by length (and a
# keep-alive connection) sees the same framing on every process; the request's is httpx's.
HOP = frozenset({b"connection", b"keep-alive", b"transfer-encoding", b"te", b"trailer",
                 b"upgrade", b"proxy-connection"})
REQUEST_HOP = HOP | {b"content-length"}
_UNAVAILABLE = b'{"detail": "the controller is not reachable from this router worker"}'


class Relay:
    def __init__(self, control_socket: Path) -> None:
        self._client = httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=str(control_socket)),
            base_url="http://controller", timeout=httpx.Timeout(60.0, connect=5.0))

    async def close(self) -> None:
        await self._client.aclose()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = bytearray()
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        headers = [(k, v) for k, v in scope["headers"] if k not in REQUEST_HOP]
        url = scope["raw_path"].decode("latin-1") if scope.get("raw_path") else scope["path"]
        if scope.get("query_string") and "?" not in url:
            url += "?" + scope["query_string"].decode("latin-1")
        request = self._client.build_request(scope["method"], url, headers=headers,
                                             content=bytes(body))
        try:
            response = await self._client.send(request, stream=True)
        except httpx.HTTPError:
            await send({"type": "http.response.start", "status": 503,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(_UNAVAILABLE)).encode())]})
            await send({"type": "http.response.body", "body": _UNAVAILABLE})
            return
        try:
            await send({"type": "http.response.start", "status": response.status_code,
                        "headers": [(k, v) for k, v in response.headers.raw
                                    if k.lower() not in HOP]})
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            await response.aclose()
