"""The schedule as the dashboard reads it: the journal followed into a
:class:`~rmqdelay.core.schedule_index.ScheduleIndex`, so that a page, a count or a
message's history is a question to what is in memory, never a read of the journal
(the first page of a million pending in milliseconds).

:class:`ScheduleSource` opens its own connection and an
:class:`~rmqdelay.amqp.schedule_index_follow.IndexFollower` on the first question, waits
until the follower has read the whole journal, and then answers from the index as it
is kept up to date. After an action of the dashboard's own it waits until the journal
has been read to the end again, so the page after a cancel shows the cancel. A dropped
connection is opened again (and the journal read again) on the next question.

The first read of a big journal takes seconds, and sorting what it found (a million
pending: seconds more) is done in a worker thread, a chunk at a time, so the event loop
goes on serving meanwhile: a question waits :data:`READY_WAIT_S` at most, then gets
:class:`StillReading` ("reading the schedule: N records so far") for its page to show.
A broker user that may only read the journal is followed to the end a consumer at
``last`` hears (:attr:`ScheduleSource.exact` False: pages say they may be catching up).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

from starlette.concurrency import run_in_threadpool

from ..core.journal.records import JournalRecord
from ..core.journal.recurring import RecurringSchedule
from ..core.schedule_index import sort_taken
from ..settings import Settings

if TYPE_CHECKING:
    from aio_pika.abc import AbstractConnection

    from ..amqp.schedule_index_follow import IndexFollower
    from ..core.schedule_index import ScheduleIndex

__all__ = ["HISTORY_KINDS", "Row", "ScheduleSource", "StillReading", "numbered"]

HISTORY_KINDS = frozenset(("scheduled", "cancelled", "rescheduled", "claimed", "done"))
"""What a message's history shows: published (each copy) or retried, moved, cancelled,
claimed by a worker, handled."""
FIRST_READ_TIMEOUT_S = 120.0
"""How long a page waits for the first read of the journal (a million records: seconds)."""
READY_WAIT_S = 5.0
"""How long a question waits for the read and the sort before it is told how far they are."""
SORT_ASIDE = 20_000
"""Copies unsorted from this many on are sorted in a worker thread, not on the loop."""
CATCHING_UP = (
    "the broker user may only read the schedule journal (no write to it, so no marker of "
    "the dashboard's own to read back): this view is read to the end the stream showed and "
    "follows it, and may still be catching up with the last moments' writes"
)


class StillReading(Exception):
    """The schedule is not ready yet: how far its first read (or its sort) is."""

    def __init__(self, records: int, sorting: bool) -> None:
        self.records = records
        self.sorting = sorting
        text = f"reading the schedule: {records:,} records so far"
        super().__init__(text + (" (sorting what is pending)" if sorting else ""))


@dataclass(frozen=True)
class Row:
    record: JournalRecord
    copy: int
    """Which copy of its id this is (1-based, soonest first), of ``copies`` pending."""
    copies: int


def numbered(index: ScheduleIndex, rows: tuple[JournalRecord, ...], now_ms: int) -> list[Row]:
    """Each row with its place among its id's pending copies (an id sent again after a
    failed confirm, or retried, waits as several), from the index's few lookups per id:
    the view's ``copies_of`` regroups every copy after each record folded (a second at a
    million pending)."""
    out = []
    for record in rows:
        dues = [r.due_at_ms for r in index.copies(record.message_id, now_ms)]
        place = dues.index(record.due_at_ms) + 1 if record.due_at_ms in dues else 1
        out.append(Row(record, place, max(len(dues), 1)))
    return out


class ScheduleSource:
    """The dashboard's schedule index, followed live (see the module's docstring).
    Used from the dashboard's event loop only (the follower folds records on it)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._connection: AbstractConnection | None = None
        self._follower: IndexFollower | None = None
        self._reading: asyncio.Task[None] | None = None
        self._wanted = 1
        """Reads asked for: the first question, then one more after each action."""
        self._read_to = 0
        """The latest of them a finished read covers."""
        self._sorting = False

    @property
    def exact(self) -> bool:
        """False when the broker user may not write a marker: see :data:`CATCHING_UP`."""
        return self._follower is None or self._follower.exact

    @property
    def note(self) -> str | None:
        """What a page says about how current it is (None: as of the last question)."""
        return None if self.exact else CATCHING_UP

    async def index(self, now_ms: int, wait_s: float | None = None) -> ScheduleIndex:
        """The index, read to the end of the journal at least as of the first question
        or the dashboard's last action, and sorted. Raises :class:`StillReading` when
        that takes more than ``wait_s`` (default :data:`READY_WAIT_S`; the read goes
        on: ask again)."""
        wait_s = READY_WAIT_S if wait_s is None else wait_s
        connection = self._connection
        if self._read_to and (connection is None or connection.is_closed):
            self._wanted += 1  # dropped: opened again, and the journal read again
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
                raise StillReading(follower.records if follower else 0, self._sorting) from None
        assert self._follower is not None
        index = self._follower.index
        index.forget_due(now_ms)
        return index

    async def recurring(self, now_ms: int) -> list[RecurringSchedule]:
        """Every recurring schedule not removed, folded from the same journal."""
        await self.index(now_ms)
        assert self._follower is not None
        return self._follower.recurring.listed()

    async def _read(self, wanted: int) -> None:
        """Open (again) if needed, read to the end, sort what is new aside if much;
        then the reads asked for up to ``wanted`` are done."""
        connection = self._connection
        if self._follower is None or connection is None or connection.is_closed:
            await self._open()
        assert self._follower is not None
        follower = self._follower
        await follower.caught_up(max(FIRST_READ_TIMEOUT_S, self.settings.confirm_timeout))
        index = follower.index
        if index.unsorted() >= SORT_ASIDE:
            self._sorting = True
            try:
                index.put_sorted(await run_in_threadpool(sort_taken, index.take_unsorted()))
            finally:
                self._sorting = False
        self._read_to = max(self._read_to, wanted)

    async def warm(self, now_ms: int) -> None:
        """Read the journal and sort the index now (the app's start-up), so that the
        first page finds it ready: sorting a million pending takes seconds, once."""
        await self.index(now_ms, wait_s=FIRST_READ_TIMEOUT_S)

    async def _open(self) -> None:
        from ..amqp.connections import connect_async
        from ..amqp.schedule_index_follow import IndexFollower
        from ..core.journal.flows import require_journal

        await self._close_follower()
        require_journal(self.settings.layout, "the dashboard's Scheduled page")
        connection = await connect_async(self.settings, "dashboard")
        try:
            follower = IndexFollower(connection, self.settings.layout, sort_first_read=False)
            await follower.start()
        except BaseException:
            await connection.close()
            raise
        self._connection, self._follower = connection, follower

    def changed(self) -> None:
        """An action wrote to the journal: the next question waits until it is read."""
        self._wanted += 1

    async def close(self) -> None:
        reading, self._reading = self._reading, None
        if reading is not None and not reading.done():
            reading.cancel()
            await asyncio.gather(reading, return_exceptions=True)
        await self._close_follower()

    async def _close_follower(self) -> None:
        follower, self._follower = self._follower, None
        connection, self._connection = self._connection, None
        if follower is not None:
            await follower.close()
        if connection is not None and not connection.is_closed:
            await connection.close()
