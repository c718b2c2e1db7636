"""The controller's listening socket when router workers share its address."""

from __future__ import annotations

import socket

BACKLOG = 2048


def listen_socket(host: str, port: int) -> socket.socket:
    """A TCP socket listening on ``host:port`` with ``SO_REUSEPORT``: every router process
    binds its own, and the kernel spreads new connections over them. Port 0: a free one
    (read it from ``getsockname``; the others then bind that one)."""
    family, kind, proto, _, addr = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(addr)
        sock.listen(BACKLOG)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock
