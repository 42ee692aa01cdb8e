"""The schedule index fed from the journal stream, from its first record and then live.

A dashboard answers many pages from one fold: it reads the whole journal once into a
:class:`~rmqdelay.core.schedule_index.ScheduleIndex` and follows the stream after that
(a worker's :class:`~.journal.JournalTail`, started at the stream's first record), so a
page is a query of what is in memory, never a read of the journal.

A stream has no end to ask for: :meth:`IndexFollower.caught_up` appends a marker of its
own and waits until the tail reads it back, so everything confirmed before the call has
been folded (a page asked right after a cancel shows the cancel). A broker user refused
that write (read permission only) still follows: the end is then the stream's last
offset as a consumer at ``last`` hears it (:func:`~.journal.stream_end`), and
:attr:`IndexFollower.exact` is False, for a page to say it may still be catching up.
"""

from __future__ import annotations

import asyncio
import gc
from typing import TYPE_CHECKING

from ..core.clock import now_ms
from ..core.journal import flows
from ..core.journal.recurring import RecurringBook
from ..core.schedule_index import ScheduleIndex
from ..errors import JournalError
from .journal import JournalTail, run_journal_async, stream_end

if TYPE_CHECKING:
    from aio_pika.abc import AbstractConnection

    from ..core.journal.records import JournalRecord
    from ..core.layout import Layout

__all__ = ["IndexFollower"]


class IndexFollower:
    """Reads the whole journal into :attr:`index`, then keeps it up to date.

    The first read makes several objects per record and none in a cycle, and Python's
    collector walking them all again and again cost it four fifths of its time (a
    million records: about 12 s instead of 2.5 s under load); with ``pause_collector``
    (the default) the collector is off until the tail has read to the end as of
    :meth:`start`, and what the fold made is then frozen (``gc.freeze``), so later
    collections skip it. Pass False in a process that cannot have its collector paused.
    ``sort_first_read=False`` leaves what the first read added unsorted, for the caller
    to sort aside (:meth:`~rmqdelay.core.schedule_index.ScheduleIndex.take_unsorted`,
    in a worker thread) rather than on the event loop.
    """

    def __init__(
        self,
        connection: AbstractConnection,
        layout: Layout,
        *,
        pause_collector: bool = True,
        sort_first_read: bool = True,
    ) -> None:
        self.connection = connection
        self.layout = layout
        self.index = ScheduleIndex()
        self.recurring = RecurringBook()
        """The recurring schedules, folded from the same records."""
        self.exact = True
        """False once the broker user was refused a marker's write: reads go to the end
        :func:`~.journal.stream_end` heard, and the view may still be catching up."""
        self._waiting: dict[str, asyncio.Future[None]] = {}
        self._tail = JournalTail(
            connection, layout, self._fold, since_ms=0, on_marker=self._heard, read_only=True
        )
        self._pause = pause_collector
        self._sort_first_read = sort_first_read
        self._paused = False
        self._first_read_over = False
        self._first_read: asyncio.Task[None] | None = None

    def _fold(self, record: JournalRecord) -> None:
        self.index.add(record)
        self.recurring.add(record)

    @property
    def records(self) -> int:
        """Records folded so far (markers not counted)."""
        return self._tail.count

    async def start(self) -> IndexFollower:
        """Start reading at the stream's first record; :meth:`caught_up` tells when the
        read has come to the end. Raises :class:`~rmqdelay.errors.JournalError` when
        the journal's stream is missing."""
        if self._pause and gc.isenabled():
            gc.disable()
            self._paused = True
        self._first_read = asyncio.ensure_future(self._first_read_done())
        try:
            await self._tail.start()
        except BaseException:
            await self.close()
            raise
        self.exact = self._tail.wrote_marker
        return self

    async def _first_read_done(self) -> None:
        await self._tail.caught_up.wait()
        self._read_over()

    def _read_over(self) -> None:
        """Once, after the first read: what it added sorted now, with the collector
        still off, rather than in the first page (a million copies take seconds);
        then the collector on again, what the read made frozen."""
        if not self._first_read_over:
            self._first_read_over = True
            if self._sort_first_read:
                self.index.settle()
        self._collector_on()

    def _collector_on(self) -> None:
        if self._paused:
            self._paused = False
            gc.freeze()
            gc.enable()

    async def caught_up(self, timeout: float = 60.0) -> None:
        """Return once everything confirmed in the journal before this call is folded:
        a marker is appended and read back (refused that write, the end a consumer at
        ``last`` hears: see :attr:`exact`). Raises :class:`~rmqdelay.errors.JournalError`
        when it is not read back within ``timeout`` seconds (a first read of a big
        journal on a slow broker may need longer)."""
        import aiormq

        if self.exact:
            try:
                await self._marker_back(timeout)
                return
            except aiormq.exceptions.ChannelAccessRefused:
                self.exact = False
        try:
            end = await stream_end(self.connection, self._tail.name)
            await asyncio.wait_for(self._tail.read_to(end), timeout)
        except asyncio.TimeoutError:
            raise self._late(timeout) from None
        self._read_over()

    def _late(self, timeout: float) -> JournalError:
        return JournalError(
            f"the schedule journal was not read to its end within {timeout:g}s "
            f"({self.records:,} records read so far); try again with a longer timeout"
        )

    async def _marker_back(self, timeout: float) -> None:
        marker = flows.new_marker(now_ms())
        heard = asyncio.get_running_loop().create_future()
        self._waiting[marker.message_id] = heard
        try:
            await run_journal_async(flows.append(self.layout, [marker]), self.connection)
            await asyncio.wait_for(heard, timeout)
            self._read_over()  # the first read is over (its task may not have run yet)
        except asyncio.TimeoutError:
            raise self._late(timeout) from None
        finally:
            self._waiting.pop(marker.message_id, None)

    def _heard(self, marker_id: str) -> None:
        heard = self._waiting.get(marker_id)
        if heard is not None and not heard.done():
            heard.set_result(None)

    async def close(self) -> None:
        """Stop following; the index stays as it was read."""
        await self._tail.close()
        first, self._first_read = self._first_read, None
        if first is not None and not first.done():
            first.cancel()
            await asyncio.gather(first, return_exceptions=True)
        self._collector_on()
