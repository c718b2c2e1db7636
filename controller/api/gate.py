"""The control API's front door (``/api/v1/*``), in front of the framework: the bearer token
and the body's media type are checked before anything reads or parses the body, so an
unauthenticated request is always 401, whatever it carries, and nothing behind the door
runs for it.

Errors here have the control API's one shape (``ErrorPublic``: ``{"detail": ...}``).
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable

import orjson

from controller.api.asgi import ASGIApp, Receive, Scope, Send

PREFIX = "/api/v1"
BODY_METHODS = frozenset({"POST", "PATCH", "PUT"})


def auth_problem(headers: Iterable[tuple[bytes, bytes]], token: bytes) -> str | None:
    """Why the request's ``Authorization`` is not ``Bearer <token>``, or None when it is.

    Exactly one ``Authorization`` header, the scheme ``Bearer`` (case-insensitive, as HTTP
    auth schemes are: RFC 9110 section 11.1), one space, then the token byte for byte: no
    extra whitespace, no second header. Compared in constant time over bytes, so any header
    value (non-ASCII included) is just a wrong token.
    """
    values = [v for k, v in headers if k == b"authorization"]
    if not values:
        return "missing bearer token (Authorization: Bearer <token>; see STATE_DIR/token)"
    if len(values) > 1:
        return "more than one Authorization header"
    scheme, sep, given = values[0].partition(b" ")
    if not sep or scheme.lower() != b"bearer":
        return "Authorization must be 'Bearer <token>'"
    if not hmac.compare_digest(given, token):
        return "invalid bearer token (see STATE_DIR/token)"
    return None


def media_type(headers: Iterable[tuple[bytes, bytes]]) -> bytes | None:
    """The request's ``Content-Type`` without parameters, lower case; None when absent."""
    for k, v in headers:
        if k == b"content-type":
            return v.partition(b";")[0].strip().lower()
    return None


def has_body(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    for k, v in headers:
        if k == b"transfer-encoding":
            return True
        if k == b"content-length":
            return v.strip() not in (b"0", b"")
    return False


async def answer(send: Send, status: int, detail: str,
                 extra: list[tuple[bytes, bytes]] | None = None) -> None:
    body = orjson.dumps({"detail": detail})
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode())] + (extra or [])
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class ControlGate:
    """ASGI layer: ``/api/v1`` requests pass only with the token and, when they carry a body,
    as ``application/json``; everything else goes on untouched."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (scope["path"] + "/").startswith(PREFIX + "/"):
            headers = scope["headers"]
            problem = auth_problem(headers, self.token)
            if problem is not None:
                await answer(send, 401, problem, [(b"www-authenticate", b"Bearer")])
                return
            if (scope["method"] in BODY_METHODS and has_body(headers)
                    and media_type(headers) != b"application/json"):
                await answer(send, 415, "the body must be JSON, sent as "
                                        "Content-Type: application/json")
                return
        await self.app(scope, receive, send)
