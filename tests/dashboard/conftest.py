"""Fixtures for the console's tests: a fake controller and an AppTest driver."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

from dashboard.client import ControllerClient
from dashboard.config import ConsoleConfig
from dashboard.ui import session
from tests.dashboard.fake import TOKEN, URL, FakeController

APP = Path(__file__).resolve().parents[2] / "dashboard" / "app.py"


@pytest.fixture
def fake() -> FakeController:
    return FakeController()


@pytest.fixture
def console(tmp_path: Path) -> Iterator[Callable[..., AppTest]]:
    """``console(fake, page="controls", token=...)``: the app, run once, on that page."""
    clients: list[ControllerClient] = []
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    (state_dir / "token").write_text(TOKEN + "\n")

    def start(fake: FakeController, page: str | None = None, token: str | None = TOKEN,
              **config: Any) -> AppTest:
        client = fake.client(token)
        clients.append(client)
        at = AppTest.from_file(str(APP), default_timeout=30)
        at.session_state[session.CLIENT_KEY] = client
        at.session_state[session.CONFIG_KEY] = ConsoleConfig(URL, state_dir, **config)
        at.run()
        if page:
            at.switch_page(f"views/{page}.py").run()
        return at

    yield start
    for c in clients:
        c.close()
