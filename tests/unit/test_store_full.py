"""The store when its database cannot grow (SQLite's "database or disk is full", as on a full
state directory): an operator's change is refused whole, the fleet's own writes are logged
and counted instead, and writes resume once there is room."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.errors import StateUnwritable
from controller.store import Store


def full(store: Store) -> None:
    """No page more than the database has now (SQLITE_FULL on the next that needs one)."""
    pages = store._db.execute("PRAGMA page_count").fetchone()[0]  # noqa: SLF001
    store._db.execute(f"PRAGMA max_page_count = {pages}")  # noqa: SLF001


def room(store: Store) -> None:
    store._db.execute("PRAGMA max_page_count = 1073741823")  # noqa: SLF001


def test_a_change_is_stored_whole_or_not_at_all(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    store.change("routing", {"a": 1}, "admin", "routing.update", "routing", {}, {"a": 1})
    full(store)
    big = {"x": "y" * 100_000}  # needs pages the database may not take
    with pytest.raises(StateUnwritable, match="cannot be written.*nothing was changed"):
        store.change("routing", big, "admin", "routing.update", "routing", {}, big)
    assert store.get("routing") == {"a": 1}
    assert [e["kind"] for e in store.events()] == ["routing.update"]
    assert store.problem is not None
    with pytest.raises(StateUnwritable):
        store.change("k", big, "a", "k", "k")
    room(store)
    store.writable()
    assert store.problem is None


def test_the_fleets_own_writes_go_on_logged_and_counted(tmp_path: Path,
                                                        caplog: pytest.LogCaptureFixture
                                                        ) -> None:
    store = Store(tmp_path / "state.db")
    full(store)
    detail = "d" * 100_000
    event = store.record("reconciler", "instance.ready", "decode-1", "starting", "ready",
                         detail)
    assert event["id"] is None and event["kind"] == "instance.ready"
    store.put("live", ["x" * 100_000])
    assert store.failed_writes == 2
    assert "event not stored: reconciler instance.ready decode-1" in caplog.text
    room(store)
    assert store.record("reconciler", "instance.ready", "decode-1")["id"] is not None
    assert store.problem is None and store.failed_writes == 2
