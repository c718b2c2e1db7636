"""Suite-wide: tests/ray run only inside a private network namespace (``make test-ray``)."""

from __future__ import annotations

from pathlib import Path

import pytest


def in_private_netns() -> bool:
    """Only loopback here: a namespace made with ``unshare -n``, where Ray binds 127.0.0.1
    (on the host's namespace it binds the host's interface even when told 127.0.0.1). Read
    from /proc/self/net/dev: /sys/class/net shows the namespace sysfs was mounted in."""
    lines = Path("/proc/self/net/dev").read_text().splitlines()[2:]
    return {line.split(":", 1)[0].strip() for line in lines} == {"lo"}


collect_ignore = [] if in_private_netns() else ["ray"]


def pytest_report_header(config: pytest.Config) -> str | None:
    if in_private_netns():
        return "network: a private namespace (loopback only): tests/ray collected"
    return ("network: the host's namespace: tests/ray NOT collected (they need a private one; "
            "`make test-ray` runs them in one, and `make test` runs both)")
