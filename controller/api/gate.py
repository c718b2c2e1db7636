"""The control API's front door (``/api/v1/*``), in front of the framework: the bearer token
(the admin's, or the viewer's, which may only read: a change with it is 403), then the body --
sent as ``application/json``, at most ``MAX_BODY`` bytes, well-formed JSON -- are checked
before the framework reads it, so an unauthenticated request is always 401 whatever it
carries, and a body that is not JSON is always 422 (the framework would answer 400 for one
that is not UTF-8).

Errors here have the control API's one shape (``ErrorPublic``: ``{"detail": ...}``).
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable

import orjson

from controller.api.asgi import ASGIApp, Message, Receive, Scope, Send

PREFIX = "/api/v1"
BODY_METHODS = frozenset({"POST", "PATCH", "PUT"})
MAX_BODY = 64 * 1024  # a control body is a few fields


READ_METHODS = frozenset({"GET", "HEAD"})
ADMIN, VIEWER = "admin", "viewer"
READ_ONLY = ("this is the viewer token: it may only read; a change needs the admin token "
             "(STATE_DIR/token)")


def auth_problem(headers: Iterable[tuple[bytes, bytes]], token: bytes,
                 viewer: bytes | None = None) -> str | None:
    """Why the request's ``Authorization`` is not ``Bearer <token>`` (or ``<viewer>``), or
    None when it is.

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
    if not hmac.compare_digest(given, token) and not (
            viewer and hmac.compare_digest(given, viewer)):
        return "invalid bearer token (see STATE_DIR/token)"
    return None


def role_of(headers: Iterable[tuple[bytes, bytes]], token: bytes) -> str:
    """``admin`` for the admin token, else ``viewer`` (call after ``auth_problem``)."""
    for k, v in headers:
        if k == b"authorization":
            return ADMIN if hmac.compare_digest(v.partition(b" ")[2], token) else VIEWER
    return VIEWER


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

    def __init__(self, app: ASGIApp, token: str, viewer_token: str = "") -> None:
        self.app = app
        self.token = token.encode()
        self.viewer = viewer_token.encode() or None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (scope["path"] + "/").startswith(PREFIX + "/"):
            headers = scope["headers"]
            problem = auth_problem(headers, self.token, self.viewer)
            if problem is not None:
                await answer(send, 401, problem, [(b"www-authenticate", b"Bearer")])
                return
            role = role_of(headers, self.token)
            if role == VIEWER and scope["method"] not in READ_METHODS:
                await answer(send, 403, READ_ONLY)
                return
            scope.setdefault("state", {})["pdctl_access"] = role
            if scope["method"] in BODY_METHODS and has_body(headers):
                if media_type(headers) != b"application/json":
                    await answer(send, 415, "the body must be JSON, sent as "
                                            "Content-Type: application/json")
                    return
                body = await read_body(receive)
                if body is None:
                    return  # the client left
                problem = json_problem(body)
                if problem is not None:
                    await answer(send, 413 if len(body) > MAX_BODY else 422, problem,
                                 [(b"connection", b"close")] if len(body) > MAX_BODY else None)
                    return
                receive = replay(body, receive)
        await self.app(scope, receive, send)


async def read_body(receive: Receive) -> bytes | None:
    """The body, up to one byte past ``MAX_BODY``; None when the client left first."""
    chunks, size = [], 0
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return None
        chunk = msg.get("body", b"")
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_BODY or not msg.get("more_body"):
            return b"".join(chunks)


def json_problem(body: bytes) -> str | None:
    if len(body) > MAX_BODY:
        return f"the body is over {MAX_BODY} bytes"
    try:
        orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        return f"the body is not JSON (UTF-8): {exc}"
    return None


def replay(body: bytes, receive: Receive) -> Receive:
    """``receive`` for the app behind: the body read here, then the connection's own."""
    sent = False

    async def again() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again
