"""The dashboard's store fed from the journal: its checkpoint once, then its tail, live.

A first start reads the latest checkpoint's parts into the store (:mod:`.store`), on a
connection and a thread of their own (a million copies take seconds of inserts, which
the event loop must not wait for), then follows the journal from the offset that
checkpoint covers (a worker's :class:`~rmqdelay.amqp.journal.JournalTail`). The store
is saved with the offset its state covers every :data:`SAVE_EVERY_S` and when it stops;
a restart opens it and reads only the journal after that offset, unless the journal no
longer holds it (deleted by its retention, or the stream made anew): then it starts
again from the latest checkpoint.

A stream has no end to ask for: :meth:`StoreFollower.caught_up` appends a marker of its
own and waits until the tail reads it back, so everything confirmed before the call has
been folded (a page asked right after a cancel shows the cancel). A broker user refused
that write (read permission only) still follows: the end is then the stream's last
offset as a consumer at ``last`` hears it (:func:`~rmqdelay.amqp.journal.stream_end`),
and :attr:`StoreFollower.exact` is False, for a page to say it may still be catching up.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from typing import TYPE_CHECKING

from ..amqp.checkpoints import CHECKPOINT_READ_TIMEOUT_S
from ..amqp.journal import JournalTail, read_once, run_journal_async, stream_end
from ..core.clock import now_ms
from ..core.journal import reading
from ..core.journal.checkpoint import GENESIS, SECTIONS, Pointer
from ..core.journal.records import journal_name
from ..core.journal.steps import Read, Start, StreamMessage, stream_offset
from ..errors import JournalError
from ..settings import Settings
from .store import ScheduleStore

if TYPE_CHECKING:
    from aio_pika.abc import AbstractConnection

    from ..core.journal.records import JournalRecord

__all__ = ["SAVE_EVERY_S", "StoreFollower", "identity_of"]

log = logging.getLogger("rmqdelay.dashboard")
SAVE_EVERY_S = 5.0
"""How often the store is committed with the offset it covers, while records come."""


def identity_of(settings: Settings) -> str:
    """What a saved store was read from: the prefix, on which broker and vhost (the URL
    without its credentials)."""
    return f"{settings.layout.prefix}@{settings.masked_url}"


class StoreFollower:
    """The store, read from the checkpoint and the journal and kept up to date."""

    def __init__(
        self, connection: AbstractConnection, settings: Settings, store: ScheduleStore
    ) -> None:
        self.connection = connection
        self.settings = settings
        self.layout = settings.layout
        self.store = store
        self.identity = identity_of(settings)
        self.exact = True
        """False once the broker user was refused a marker's write: reads go to the end
        :func:`~rmqdelay.amqp.journal.stream_end` heard, and pages may still catch up."""
        self.pointer: Pointer = GENESIS
        """The checkpoint the store began from (GENESIS: none, or a saved store)."""
        self.tail: JournalTail | None = None
        self._waiting: dict[str, asyncio.Future[None]] = {}
        self._saver: asyncio.Task[None] | None = None
        self._dirty = False

    @property
    def records(self) -> int:
        """Records folded from the journal since the start (markers not counted)."""
        return self.tail.count if self.tail is not None else 0

    async def start(self) -> StoreFollower:
        """Open the saved store, or read the latest checkpoint into it; then follow the
        journal from the offset its state covers. Raises
        :class:`~rmqdelay.errors.JournalError` when the journal's stream is missing."""
        reading.require_journal(self.layout, "the dashboard's Scheduled page")
        start: Start | None = None
        saved = self.store.saved(self.identity)
        if saved is not None and await self._still_there(saved):
            start = saved
            log.info("the schedule's store reads on from journal offset %d", saved)
        else:
            self.store.clear()
            self.pointer = await asyncio.to_thread(self._load_checkpoint)
            self.store.loaded()
            if self.pointer.covers is not None:
                start = self.pointer.covers
            else:  # no checkpoint yet: the journal since now - max_delay
                start = stream_offset(now_ms() - self.layout.max_delay_ms)
        tail = JournalTail(
            self.connection,
            self.layout,
            self._fold,
            start=start,
            on_marker=self._heard,
            read_only=True,
        )
        self.tail = tail
        await tail.start()
        self.exact = tail.wrote_marker
        self._saver = asyncio.ensure_future(self._save_often())
        return self

    def _load_checkpoint(self) -> Pointer:
        """The latest checkpoint's parts into the store, on a pika connection of this
        thread's own (closed after)."""
        timeout = max(self.settings.confirm_timeout, CHECKPOINT_READ_TIMEOUT_S)
        flow = reading.load_sections(self.layout, self.store.take_part, SECTIONS, timeout=timeout)
        return read_once(self.settings, flow)

    async def _still_there(self, offset: int) -> bool:
        """Whether the journal still holds what the saved store read last: the message
        before ``offset``, as saved (retention deleted it, or the stream was made anew:
        start again from the checkpoint)."""
        if offset <= 0:
            return False
        expected = self.store.last_hash
        got: list[StreamMessage] = []

        def take(message: StreamMessage) -> bool:
            got.append(message)
            return True

        step = Read(journal_name(self.layout), offset - 1, take, 5.0, prefetch=1)
        end = await run_journal_async(_one(step), self.connection)
        if end != "done" or not got or got[0].offset != offset - 1:
            return False
        return expected is None or _hash(got[0].body) == expected

    def _fold(self, record: JournalRecord) -> None:
        self.store.add(record)
        self._dirty = True

    async def _save_often(self) -> None:
        while True:
            await asyncio.sleep(SAVE_EVERY_S)
            self.save()

    def save(self) -> None:
        """Commit the store as covering what the tail has folded."""
        tail = self.tail
        if tail is None or tail.offset < 0 or not self._dirty:
            return
        self._dirty = False
        self.store.save(self.identity, tail.offset + 1, _hash(tail.last_body))

    async def caught_up(self, timeout: float = 60.0) -> None:
        """Return once everything confirmed in the journal before this call is folded:
        a marker is appended and read back (refused that write, the end a consumer at
        ``last`` hears: see :attr:`exact`). Raises :class:`~rmqdelay.errors.JournalError`
        when it is not read back within ``timeout`` seconds."""
        import aiormq

        assert self.tail is not None
        if self.exact:
            try:
                await self._marker_back(timeout)
                self.save()
                return
            except aiormq.exceptions.ChannelAccessRefused:
                self.exact = False
        try:
            end = await stream_end(self.connection, self.tail.name)
            await asyncio.wait_for(self.tail.read_to(end), timeout)
        except asyncio.TimeoutError:
            raise self._late(timeout) from None
        self.save()

    def _late(self, timeout: float) -> JournalError:
        return JournalError(
            f"the schedule journal was not read to its end within {timeout:g}s "
            f"({self.records:,} records read so far); try again with a longer timeout"
        )

    async def _marker_back(self, timeout: float) -> None:
        marker = reading.new_marker(now_ms())
        heard = asyncio.get_running_loop().create_future()
        self._waiting[marker.message_id] = heard
        try:
            await run_journal_async(reading.append(self.layout, [marker]), self.connection)
            await asyncio.wait_for(heard, timeout)
        except asyncio.TimeoutError:
            raise self._late(timeout) from None
        finally:
            self._waiting.pop(marker.message_id, None)

    def _heard(self, marker_id: str) -> None:
        heard = self._waiting.get(marker_id)
        if heard is not None and not heard.done():
            heard.set_result(None)

    async def close(self) -> None:
        """Stop following; the store is saved as it was read."""
        saver, self._saver = self._saver, None
        if saver is not None:
            saver.cancel()
            await asyncio.gather(saver, return_exceptions=True)
        self.save()
        tail, self.tail = self.tail, None
        if tail is not None:
            await tail.close()


def _hash(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def _one(step: Read) -> reading.JournalFlow[str]:
    end = yield step
    return str(end)
