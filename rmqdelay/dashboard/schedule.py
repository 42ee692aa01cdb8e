"""The schedule as the dashboard reads it: the journal followed into a store on disk
(:class:`~.store.ScheduleStore`, SQLite), so that a page, a count or a message's history
is a question to it, never a read of the journal (the first page of a million pending
in milliseconds, in a few hundred MB however many are pending).

:class:`ScheduleSource` opens its own connection and a :class:`~.follow.StoreFollower`
on the first question, waits until the follower has read the journal to its end, and
then answers from the store as it is kept up to date. After an action of the
dashboard's own it waits until the journal has been read to the end again, so the page
after a cancel shows the cancel. A dropped connection is opened again (and the journal
read on from where the store got to) on the next question.

A first start reads the latest checkpoint into the store (seconds at a million pending,
in a thread); a question waits :data:`READY_WAIT_S` at most, then gets
:class:`StillReading` ("reading the schedule: ...") for its page to show. The store is
a file (``dashboard_state``, by default in the user's cache), so a restarted dashboard
reads only the journal written since it last saved.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..core.journal.records import JournalRecord
from ..core.journal.recurring import RecurringSchedule
from ..settings import Settings
from .store import ScheduleStore

if TYPE_CHECKING:
    from aio_pika.abc import AbstractConnection

    from ..worker.checkpoints import Checkpointer
    from .follow import StoreFollower

__all__ = [
    "HISTORY_KINDS",
    "PREVIEW_AFTER_S",
    "Row",
    "ScheduleSource",
    "StillReading",
    "numbered",
    "state_path",
]

HISTORY_KINDS = frozenset(("scheduled", "cancelled", "rescheduled", "claimed", "done"))
"""What a message's history shows: published (each copy) or retried, moved, cancelled,
claimed by a worker, handled."""
FIRST_READ_TIMEOUT_S = 120.0
"""How long a page waits for the first read of the journal (a million records: seconds)."""
READY_WAIT_S = 5.0
"""How long a question waits for the read before it is told how far it is."""
FORGET_EVERY_MS = 60_000
"""How often the store forgets what is settled (as a checkpoint does)."""
CATCHING_UP = (
    "the broker user may only read the schedule journal (no write to it, so no marker of "
    "the dashboard's own to read back): this view is read to the end the stream showed and "
    "follows it, and may still be catching up with the last moments' writes"
)


def state_path(settings: Settings) -> Path:
    """Where the dashboard keeps its store: ``dashboard_state``, or a file in the user's
    cache named after the prefix and the broker (several dashboards, several files)."""
    if settings.dashboard_state is not None:
        return Path(settings.dashboard_state)
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rmqdelay"
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError:  # no home to write to: a file of this run's own
        base = Path(tempfile.gettempdir())
    broker = hashlib.sha256(settings.masked_url.encode()).hexdigest()[:12]
    return base / f"dashboard-{settings.layout.prefix}-{broker}.sqlite3"


class StillReading(Exception):
    """The schedule is not ready yet: how far its first read is."""

    def __init__(self, records: int, loading: bool) -> None:
        self.records = records
        self.loading = loading
        text = (
            "reading the schedule: the latest checkpoint"
            if loading
            else f"reading the schedule: {records:,} records so far"
        )
        super().__init__(text)


@dataclass(frozen=True)
class Row:
    record: JournalRecord
    copy: int
    """Which copy of its id this is (1-based, soonest first), of ``copies`` pending."""
    copies: int


def numbered(store: ScheduleStore, rows: tuple[JournalRecord, ...], now_ms: int) -> list[Row]:
    """Each row with its place among its id's pending copies (an id sent again after a
    failed confirm, or retried, waits as several): a lookup per row."""
    out = []
    for record in rows:
        dues = [r.due_at_ms for r in store.copies_pending(record.message_id, now_ms)]
        place = dues.index(record.due_at_ms) + 1 if record.due_at_ms in dues else 1
        out.append(Row(record, place, max(len(dues), 1)))
    return out


PREVIEW_AFTER_S = 0.3
"""How long the first page waits for the store before it is read the other way."""
PREVIEW_FOR_MS = 2000
"""How long a first page read before the store is (:meth:`ScheduleSource.preview`) is
shown again rather than read again."""


class ScheduleSource:
    """The dashboard's schedule store, followed live (see the module's docstring).
    Used from the dashboard's event loop only (the follower folds records on it)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._connection: AbstractConnection | None = None
        self._follower: StoreFollower | None = None
        self._checkpoints: Checkpointer | None = None
        self._store: ScheduleStore | None = None
        self._reading: asyncio.Task[None] | None = None
        self._wanted = 1
        """Reads asked for: the first question, then one more after each action."""
        self._read_to = 0
        """The latest of them a finished read covers."""
        self._forgot_ms = 0
        self._preview: tuple[int, int, list[JournalRecord]] | None = None

    @property
    def exact(self) -> bool:
        """False when the broker user may not write a marker: see :data:`CATCHING_UP`."""
        return self._follower is None or self._follower.exact

    @property
    def note(self) -> str | None:
        """What a page says about how current it is (None: as of the last question)."""
        return None if self.exact else CATCHING_UP

    async def index(self, now_ms: int, wait_s: float | None = None) -> ScheduleStore:
        """The store, read to the end of the journal at least as of the first question
        or the dashboard's last action. Raises :class:`StillReading` when that takes
        more than ``wait_s`` (default :data:`READY_WAIT_S`; the read goes on: ask
        again)."""
        wait_s = READY_WAIT_S if wait_s is None else wait_s
        connection = self._connection
        if self._read_to and (connection is None or connection.is_closed):
            self._wanted += 1  # dropped: opened again, and the journal read on
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while self._read_to < self._wanted:
            if self._reading is None or self._reading.done():
                self._reading = asyncio.ensure_future(self._read(self._wanted))
            reading = self._reading
            try:
                await asyncio.wait_for(asyncio.shield(reading), max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                follower = self._follower
                tail = follower.tail if follower is not None else None
                raise StillReading(follower.records if follower else 0, tail is None) from None
        assert self._store is not None
        if now_ms - self._forgot_ms >= FORGET_EVERY_MS:
            self._forgot_ms = now_ms
            self._store.forget(now_ms, self.settings.layout.max_delay_ms)
        return self._store

    async def preview(self, limit: int, now_ms: int) -> list[JournalRecord]:
        """While the store is first read (seconds at a million pending): the first page
        soonest first as ``scheduled list --limit`` reads it, the latest checkpoint's
        soonest copies and the journal after it, on a thread and a connection of its
        own; read again after :data:`PREVIEW_FOR_MS`."""
        from ..amqp.journal import read_once
        from ..core.journal.flows import list_scheduled

        kept = self._preview
        if kept is not None and now_ms - kept[0] < PREVIEW_FOR_MS and kept[1] >= limit:
            return kept[2][:limit]
        flow = list_scheduled(
            self.settings.layout, limit=limit, timeout=self.settings.confirm_timeout
        )
        rows = await asyncio.to_thread(read_once, self.settings, flow)
        self._preview = (now_ms, limit, rows)
        return rows

    async def recurring(self, now_ms: int) -> list[RecurringSchedule]:
        """Every recurring schedule not removed, folded from the same journal."""
        store = await self.index(now_ms)
        return store.state.recurring.listed()

    async def _read(self, wanted: int) -> None:
        """Open (again) if needed, read to the end; then the reads asked for up to
        ``wanted`` are done."""
        connection = self._connection
        if self._follower is None or connection is None or connection.is_closed:
            await self._open()
        assert self._follower is not None
        await self._follower.caught_up(max(FIRST_READ_TIMEOUT_S, self.settings.confirm_timeout))
        self._read_to = max(self._read_to, wanted)

    async def warm(self, now_ms: int) -> None:
        """Read the journal now (the app's start-up), so that the first page finds the
        store ready: a first read of a million pending takes seconds, once."""
        await self.index(now_ms, wait_s=FIRST_READ_TIMEOUT_S)

    async def _open(self) -> None:
        from ..amqp.connections import connect_async
        from ..core.journal.reading import require_journal
        from ..worker.checkpoints import Checkpointer
        from .follow import StoreFollower

        await self._close_follower()
        require_journal(self.settings.layout, "the dashboard's Scheduled page")
        if self._store is None:
            self._store = ScheduleStore(state_path(self.settings))
        connection = await connect_async(self.settings, "dashboard")
        try:
            follower = StoreFollower(connection, self.settings, self._store)
            self._follower = follower
            await follower.start()
        except BaseException:
            self._follower = None
            await connection.close()
            raise
        self._connection = connection
        if follower.tail is not None and follower.exact:  # a dashboard writes checkpoints too
            self._checkpoints = Checkpointer(self.settings)
            self._checkpoints.start(connection, follower.tail, follower.pointer)

    def changed(self) -> None:
        """An action wrote to the journal: the next question waits until it is read."""
        self._wanted += 1

    async def close(self) -> None:
        reading, self._reading = self._reading, None
        if reading is not None and not reading.done():
            reading.cancel()
            await asyncio.gather(reading, return_exceptions=True)
        await self._close_follower()
        store, self._store = self._store, None
        if store is not None:
            store.close()

    async def _close_follower(self) -> None:
        checkpoints, self._checkpoints = self._checkpoints, None
        if checkpoints is not None:
            await checkpoints.stop()
        follower, self._follower = self._follower, None
        connection, self._connection = self._connection, None
        if follower is not None:
            await follower.close()
        if connection is not None and not connection.is_closed:
            await connection.close()
