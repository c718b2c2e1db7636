"""Prometheus's binaries for these tests: Debian's ``prometheus`` package (2.42), which
``make test`` installs (``make prometheus``)."""

from __future__ import annotations

import shutil

import pytest


def binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"`{name}` is not on PATH: run `make prometheus` (installs Debian's "
                    "prometheus package, as root)")
    return path


@pytest.fixture(scope="session")
def promtool() -> str:
    return binary("promtool")


@pytest.fixture(scope="session")
def prometheus_bin() -> str:
    return binary("prometheus")
