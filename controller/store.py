"""Persisted controller state in SQLite: desired pools, routing settings and the audit log.

Small and synchronous on purpose: writes happen on operator changes and lifecycle
transitions, not per request.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

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


class Store:
    """Key/value JSON state plus an append-only event log."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.executescript(SCHEMA)
        self._lock = threading.Lock()

    def close(self) -> None:
        self._db.close()

    def get(self, key: str) -> Any | None:
        row = self._db.execute("SELECT value FROM state WHERE key = ?", (key,)).fetchone()
        return None if row is None else json.loads(row[0])

    def put(self, key: str, value: Any) -> None:
        with self._lock:
            self._db.execute(
                "INSERT INTO state(key, value) VALUES(?, ?) "
                "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                (key, json.dumps(value)),
            )

    def record(self, actor: str, kind: str, target: str, before: Any = None,
               after: Any = None, detail: str | None = None) -> dict[str, Any]:
        """Append one audit event and return it."""
        ts = time.time()
        with self._lock:
            cur = self._db.execute(
                "INSERT INTO events(ts, actor, kind, target, before, after, detail) "
                "VALUES(?, ?, ?, ?, ?, ?, ?)",
                (ts, actor, kind, target, json.dumps(before), json.dumps(after), detail),
            )
        return {"id": cur.lastrowid, "ts": ts, "actor": actor, "kind": kind, "target": target,
                "before": before, "after": after, "detail": detail}

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
