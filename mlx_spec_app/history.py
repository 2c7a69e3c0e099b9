"""Chat history and small preferences, in one SQLite file under the app's data dir.

Writes happen on the UI thread only (a sqlite3 connection is not shared across threads), and each
message is written once, when it is complete: the user's on send, the answer at turn end.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

from mlx_spec.paths import data_dir

__all__ = ["History", "data_dir"]

DB_NAME = "history.sqlite3"

SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id INTEGER PRIMARY KEY,
    title TEXT NOT NULL,
    model TEXT NOT NULL DEFAULT '',
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    kinds TEXT,            -- JSON [[text, kind], ...]: the token colours, restored on open
    stats TEXT,            -- JSON TurnStats.to_dict() of the turn that produced the answer
    partial INTEGER NOT NULL DEFAULT 0,  -- 1: the answer was stopped before its end
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation_id, id);
CREATE TABLE IF NOT EXISTS prefs (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


class History:
    """Conversations, their messages, and key/value preferences."""

    def __init__(self, path: Path | None = None) -> None:
        path = path or data_dir() / DB_NAME
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.db = sqlite3.connect(path)
        self.db.execute("PRAGMA foreign_keys = ON")  # deleting a conversation drops its messages
        self.db.executescript(SCHEMA)

    def close(self) -> None:
        self.db.close()

    # -- conversations ----------------------------------------------------------------------

    def new_conversation(self, title: str, model: str = "") -> int:
        now = time.time()
        with self.db:
            cur = self.db.execute(
                "INSERT INTO conversations (title, model, created, updated) VALUES (?, ?, ?, ?)",
                (_title(title), model, now, now),
            )
        return int(cur.lastrowid or 0)

    def conversations(self) -> list[tuple[int, str, float]]:
        """(id, title, last update time), newest first."""
        return [tuple(r) for r in self.db.execute(
            "SELECT id, title, updated FROM conversations ORDER BY updated DESC, id DESC")]

    def delete(self, conversation: int) -> None:
        with self.db:
            self.db.execute("DELETE FROM conversations WHERE id = ?", (conversation,))

    # -- messages ---------------------------------------------------------------------------

    def add_message(self, conversation: int, role: str, content: str, *,
                    kinds: list[list[str]] | None = None, stats: dict[str, Any] | None = None,
                    partial: bool = False) -> int:
        now = time.time()
        with self.db:
            cur = self.db.execute(
                "INSERT INTO messages (conversation_id, role, content, kinds, stats, partial, "
                "created) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (conversation, role, content,
                 json.dumps(kinds) if kinds is not None else None,
                 json.dumps(stats) if stats is not None else None, int(partial), now),
            )
            self.db.execute("UPDATE conversations SET updated = ? WHERE id = ?",
                            (now, conversation))
        return int(cur.lastrowid or 0)

    def messages(self, conversation: int) -> list[dict[str, Any]]:
        rows = self.db.execute(
            "SELECT role, content, kinds, stats, partial FROM messages "
            "WHERE conversation_id = ? ORDER BY id", (conversation,))
        return [dict(role=role, content=content,
                     kinds=json.loads(kinds) if kinds else None,
                     stats=json.loads(stats) if stats else None, partial=bool(partial))
                for role, content, kinds, stats, partial in rows]

    def delete_message(self, message_id: int) -> None:
        with self.db:
            self.db.execute("DELETE FROM messages WHERE id = ?", (message_id,))

    def exists(self, conversation: int) -> bool:
        return self.db.execute("SELECT 1 FROM conversations WHERE id = ?",
                               (conversation,)).fetchone() is not None

    def delete_last_answer(self, conversation: int) -> None:
        """Regenerate replaces the last answer: forget it."""
        with self.db:
            self.db.execute(
                "DELETE FROM messages WHERE id = (SELECT MAX(id) FROM messages "
                "WHERE conversation_id = ? AND role = 'assistant')", (conversation,))

    # -- preferences ------------------------------------------------------------------------

    def get(self, key: str, default: Any = None) -> Any:
        row = self.db.execute("SELECT value FROM prefs WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else default

    def set(self, key: str, value: Any) -> None:
        with self.db:
            self.db.execute(
                "INSERT INTO prefs (key, value) VALUES (?, ?) "
                "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                (key, json.dumps(value)))


def _title(text: str, width: int = 60) -> str:
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 1] + "…"
