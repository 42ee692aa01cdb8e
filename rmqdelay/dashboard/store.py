"""The dashboard's schedule on disk: the journal's state in SQLite, a page a query.

The dashboard answers "the next 50", counts per destination and per due window, and a
message's history, many times a minute, at a million pending. Held in Python, a million
copies took a gigabyte; here they are rows of an embedded SQLite file (the standard
library's ``sqlite3``): the process holds the small ``core`` (tombstones, keys,
recurring schedules) and SQLite's page cache, and a page is an index walk.

What is pending is the journal's fold, never re-derived: the store is a
:class:`~rmqdelay.core.journal.state.JournalState` whose view keeps its copies in
the ``copies`` table (:class:`~.tables.Copies`, a mapping the view writes through). After each
record, the copies it can have changed (its id's, and a replaced key's previous
message's) get their ``live`` column set from the view's own verdicts (cancelled,
hidden under a key): a page lists exactly what the view's ``pending`` would, in the
same order (tests/unit/test_dashboard_store.py).

The file keeps the journal offset its state covers, committed with it: a restarted
dashboard opens it and reads only the journal after it (:mod:`.follow`).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..core.journal.checkpoint import decode_entries, with_body, without_body
from ..core.journal.records import JournalRecord, encode_record
from ..core.journal.state import JournalState
from ..core.journal.view import ScheduleView
from .pages import BUCKETS, Page, PageQuery, cursor, parse_cursor, place
from .tables import (
    COPIES_INDEXES,
    FLUSH_AT,
    ID_INDEX,
    INDEXES,
    SCHEMA,
    UPSERT,
    Copies,
    Row,
    record_of,
)

__all__ = ["FORMAT", "ScheduleStore"]

FORMAT = 2
"""The file's layout; a file of another is read afresh from the journal."""


