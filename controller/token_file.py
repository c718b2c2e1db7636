"""Secrets the controller keeps in its state directory: created once, owner-only, kept."""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def ensure_token(state_dir: Path, name: str = "token") -> str:
    """The token in ``state_dir/<name>`` (``token``: the API admin's; ``viewer-token``: the
    API's read-only one; ``ray-auth-token``: a local Ray head's), created owner-only on first
    use.

    Hex, so that it never starts with ``-``: ``pdctl status --token $(cat .pdctl/token)`` must
    not read it as an option (a url-safe token did, one start in 64)."""
    path = state_dir / name
    if path.exists():
        return path.read_text().strip()
    state_dir.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token
