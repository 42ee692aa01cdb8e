"""The journal's two steps carried out on pika and on aio-pika, and a worker's tail.

What to read and write, and what it means, is :mod:`rmqdelay.core.journal`: here are only
:class:`~rmqdelay.core.journal.steps.Append` (publish on a confirm channel) and
:class:`~rmqdelay.core.journal.steps.Read` (a stream consumer, :mod:`.streams`), once
per client, :class:`JournalWriter` (a worker's claims and ``done`` records) and
:class:`JournalTail`, which follows the journal for a worker from its latest checkpoint.

aio-pika and aiormq are imported by the asyncio functions that use them: the sync side
(``rmqdelay publish``, ``cancel``, ``scheduled list``) does without them, and they cost
the start-up of every such command a good part of its time.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar, cast

import pika
import pika.exceptions

from ..core.clock import now_ms
from ..core.failures import journal_missing
from ..core.journal import reading
from ..core.journal.reading import JournalFlow, UntilMarker
from ..core.journal.records import JournalRecord
from ..core.journal.steps import Append, JournalStep, Read, ReadEnd, Start, StreamMessage
from ..core.layout import Layout
from ..core.steps import Steps
from ..settings import Settings
from .aio_streams import AsyncStream
from .blocking import close_connection
from .connections import connect_blocking
from .streams import PREFETCH, Readers, offset_of

if TYPE_CHECKING:
    from aio_pika.abc import (
        AbstractChannel,
        AbstractConnection,
        AbstractExchange,
        AbstractIncomingMessage,
    )


__all__ = [
    "JournalTail",
    "JournalWriter",
    "append_records",
    "journal_step_async",
    "read_once",
    "run_journal",
    "run_journal_async",
    "stream_end",
    "write_probe",
]

T = TypeVar("T")


# ------------------------------------------------------------------ sync (pika)


def run_journal(
    flow: JournalFlow[T],
    connection: pika.BlockingConnection,
    open_reader: Callable[[], pika.BlockingConnection],
) -> T:
    """Carry out a journal flow: appends on ``connection``, reads on one connection from
    ``open_reader`` kept for the flow and closed after it (:class:`~.streams.Readers`)."""
    readers = Readers(open_reader)

    def do(step: JournalStep) -> object:
        if isinstance(step, Append):
            return append_records(connection, step)
        return readers.read(step)

    try:
        return reading.run(flow, do)
    finally:
        readers.close()


def read_once(settings: Settings, flow: JournalFlow[T], *, name: str = "journal") -> T:
    """Carry out a flow that ends by reading the journal (``scheduled list``, ``cancel``)
    on one connection of its own, its appends and its reads alike (a publisher's
    connection and a reader's second one cost a command a handshake more); closed
    after."""
    connection = connect_blocking(settings, name)
    try:
        return run_journal(flow, connection, lambda: connection)
    finally:
        close_connection(connection, settings.confirm_timeout)


def append_records(connection: pika.BlockingConnection, step: Append) -> bool:
    """Carry out an :class:`Append` on a channel of its own."""
    channel = connection.channel()
    try:
        channel.confirm_delivery()
        for write in step.writes:
            properties = pika.BasicProperties(**write.properties)
            channel.basic_publish(step.stream, "", write.body, properties, mandatory=True)
    except (pika.exceptions.UnroutableError, pika.exceptions.NackError):
        return False
    except pika.exceptions.ChannelClosedByBroker as exc:
        if exc.reply_code == 404:  # no such exchange
            return False
        raise
    finally:
        if channel.is_open:
            channel.close()
    return True


# ------------------------------------------------------------------ asyncio (aio-pika)


async def run_journal_async(flow: JournalFlow[T], connection: AbstractConnection) -> T:
    """:func:`run_journal` for asyncio code: each step on a channel of its own."""
    steps = Steps(flow)
    step = steps.next()
    while step is not None:
        answer = await journal_step_async(connection, cast(JournalStep, step))
        step = steps.next(answer)
    return cast(T, steps.value)


async def journal_step_async(connection: AbstractConnection, step: JournalStep) -> object:
    """Carry out a journal step on ``connection``, on a channel of its own."""
    if isinstance(step, Append):
        return await _append_async(connection, step)
    return await _read_async(connection, step)


async def _append_async(connection: AbstractConnection, step: Append) -> bool:
    import aio_pika
    import aiormq

    channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
    try:
        exchange = await channel.get_exchange(step.stream, ensure=False)
        await asyncio.gather(
            *(
                exchange.publish(
                    aio_pika.Message(write.body, **write.properties),
                    routing_key="",
                    mandatory=True,
                )
                for write in step.writes
            )
        )
    except (aiormq.exceptions.DeliveryError, aiormq.exceptions.ChannelNotFoundEntity):
        return False  # returned (PublishError is a DeliveryError), nacked, or no exchange
    finally:
        await _close_quietly(channel)
    return True


async def _read_async(connection: AbstractConnection, step: Read) -> ReadEnd:
    """A one-off read: a consumer on a channel of its own, closed after."""
    stream = AsyncStream()
    try:
        return await stream.read(connection, step)
    finally:
        await stream.close()


async def stream_end(connection: AbstractConnection, name: str, *, first_s: float = 2.0) -> int:
    """The offset of the stream's last message as of now (-1: empty), learned without
    writing to it, for a reader that may not append a marker of its own.

    A consumer at ``last`` is sent the stream's last chunk at once; the end is the
    highest offset heard before it goes quiet (``first_s`` for the first delivery,
    a tenth of that after). A write landing meanwhile makes it a later end, never an
    earlier one: what was confirmed before the call is at or below it.
    """
    channel = await connection.channel()
    seen = -1
    heard = asyncio.Event()

    async def take(message: AbstractIncomingMessage) -> None:
        nonlocal seen
        seen = max(seen, offset_of(message.headers, seen))
        heard.set()
        await message.ack()

    try:
        await channel.set_qos(prefetch_count=PREFETCH)
        queue = await channel.get_queue(name, ensure=False)
        await queue.consume(take, arguments={"x-stream-offset": "last"})
        wait = first_s
        while True:
            heard.clear()
            try:
                await asyncio.wait_for(heard.wait(), wait)
            except asyncio.TimeoutError:
                return seen
            wait = first_s / 10
    finally:
        await _close_quietly(channel)


async def _close_quietly(channel: AbstractChannel) -> None:
    import aiormq

    if not channel.is_closed:
        with contextlib.suppress(aiormq.exceptions.AMQPError, RuntimeError):
            await channel.close()


async def write_probe(connection: AbstractConnection, layout: Layout) -> None:
    """:func:`rmqdelay.core.journal.flows.probe` on ``connection``."""
    from ..core.journal.flows import probe

    await run_journal_async(probe(layout), connection)


class JournalWriter:
    """Appends records on a confirm channel of its own, kept open: a worker writes a
    claim before each keyed handler and a ``done`` after it, and a channel per write
    (as :func:`run_journal_async` opens) would double each one's round trips.

    Writes asked for in the same turn of the event loop go out as one stream message
    (up to ``RECORDS_PER_WRITE`` records) with one confirm: a worker handling keyed
    messages 64 at a time claims them about as fast as it receives them.
    """

    def __init__(self, connection: AbstractConnection, layout: Layout, timeout: float) -> None:
        self.name = reading.require_journal(layout, "writing to the schedule journal")
        self.connection = connection
        self.layout = layout
        self.timeout = timeout
        self.channel: AbstractChannel | None = None
        self._exchange: AbstractExchange | None = None
        self._pending: list[JournalRecord] = []
        self._waiting: list[asyncio.Future[None]] = []
        self._scheduled = False
        self._sending: set[asyncio.Future[list[None]]] = set()

    async def open(self) -> JournalWriter:
        self.channel = await self.connection.channel(publisher_confirms=True, on_return_raises=True)
        self._exchange = await self.channel.get_exchange(self.name, ensure=False)
        return self

    async def write(self, records: list[JournalRecord]) -> None:
        """Append ``records`` and wait for the confirm of the stream message holding
        them; raise :class:`~rmqdelay.errors.JournalError` when it is returned, nacked
        or late."""
        loop = asyncio.get_running_loop()
        confirmed: asyncio.Future[None] = loop.create_future()
        self._pending += records
        self._waiting.append(confirmed)
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._flush)
        await confirmed

    def _flush(self) -> None:
        """Send what was asked for since the last flush, and tell each writer."""
        from ..core.journal.records import RECORDS_PER_WRITE

        self._scheduled = False
        records, waiting = self._pending, self._waiting
        self._pending, self._waiting = [], []
        chunks = [
            records[i : i + RECORDS_PER_WRITE] for i in range(0, len(records), RECORDS_PER_WRITE)
        ]
        sent = asyncio.ensure_future(asyncio.gather(*(self._send(c) for c in chunks)))

        def tell(done: asyncio.Future[list[None]]) -> None:
            error = None if done.cancelled() else done.exception()
            for future in waiting:
                if future.done():
                    continue
                if done.cancelled():
                    future.cancel()
                elif error is not None:
                    future.set_exception(error)
                else:
                    future.set_result(None)

        self._sending.add(sent)
        sent.add_done_callback(self._sending.discard)
        sent.add_done_callback(tell)

    async def _send(self, records: list[JournalRecord]) -> None:
        import aio_pika
        import aiormq

        from ..core.journal.records import encode_records
        from ..core.journal.steps import journal_properties
        from ..errors import JournalError

        exchange = self._exchange
        if exchange is None or self.channel is None or self.channel.is_closed:
            raise JournalError("the schedule journal's write channel is closed")
        message = aio_pika.Message(
            encode_records(records), **journal_properties(f"journal-{records[0].message_id}")
        )
        try:
            await exchange.publish(message, routing_key="", mandatory=True, timeout=self.timeout)
        except asyncio.TimeoutError:
            raise JournalError(
                f"a journal write was not confirmed within {self.timeout:g}s"
            ) from None
        except (aiormq.exceptions.DeliveryError, aiormq.exceptions.ChannelNotFoundEntity) as exc:
            raise JournalError(f"a journal write was refused ({type(exc).__name__})") from None

    async def close(self) -> None:
        if self.channel is not None:
            await _close_quietly(self.channel)


class JournalTail:
    """Follow the journal from ``start`` (the offset a checkpoint covers, or a time)
    onwards, calling ``on_record`` for each record.

    ``caught_up`` is set once the tail's own marker came back: every record confirmed
    before :meth:`start` has been seen. A worker waits for it before it consumes, so a
    cancel confirmed before the worker started is honoured. The tail counts the bytes it
    read, so its reader knows when a checkpoint is due (:meth:`bytes_since`).
    """

    def __init__(
        self,
        connection: AbstractConnection,
        layout: Layout,
        on_record: Callable[[JournalRecord], None],
        *,
        start: Start,
        wants: Callable[[bytes], bool] | None = None,
        on_marker: Callable[[str], None] | None = None,
        read_only: bool = False,
    ) -> None:
        """``wants``: which lines to decode and hand on (see ``Tombstones.wants``);
        ``on_marker``: told the id of each marker read (see ``UntilMarker``);
        ``read_only``: a broker user refused the write of the tail's marker still follows
        (``wrote_marker`` False, ``caught_up`` then never set: the caller learns the
        end otherwise, see :func:`stream_end`)."""
        self.name = reading.require_journal(layout, "following the schedule")
        self.read_only = read_only
        self.wrote_marker = False
        self.connection = connection
        self.layout = layout
        self.start_at = start
        self.caught_up = asyncio.Event()
        self.first: int | None = None
        """The offset of the first message read."""
        self.bytes = 0
        """Bytes read since the start."""
        self.last_body = b""
        """The latest message read, whole (a reader that saves what it folded names it)."""
        self._sizes: deque[tuple[int, int]] = deque()
        """(offset, bytes read before it), for :meth:`bytes_since`."""
        self._marker = reading.new_marker(now_ms())
        self._reader = UntilMarker(
            self._marker.message_id, on_record, wants=wants, on_marker=on_marker
        )
        self._stream = AsyncStream()
        self._moved = asyncio.Event()

    @property
    def count(self) -> int:
        """Records seen so far, markers not counted."""
        return self._reader.count

    @property
    def channel(self) -> AbstractChannel | None:
        return self._stream.channel

    @property
    def offset(self) -> int:
        """The stream offset of the latest message read (-1: none yet)."""
        return self._stream.offset

    def bytes_since(self, offset: int) -> int:
        """Bytes of journal read from ``offset`` on (what a checkpoint covering up to
        ``offset`` leaves a reader to read). Asked with offsets that only grow (the
        latest checkpoint's): what is before one is forgotten."""
        sizes = self._sizes
        while sizes and sizes[0][0] < offset:
            sizes.popleft()
        return self.bytes - sizes[0][1] if sizes else 0

    async def read_to(self, offset: int) -> None:
        """Return once the tail has read the message at ``offset`` (or a later one);
        the tail then acks as it does past its marker."""
        while self._stream.offset < offset:
            self._moved.clear()
            await self._moved.wait()
        self._stream.live = True

    def _take(self, message: StreamMessage) -> None:
        if self.first is None:
            self.first = message.offset
        self._sizes.append((message.offset, self.bytes))
        self.bytes += len(message.body)
        self.last_body = message.body
        if self._reader(message.body):
            self._stream.live = True
            self.caught_up.set()
        self._moved.set()

    async def start(self) -> JournalTail:
        import aiormq

        try:
            await run_journal_async(reading.append(self.layout, [self._marker]), self.connection)
            self.wrote_marker = True
        except aiormq.exceptions.ChannelAccessRefused:
            if not self.read_only:
                raise
        try:
            await self._stream.open(self.connection, self.name, self.start_at)
        except aiormq.exceptions.ChannelNotFoundEntity:
            raise journal_missing(self.layout) from None
        self._stream.follow(self._take)
        return self

    async def close(self) -> None:
        await self._stream.close()
