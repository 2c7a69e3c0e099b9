"""Chat history and small preferences, in one SQLite file under the app's data dir.

Writes happen on the UI thread only (a sqlite3 connection is not shared across threads). The
user's message is written on send; the answer is written as it streams (at most about a second
of tokens behind, so a killed app loses little) and completed at turn end; an answer found still
streaming when a conversation is reopened was interrupted, and says so.

Damage never stops the app and never loses a file: WAL journaling survives a kill mid-write; a
file that is not a database (or is malformed) is moved aside, kept, and a fresh one started; a
data directory that cannot be written (read-only, disk full) leaves the chat working on an
in-memory copy, and `notice` says that history is not being saved.
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
COMPLETE, STOPPED, STREAMING = 0, 1, 2  # messages.partial: a STREAMING row found later was cut

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
    partial INTEGER NOT NULL DEFAULT 0,  -- COMPLETE, STOPPED (esc) or STREAMING (in progress)
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation_id, id);
CREATE TABLE IF NOT EXISTS prefs (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


class History:
    """Conversations, their messages, and key/value preferences."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or data_dir() / DB_NAME
        self.notice: str | None = None  # a one-line problem with the file, for the app to show
        self.saving = True
        self.db = self._open()

    def _open(self) -> sqlite3.Connection:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            return _connect(self.path)
        except sqlite3.OperationalError as e:  # read-only, full, or cannot be created
            return self._in_memory(f"cannot write {self.path} ({e})")
        except OSError as e:
            return self._in_memory(f"cannot create {self.path.parent} ({e.strerror})")
        except sqlite3.DatabaseError as e:  # not a database, or malformed
            try:
                kept = self._move_aside()
                db = _connect(self.path)
            except (OSError, sqlite3.Error) as again:
                return self._in_memory(f"{self.path} is damaged ({e}) and cannot be replaced "
                                       f"({again})")
            self.notice = (f"the history file was damaged ({e}); it is kept as {kept.name} and "
                           "a fresh one was started")
            return db

    def _move_aside(self) -> Path:
        kept = self.path.with_name(f"{self.path.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
        self.path.replace(kept)
        for suffix in ("-wal", "-shm"):
            side = self.path.with_name(self.path.name + suffix)
            if side.exists():
                side.replace(kept.with_name(kept.name + suffix))
        return kept

    def _in_memory(self, why: str, current: sqlite3.Connection | None = None
                   ) -> sqlite3.Connection:
        """Go on in memory, with what could still be read; history is no longer saved."""
        memory = sqlite3.connect(":memory:")
        try:
            source = current or sqlite3.connect(f"file:{self.path}?mode=ro", uri=True)
            source.backup(memory)
        except sqlite3.Error:
            pass
        memory.execute("PRAGMA foreign_keys = ON")
        memory.executescript(SCHEMA)
        self.saving = False
        self.notice = f"history is not being saved: {why}"
        return memory

    def _write(self, sql: str, args: tuple = ()) -> sqlite3.Cursor:
        """One write in its own transaction; a disk that fails now moves to memory, once."""
        try:
            with self.db:
                return self.db.execute(sql, args)
        except sqlite3.OperationalError as e:
            if not self.saving:
                raise
            self.db = self._in_memory(str(e), current=self.db)
            with self.db:
                return self.db.execute(sql, args)

    def take_notice(self) -> str | None:
        notice, self.notice = self.notice, None
        return notice

    def close(self) -> None:
        self.db.close()

    # -- conversations ----------------------------------------------------------------------

    def new_conversation(self, title: str, *, model: str = "") -> int:
        """A conversation titled by its first message, held with `model` (the target's name)."""
        now = time.time()
        cur = self._write(
            "INSERT INTO conversations (title, model, created, updated) VALUES (?, ?, ?, ?)",
            (_title(title), model, now, now))
        return int(cur.lastrowid or 0)

    def conversations(self) -> list[tuple[int, str, float]]:
        """(id, title, last update time), newest first."""
        return [tuple(r) for r in self.db.execute(
            "SELECT id, title, updated FROM conversations ORDER BY updated DESC, id DESC")]

    def delete(self, conversation: int) -> None:
        self._write("DELETE FROM conversations WHERE id = ?", (conversation,))

    # -- messages ---------------------------------------------------------------------------

    def add_message(self, conversation: int, role: str, content: str, *,
                    kinds: list[list[str]] | None = None, stats: dict[str, Any] | None = None,
                    partial: int = COMPLETE) -> int:
        now = time.time()
        cur = self._write(
            "INSERT INTO messages (conversation_id, role, content, kinds, stats, partial, "
            "created) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (conversation, role, content, _json(kinds), _json(stats), int(partial), now))
        self._write("UPDATE conversations SET updated = ? WHERE id = ?", (now, conversation))
        return int(cur.lastrowid or 0)

    def update_message(self, message_id: int, content: str, *,
                       kinds: list[list[str]] | None = None, stats: dict[str, Any] | None = None,
                       partial: int = COMPLETE) -> None:
        """The answer as it streams (partial=STREAMING), then complete (COMPLETE / STOPPED)."""
        self._write("UPDATE messages SET content = ?, kinds = ?, stats = ?, partial = ? "
                    "WHERE id = ?", (content, _json(kinds), _json(stats), int(partial),
                                     message_id))

    def messages(self, conversation: int) -> list[dict[str, Any]]:
        rows = self.db.execute(
            "SELECT role, content, kinds, stats, partial FROM messages "
            "WHERE conversation_id = ? ORDER BY id", (conversation,))
        return [dict(role=role, content=content,
                     kinds=json.loads(kinds) if kinds else None,
                     stats=json.loads(stats) if stats else None, partial=partial)
                for role, content, kinds, stats, partial in rows]

    def delete_message(self, message_id: int) -> None:
        self._write("DELETE FROM messages WHERE id = ?", (message_id,))

    def exists(self, conversation: int) -> bool:
        return self.db.execute("SELECT 1 FROM conversations WHERE id = ?",
                               (conversation,)).fetchone() is not None

    def delete_last_answer(self, conversation: int) -> None:
        """Regenerate replaces the last answer: forget it."""
        self._write("DELETE FROM messages WHERE id = (SELECT MAX(id) FROM messages "
                    "WHERE conversation_id = ? AND role = 'assistant')", (conversation,))

    # -- preferences ------------------------------------------------------------------------

    def get(self, key: str, default: Any = None) -> Any:
        row = self.db.execute("SELECT value FROM prefs WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else default

    def set(self, key: str, value: Any) -> None:
        self._write("INSERT INTO prefs (key, value) VALUES (?, ?) "
                    "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                    (key, json.dumps(value)))


def _connect(path: Path) -> sqlite3.Connection:
    """Open, check, and set up the file (raises sqlite3.DatabaseError for one that is not a
    database; OperationalError for one that cannot be written)."""
    db = sqlite3.connect(path)
    try:
        db.execute("PRAGMA journal_mode = WAL")  # a kill mid-write cannot damage the file
        db.execute("PRAGMA foreign_keys = ON")  # deleting a conversation drops its messages
        db.executescript(SCHEMA)
        ok = db.execute("PRAGMA quick_check").fetchone()
        if not ok or ok[0] != "ok":
            raise sqlite3.DatabaseError(f"quick_check: {ok[0] if ok else 'no answer'}")
        with db:
            db.execute("INSERT OR REPLACE INTO prefs (key, value) VALUES ('opened', ?)",
                       (json.dumps(time.time()),))  # a write now, not at the first message
    except sqlite3.Error:
        db.close()
        raise
    return db


def _json(value: Any) -> str | None:
    return json.dumps(value) if value is not None else None


def _title(text: str, width: int = 60) -> str:
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 1] + "…"
