"""Persisted controller state in SQLite: desired pools, routing settings and the audit log.

Small and synchronous on purpose: writes happen on operator changes and lifecycle
transitions, not per request.

When the state directory cannot be written (its disk full, say), an operator's change is
refused whole (``change``: the state and its audit event in one transaction, ``
StateUnwritable`` -> 503, nothing changed), while what the fleet does by itself goes on:
a lifecycle event (``record``) or state (``put``) that cannot be stored is logged instead,
counted (``failed_writes``) and the reason kept (``problem``) until a write succeeds again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from controller.errors import StateUnwritable

log = logging.getLogger("pdctl.store")

SCHEMA = """
CREATE TABLE IF NOT EXISTS state (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    ts REAL NOT NULL,
    actor TEXT NOT NULL,
    kind TEXT NOT NULL,
    target TEXT NOT NULL,
    before TEXT,
    after TEXT,
    detail TEXT
);
"""


PUT_SQL = ("INSERT INTO state(key, value) VALUES(?, ?) "
           "ON CONFLICT(key) DO UPDATE SET value = excluded.value")
EVENT_SQL = ("INSERT INTO events(ts, actor, kind, target, before, after, detail) "
             "VALUES(?, ?, ?, ?, ?, ?, ?)")


def _event(actor: str, kind: str, target: str, before: Any, after: Any, detail: str | None
           ) -> dict[str, Any]:
    """An audit event as ``Store.events`` returns it, stamped now; its id once stored."""
    return {"id": None, "ts": time.time(), "actor": actor, "kind": kind, "target": target,
            "before": before, "after": after, "detail": detail}


def _insert(event: dict[str, Any]) -> tuple[str, tuple[Any, ...]]:
    """The statement that appends ``event`` to the log."""
    return EVENT_SQL, (event["ts"], event["actor"], event["kind"], event["target"],
                       json.dumps(event["before"]), json.dumps(event["after"]),
                       event["detail"])


class Store:
    """Key/value JSON state plus an append-only event log."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.executescript(SCHEMA)
        self._lock = threading.Lock()
        self.failed_writes = 0  # lifecycle events that could not be stored (logged instead)
        self.problem: str | None = None  # why the last write failed, until one succeeds

    def close(self) -> None:
        self._db.close()

    def get(self, key: str) -> Any | None:
        row = self._db.execute("SELECT value FROM state WHERE key = ?", (key,)).fetchone()
        return None if row is None else json.loads(row[0])

    def _write(self, statements: list[tuple[str, tuple[Any, ...]]]) -> int | None:
        """The statements in one transaction; the last one's row id. ``StateUnwritable``
        (nothing written) when the database cannot be written."""
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    cur = None
                    for sql, args in statements:
                        cur = self._db.execute(sql, args)
                    self._db.execute("COMMIT")
                except BaseException:
                    if self._db.in_transaction:  # SQLite rolls back itself on SQLITE_FULL
                        self._db.execute("ROLLBACK")
                    raise
            except sqlite3.Error as exc:
                self.problem = f"the state directory cannot be written ({self.path}): {exc}"
                raise StateUnwritable(f"{self.problem}; nothing was changed") from None
            self.problem = None
            return None if cur is None else cur.lastrowid

    def writable(self) -> None:
        """``StateUnwritable`` unless a write goes through now (before a change whose own
        records are written as it goes)."""
        self._write([(PUT_SQL, ("written_at", json.dumps(time.time())))])

    def recheck(self) -> str | None:
        """``problem``, tried again with a write when there is one (space freed since)."""
        if self.problem is not None:
            with contextlib.suppress(StateUnwritable):
                self.writable()
        return self.problem

    def put(self, key: str, value: Any) -> None:
        """Set ``key``: state the fleet keeps by itself (its instances, their numbering), so
        it goes on when it cannot be stored (logged and counted)."""
        try:
            self._write([(PUT_SQL, (key, json.dumps(value)))])
        except StateUnwritable as exc:
            self.failed_writes += 1
            log.error("%s; %s not stored", exc, key)

    def change(self, key: str, value: Any, actor: str, kind: str, target: str,
               before: Any = None, after: Any = None, detail: str | None = None
               ) -> dict[str, Any]:
        """An operator's change: ``key`` set and its audit event appended together, or
        neither (``StateUnwritable``). The caller changes its own state only after."""
        event = _event(actor, kind, target, before, after, detail)
        event["id"] = self._write([(PUT_SQL, (key, json.dumps(value))), _insert(event)])
        return event

    def record(self, actor: str, kind: str, target: str, before: Any = None,
               after: Any = None, detail: str | None = None) -> dict[str, Any]:
        """Append one audit event and return it. What the fleet does goes on when it
        cannot be stored: the event is logged instead (its id None) and counted."""
        event = _event(actor, kind, target, before, after, detail)
        try:
            event["id"] = self._write([_insert(event)])
        except StateUnwritable as exc:
            self.failed_writes += 1
            log.error("%s; event not stored: %s %s %s %s -> %s %s", exc, actor, kind, target,
                      before, after, detail or "")
        return event

    def events(self, limit: int = 100, since_id: int = 0, kind: str | None = None,
               since: float | None = None, until: float | None = None
               ) -> list[dict[str, Any]]:
        """Newest first; ``since``/``until`` (unix s) bound their times, ``[since, until)``."""
        sql = "SELECT id, ts, actor, kind, target, before, after, detail FROM events WHERE id > ?"
        args: list[Any] = [since_id]
        if kind:
            sql += " AND kind = ?"
            args.append(kind)
        if since is not None:
            sql += " AND ts >= ?"
            args.append(since)
        if until is not None:
            sql += " AND ts < ?"
            args.append(until)
        sql += " ORDER BY id DESC LIMIT ?"
        args.append(limit)
        rows = self._db.execute(sql, args).fetchall()
        return [
            {"id": r[0], "ts": r[1], "actor": r[2], "kind": r[3], "target": r[4],
             "before": json.loads(r[5]) if r[5] else None,
             "after": json.loads(r[6]) if r[6] else None, "detail": r[7]}
            for r in rows
        ]