class ScheduleStore:
    """The journal's state in a SQLite file (``":memory:"`` for none), and the
    dashboard's questions to it. One open transaction, committed by :meth:`save` with
    the journal offset it covers."""

    def __init__(self, path: str | Path = ":memory:") -> None:
        self.db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(SCHEMA)
        self.copies = Copies(self.db)
        self.state = JournalState(ScheduleView(copies=self.copies))
        self.offset: int | None = None
        """The journal offset the state covers up to (the next to read), once saved."""
        self.last_hash: str | None = None
        """The hash of the journal message before :attr:`offset`, as saved."""
        self._history: list[tuple[str, bytes]] = []
        self._indexed = False
        self.db.execute("BEGIN")
        self._ensure_indexes()  # a store fed record by record needs them from the first

    def _flush(self) -> None:
        """What waits in memory, written: the copies' writes and the history's."""
        self.copies.flush()
        if self._history:
            history, self._history = self._history, []
            self.db.executemany("INSERT INTO history (id, record) VALUES (?, ?)", history)

    @property
    def view(self) -> ScheduleView:
        return self.state.view

    # ------------------------------------------------------------------ the file

    def saved(self, identity: str) -> int | None:
        """The offset a file saved for ``identity`` (the prefix and the broker) covers,
        its state restored; None, and the file emptied, for one of another or none."""
        meta = dict(self.db.execute("SELECT name, value FROM meta").fetchall())
        if meta.get("format") != str(FORMAT) or meta.get("identity") != identity:
            self.clear()
            return None
        for entry in json.loads(meta["core"]):
            self.state.restore(entry)
        self._ensure_indexes()
        self.offset = int(meta["offset"])
        self.last_hash = meta.get("last") or None
        return self.offset

    def save(self, identity: str, offset: int, last_hash: str = "") -> None:
        """Commit the state as covering the journal up to ``offset``; ``last_hash`` names
        the message before it (a restart checks the journal still holds it)."""
        self._flush()
        core = json.dumps(list(self.state.core_entries()), separators=(",", ":"))
        values = {
            "format": str(FORMAT),
            "identity": identity,
            "offset": str(offset),
            "last": last_hash,
            "core": core,
        }
        self.db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", values.items())
        self.db.execute("COMMIT")
        self.db.execute("BEGIN")
        self.offset = offset

    def clear(self) -> None:
        """Forget everything (a fresh read follows). The copies' indexes go too: a
        checkpoint's copies go in faster without them (in due order: appended), and
        :meth:`loaded` builds them once."""
        self.copies.discard_pending()
        self._history.clear()
        for index in COPIES_INDEXES:
            self.db.execute(f"DROP INDEX IF EXISTS {index}")
        self._indexed = False
        for table in ("copies", "history", "meta"):
            self.db.execute(f"DELETE FROM {table}")
        self.state = JournalState(ScheduleView(copies=self.copies))
        self.offset = None

    def close(self) -> None:
        self.db.close()

    # ------------------------------------------------------------------ the fold

    def take_part(self, section: str, body: bytes) -> None:
        """One part of a checkpoint (core first, then copies, then bodies): copies go in
        by the thousand, as their lines (the columns read with one JSON parse of the
        part, no record made), ``live`` from the core already restored; the indexes are
        built once they are all in (:meth:`loaded`; the id's before the bodies)."""
        view = self.view
        if section == "core":
            for entry in decode_entries(body):
                self.state.restore(entry)
        elif section == "copies":
            self.db.executemany(UPSERT, self._rows(body))
        elif section == "bodies":
            self.db.execute(ID_INDEX)
            for entry in decode_entries(body):
                key = (str(entry["id"]), int(entry["due"]))
                row = self.db.execute(
                    "SELECT record FROM copies WHERE id = ? AND due = ?", key
                ).fetchone()
                if row is not None:
                    full = with_body(record_of(row[0]), entry)
                    self.db.execute(
                        "UPDATE copies SET record = ? WHERE id = ? AND due = ?",
                        (encode_record(full), *key),
                    )
        view.loaded = None

    def _rows(self, body: bytes) -> list[Row]:
        """A copies part's rows: ``live`` unless a tombstone names the copy or its key's
        verdict hides it (:meth:`verdict`, without making the record)."""
        lines = body.split(b"\n")
        objects = json.loads(b"[" + b",".join(lines) + b"]")
        cancelled, hides = self.view.cancelled, self.view.keys.hides
        rows: list[Row] = []
        for line, o in zip(lines, objects, strict=True):
            message_id, due, key = o["id"], o["due"], o.get("key")
            named = cancelled.get(message_id)
            live = (named is None or due not in named) and (key is None or not hides(message_id))
            rows.append((message_id, due, o.get("d", ""), o.get("t", 0), key, int(live), line))
        return rows

    def loaded(self) -> None:
        """The checkpoint is in: build the indexes now, once."""
        self._ensure_indexes()

    def _ensure_indexes(self) -> None:
        if not self._indexed:  # in the open transaction (``executescript`` would commit it)
            self.db.execute(ID_INDEX)
            for statement in filter(str.strip, INDEXES.split(";")):
                self.db.execute(statement)
            self._indexed = True

    def add(self, record: JournalRecord) -> None:
        """Fold one journal record as the view does, and set ``live`` on the copies it
        can have changed."""
        kind = record.kind
        if kind == "marker":
            return
        self._history.append((record.message_id, encode_record(without_body(record))))
        if len(self._history) >= FLUSH_AT:
            self._flush()
        view = self.view
        if kind == "scheduled" and record.key is None:
            view.add(record)  # this copy alone, recorded (again): live, unless stale
            self.state.recurring.add(record)
            return
        affected = [record.message_id]
        if kind == "scheduled" and record.key is not None:
            current = view.keys.current(record.key)
            if current is not None and current.message_id != record.message_id:
                affected.append(current.message_id)  # a replace can supersede it
        self.state.add(record)
        if kind in ("claimed", "done", "recurring"):
            return  # neither cancels nor hides a copy
        for message_id in affected:
            self._refresh(message_id)

    def verdict(self, record: JournalRecord) -> str | None:
        """Why a copy will not be handled (a message's page says it), None if it will."""
        view = self.view
        if view.is_cancelled(record.message_id, record.due_at_ms):
            return "cancelled"
        return "replaced or ignored under its key" if view.hidden(record) else None

    def _refresh(self, message_id: str) -> None:
        """Set ``live`` on each of the id's copies from the view's verdicts."""
        for record in self.copies.of(message_id):
            self.db.execute(
                "UPDATE copies SET live = ? WHERE id = ? AND due = ?",
                (int(self.verdict(record) is None), message_id, record.due_at_ms),
            )

    def forget(self, now_ms: int, horizon_ms: int) -> None:
        """Forget what is settled (as a checkpoint does), and the history of the ids
        that have no copy left."""
        self._flush()
        self.state.expire(now_ms, horizon_ms)
        self.db.execute("DELETE FROM history WHERE id NOT IN (SELECT id FROM copies)")

    # ------------------------------------------------------------------ questions

    def page(self, query: PageQuery, now_ms: int) -> Page:
        """One page of the pending copies matching ``query``, in its order: ``limit``
        rows or fewer, and the cursor of the next page when there are more."""
        if query.limit < 1:
            raise ValueError(f"a page holds at least one row, not limit={query.limit}")
        self._flush()
        after = parse_cursor(query.after, query.order)
        where, args = self._filters(query, now_ms)
        total = int(
            self.db.execute(f"SELECT count(*) FROM copies WHERE {where}", args).fetchone()[0]
        )
        if query.order == "soonest":
            if after is not None:
                where += " AND (due > ? OR (due = ? AND id > ?))"
                args += [after[0], after[0], after[1]]
            order = "due, id"
        else:
            if after is not None:
                recorded = -after[0]
                where += (
                    " AND (recorded < ? OR (recorded = ? AND (id > ? OR (id = ? AND due > ?))))"
                )
                args += [recorded, recorded, after[1], after[1], after[2]]  # type: ignore[misc]
            order = "recorded DESC, id, due"
        rows = self.db.execute(
            f"SELECT record FROM copies {self._walk(query)} WHERE {where} ORDER BY {order} LIMIT ?",
            [*args, query.limit + 1],
        ).fetchall()
        found = [record_of(blob) for (blob,) in rows]
        shown = tuple(found[: query.limit])
        more = len(found) > query.limit
        return Page(shown, cursor(place(shown[-1], query.order)) if more else None, total)

    def _walk(self, query: PageQuery) -> str:
        """The index a page walks in its order (SQLite would rather take the due range's
        and sort what it finds: at a million pending, a million rows a page); by key or
        id, a few rows, the planner's choice."""
        if not self._indexed or query.key is not None or query.message_id is not None:
            return ""
        name = "copies_dest" if query.destination is not None else "copies"
        return f"INDEXED BY {name}{'_newest' if query.order == 'newest' else '_soonest'}"

    @staticmethod
    def _filters(query: PageQuery, now_ms: int) -> tuple[str, list[Any]]:
        low = now_ms + 1 if query.due_from_ms is None else max(now_ms + 1, query.due_from_ms)
        where = "live = 1 AND due >= ?"
        args: list[Any] = [low]
        for column, value in (
            ("dest", query.destination),
            ("key", query.key),
            ("id", query.message_id),
        ):
            if value is not None:
                where += f" AND {column} = ?"
                args.append(value)
        if query.due_to_ms is not None:
            where += " AND due < ?"
            args.append(query.due_to_ms)
        return where, args

    def destinations(self) -> list[str]:
        """Every destination a copy held names, each found by one seek of the
        destination index (a page's filter list: counting them, as
        :meth:`by_destination` does, walks every pending copy)."""
        self._flush()
        rows = self.db.execute(
            "WITH RECURSIVE d(dest) AS (SELECT min(dest) FROM copies UNION ALL "
            "SELECT (SELECT min(dest) FROM copies WHERE dest > d.dest) FROM d "
            "WHERE d.dest IS NOT NULL) SELECT dest FROM d WHERE dest IS NOT NULL"
        ).fetchall()
        return [dest for (dest,) in rows]

    def by_destination(self, now_ms: int) -> dict[str, int]:
        """Pending copies per destination (destinations with none left out)."""
        self.copies.flush()
        rows = self.db.execute(
            "SELECT dest, count(*) FROM copies WHERE live = 1 AND due > ? GROUP BY dest "
            "ORDER BY dest",
            (now_ms,),
        ).fetchall()
        return {dest: int(n) for dest, n in rows if n}

    def due_buckets(self, now_ms: int) -> dict[str, int]:
        """Pending copies by when they fall due (:data:`~.pages.BUCKETS`)."""
        self.copies.flush()
        out: dict[str, int] = {}
        low = now_ms + 1
        for name, span in BUCKETS:
            if span is None:
                sql, args = "SELECT count(*) FROM copies WHERE live = 1 AND due >= ?", [low]
            else:
                high = now_ms + span + 1
                sql = "SELECT count(*) FROM copies WHERE live = 1 AND due >= ? AND due < ?"
                args = [low, high]
                low = high
            out[name] = int(self.db.execute(sql, args).fetchone()[0])
        return out

    def copies_pending(self, message_id: str, now_ms: int) -> list[JournalRecord]:
        """The id's pending copies, soonest first (an id sent again after a failed
        confirm, or retried, waits as several)."""
        return [
            r
            for r in self.copies.of(message_id)
            if r.due_at_ms > now_ms and self.verdict(r) is None
        ]

    def history(self, message_id: str) -> list[JournalRecord]:
        """Every record read for ``message_id`` since the checkpoint the store began
        from, in journal order: its publishes and retries, moves, cancels, claims and
        ``done`` (a copy the checkpoint held is its own record)."""
        self._flush()
        rows = self.db.execute(
            "SELECT record FROM history WHERE id = ? ORDER BY seq", (message_id,)
        ).fetchall()
        return [record_of(blob) for (blob,) in rows]

    def view_of(self, message_id: str) -> ScheduleView:
        """A view of one message: its copies, and the store's tombstones and keys, for
        the answers a message's page gives (its copies' states, a cancel's answer)."""
        view = self.view
        copies = {(r.message_id, r.due_at_ms): r for r in self.copies.of(message_id)}
        return ScheduleView(copies=copies, cancelled=view.cancelled, keys=view.keys)

    def __len__(self) -> int:
        """Copies held: pending, and due ones not yet forgotten."""
        return len(self.copies)

    def extend(self, records: Iterable[JournalRecord]) -> ScheduleStore:
        for record in records:
            self.add(record)
        return self
