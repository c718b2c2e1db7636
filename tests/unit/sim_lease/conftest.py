"""The simulated engine's log captured at DEBUG for every lease test."""

from __future__ import annotations

import logging

import pytest

from tests.unit.sim_lease.harness import LOGGER


@pytest.fixture(autouse=True)
def _capture_engine_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
