"""The KubeRay manifests' tests read the config as its file says."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def _no_pdctl_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The config is checked as the file says, not as this shell's PDCTL_* would change it."""
    for key in list(os.environ):
        if key.startswith("PDCTL_"):
            monkeypatch.delenv(key)
