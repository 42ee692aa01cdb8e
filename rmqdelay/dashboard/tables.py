"""The dashboard store's tables: their schema and indexes, a copy's row, and the
``copies`` table as the mapping a :class:`~rmqdelay.core.journal.view.ScheduleView`
writes its copies through (:class:`Copies`). The store that folds the journal into them
and answers the dashboard's questions is :mod:`.store`.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, MutableMapping

from ..core.journal.records import JournalRecord, decode_record, encode_record

__all__ = [
    "COPIES_INDEXES",
    "FLUSH_AT",
    "ID_INDEX",
    "INDEXES",
    "SCHEMA",
    "UPSERT",
    "Copies",
    "Row",
    "record_of",
    "row_of",
]

FLUSH_AT = 2000
"""Writes the copies hold back before they reach SQLite (one ``executemany``)."""

SCHEMA = """
CREATE TABLE IF NOT EXISTS copies (
    id TEXT NOT NULL, due INTEGER NOT NULL, dest TEXT NOT NULL, recorded INTEGER NOT NULL,
    key TEXT, live INTEGER NOT NULL, record BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS history (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL, record BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
"""
ID_INDEX = "CREATE UNIQUE INDEX IF NOT EXISTS copies_id ON copies (id, due)"
"""A copy is its id and due time: built first, as bodies and later writes look copies up."""
INDEXES = """
CREATE INDEX IF NOT EXISTS copies_soonest ON copies (live, due, id);
CREATE INDEX IF NOT EXISTS copies_newest ON copies (live, recorded DESC, id, due);
CREATE INDEX IF NOT EXISTS copies_dest_soonest ON copies (dest, live, due, id);
CREATE INDEX IF NOT EXISTS copies_dest_newest ON copies (dest, live, recorded DESC, id, due);
CREATE INDEX IF NOT EXISTS copies_key ON copies (key) WHERE key IS NOT NULL;
CREATE INDEX IF NOT EXISTS history_id ON history (id);
"""
COPIES_INDEXES = (
    "copies_id",
    "copies_soonest",
    "copies_newest",
    "copies_dest_soonest",
    "copies_dest_newest",
    "copies_key",
)
UPSERT = (
    "INSERT OR REPLACE INTO copies (id, due, dest, recorded, key, live, record) "
    "VALUES (?, ?, ?, ?, ?, ?, ?)"
)
Row = tuple[str, int, str, int, str | None, int, bytes]


def row_of(record: JournalRecord, live: bool, line: bytes | None = None) -> Row:
    return (
        record.message_id,
        record.due_at_ms,
        record.destination,
        record.recorded_at_ms,
        record.key,
        int(live),
        encode_record(record) if line is None else line,
    )


def record_of(blob: bytes) -> JournalRecord:
    record = decode_record(blob)
    assert record is not None, "a row holds a record this version wrote"
    return record


class Copies(MutableMapping[tuple[str, int], JournalRecord]):
    """A view's copies as the ``copies`` table: what the view sets is written (with
    ``live`` 1: the store sets it right after the record, :meth:`ScheduleStore.add`),
    a few thousand at a time, and read back from what waits first."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db
        self._put: dict[tuple[str, int], JournalRecord | None] = {}
        """Writes not in SQLite yet: a record, or None for a deletion."""

    def flush(self) -> None:
        if not self._put:
            return
        put, self._put = self._put, {}
        rows = [row_of(r, True) for r in put.values() if r is not None]
        gone = [key for key, r in put.items() if r is None]
        if gone:
            self.db.executemany("DELETE FROM copies WHERE id = ? AND due = ?", gone)
        if rows:
            self.db.executemany(UPSERT, rows)

    def __getitem__(self, key: tuple[str, int]) -> JournalRecord:
        if key in self._put:
            found = self._put[key]
            if found is None:
                raise KeyError(key)
            return found
        row = self.db.execute("SELECT record FROM copies WHERE id = ? AND due = ?", key).fetchone()
        if row is None:
            raise KeyError(key)
        return record_of(row[0])

    def __setitem__(self, key: tuple[str, int], record: JournalRecord) -> None:
        self._put[key] = record
        if len(self._put) >= FLUSH_AT:
            self.flush()

    def __delitem__(self, key: tuple[str, int]) -> None:
        if key not in self:
            raise KeyError(key)
        self._put[key] = None

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, tuple):
            return False
        if key in self._put:
            return self._put[key] is not None
        found = self.db.execute("SELECT 1 FROM copies WHERE id = ? AND due = ?", key).fetchone()
        return found is not None

    def __iter__(self) -> Iterator[tuple[str, int]]:
        self.flush()
        yield from self.db.execute("SELECT id, due FROM copies").fetchall()

    def __len__(self) -> int:
        self.flush()
        return int(self.db.execute("SELECT count(*) FROM copies").fetchone()[0])

    def of(self, message_id: str) -> list[JournalRecord]:
        """The id's copies, soonest first."""
        self.flush()
        rows = self.db.execute(
            "SELECT record FROM copies WHERE id = ? ORDER BY due", (message_id,)
        ).fetchall()
        return [record_of(blob) for (blob,) in rows]

    def discard_pending(self) -> None:
        """Forget the writes not in SQLite yet (the store is cleared)."""
        self._put.clear()

    def drop_due_before(self, cutoff_ms: int) -> None:
        """Forget the copies due before ``cutoff_ms`` (see ``ScheduleView.expire``)."""
        self.flush()
        self.db.execute("DELETE FROM copies WHERE due < ?", (cutoff_ms,))
