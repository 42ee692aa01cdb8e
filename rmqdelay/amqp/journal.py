"""The schedule journal's two steps carried out on pika and on aio-pika, and its tail.

What to read and write, and what it means, is :mod:`rmqdelay.core.journal.flows`: here
are only :class:`~rmqdelay.core.journal.flows.Append` (publish on a confirm channel) and
:class:`~rmqdelay.core.journal.flows.Read` (consume a stream from a timestamp offset,
with manual acks and a prefetch, as RabbitMQ requires for streams), once per client, and
:class:`JournalTail`, which follows the journal for a worker.

aio-pika and aiormq are imported by the asyncio functions that use them: the sync side
(``rmqdelay publish``, ``cancel``, ``scheduled list``) does without them, and they cost
the start-up of every such command a good part of its time.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, TypeVar, cast

import pika
import pika.exceptions

from ..core.clock import now_ms
from ..core.failures import journal_missing
from ..core.journal import flows
from ..core.journal.flows import JournalFlow, UntilMarker
from ..core.journal.records import JournalRecord
from ..core.journal.steps import Append, JournalStep, Read, ReadEnd, stream_offset
from ..core.layout import Layout
from ..core.steps import Steps
from ..settings_light import BrokerSettings
from .blocking import close_connection
from .connections import connect_blocking

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
    "read_stream",
    "run_journal",
    "run_journal_async",
    "stream_end",
    "write_probe",
]

T = TypeVar("T")
_PREFETCH = 2000
_ACK_EVERY = 500
LIVE_ACK_S = 0.1
"""A live tail acks what it read within this long (see ``_Stream``)."""


# ------------------------------------------------------------------ sync (pika)


def run_journal(
    flow: JournalFlow[T],
    connection: pika.BlockingConnection,
    open_reader: Callable[[], pika.BlockingConnection],
) -> T:
    """Carry out a journal flow: appends on ``connection``, reads on a connection of
    their own from ``open_reader``, closed after each read.

    pika cancels a consumer by rejecting what it still buffers, and a stream answers a
    reject by closing the whole connection; closing the reader's own connection rejects
    nothing.
    """

    def do(step: JournalStep) -> object:
        if isinstance(step, Append):
            return append_records(connection, step)
        return read_stream(open_reader(), step)

    return flows.run(flow, do)


def read_once(settings: BrokerSettings, flow: JournalFlow[T]) -> T:
    """Carry out a flow that reads the journal once, as its last step (``scheduled
    list``: its marker appended, then the journal read to it), on one connection of its
    own: a publisher's connection and channel, and a reader's second connection, cost
    ``scheduled list`` three round trips and a handshake more. The read closes it."""
    connection = connect_blocking(settings, "journal")
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


def read_stream(reader: pika.BlockingConnection, step: Read) -> ReadEnd:
    """Carry out a :class:`Read` on ``reader``, a connection of its own, closed after:
    consume until ``step.take`` says stop; acks go in batches (a stream consumer needs
    them for credit)."""
    channel = reader.channel()
    waiting: list[tuple[int, bytes]] = []
    try:
        channel.basic_qos(prefetch_count=_PREFETCH)
        channel.basic_consume(
            step.stream,
            lambda _ch, method, _props, body: waiting.append((method.delivery_tag or 0, body)),
            arguments={"x-stream-offset": step.offset},
        )
        acked = 0
        while True:
            deadline = time.monotonic() + step.timeout
            while not waiting:
                if time.monotonic() > deadline:
                    return "silent"
                reader.process_data_events(time_limit=0.05)
            batch = waiting[:]
            del waiting[:]
            for _tag, body in batch:
                if step.take(body):
                    return "done"
            last = batch[-1][0]
            if last - acked >= _ACK_EVERY:
                channel.basic_ack(last, multiple=True)
                acked = last
    except pika.exceptions.ChannelClosedByBroker as exc:
        if exc.reply_code == 404:
            return "missing"
        raise
    finally:
        # pika rejects what the consumer still buffers, the stream then closes the
        # connection: this one is the reader's alone, so that is fine
        with contextlib.suppress(pika.exceptions.AMQPError):
            reader.close()


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
    import aiormq

    stream = _Stream(step.take)
    try:
        await stream.start(connection, step.stream, step.offset)
        while not stream.stopped:
            stream.heard.clear()
            try:
                await asyncio.wait_for(stream.heard.wait(), step.timeout)
            except asyncio.TimeoutError:
                return "silent"
        return "done"
    except aiormq.exceptions.ChannelNotFoundEntity:
        return "missing"
    finally:
        await stream.close()


class _Stream:
    """A stream consumer on a channel of its own, handing each body to ``take`` in order.

    Acks go as one multiple ack per batch (a stream consumer needs them for credit), and
    once ``live`` (past the end, records come one at a time) within ``LIVE_ACK_S`` of a
    record: a worker's tail sees every journal write of every publisher, and an ack per
    write was as much work for the broker as the write.
    """

    def __init__(self, take: Callable[[bytes], bool]) -> None:
        self.take = take
        self.channel: AbstractChannel | None = None
        self.heard = asyncio.Event()
        self.stopped = False
        self.live = False
        self.offset = -1
        """The stream offset of the latest message taken (-1: none yet)."""
        self._unacked = 0
        self._acked = 0
        self._acking = asyncio.Lock()
        self._latest: AbstractIncomingMessage | None = None
        self._flush: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self, connection: AbstractConnection, name: str, offset: datetime) -> None:
        self.channel = channel = await connection.channel()
        await channel.set_qos(prefetch_count=_PREFETCH)
        queue = await channel.get_queue(name, ensure=False)
        await queue.consume(self._on_message, arguments={"x-stream-offset": offset})

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        self.offset = max(self.offset, _offset_of(message, self.offset))
        self._unacked += 1
        self._latest = message
        if self._unacked >= _ACK_EVERY:
            self._unacked = 0
            await self._ack_up_to(message)
        elif self.live and self._flush is None:
            loop = asyncio.get_running_loop()
            self._flush = loop.call_later(LIVE_ACK_S, self._flush_acks)
        if not self.stopped and self.take(message.body):
            self.stopped = True
        self.heard.set()

    def _flush_acks(self) -> None:
        self._flush = None
        message = self._latest
        if message is None or not self._unacked:
            return
        self._unacked = 0
        task = asyncio.ensure_future(self._ack_quietly(message))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _ack_quietly(self, message: AbstractIncomingMessage) -> None:
        import aiormq

        # a closed channel returns what it held unacked: nothing is lost
        with contextlib.suppress(aiormq.exceptions.AMQPError, RuntimeError, ConnectionError):
            await self._ack_up_to(message)

    async def _ack_up_to(self, message: AbstractIncomingMessage) -> None:
        """One multiple ack at a time, never below one already sent.

        Each delivery's callback is a task of its own, and aiormq's write queue holds 10
        frames: a busy connection (a worker's, publishing) has its writers wait, and
        asyncio's queue lets a later writer in before a woken one, so two acks could go
        out of order. A multiple ack of a tag below one already acked is an unknown
        delivery tag to the broker, which closes the channel (seen under the x-delay
        bridge: the worker reconnected every few seconds).
        """
        tag = message.delivery_tag or 0
        async with self._acking:
            if tag <= self._acked:
                return
            self._acked = tag
            await message.ack(multiple=True)

    async def close(self) -> None:
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        if self.channel is not None:
            await _close_quietly(self.channel)


def _offset_of(message: AbstractIncomingMessage, default: int) -> int:
    """The stream offset the broker stamps on each delivery (``x-stream-offset``)."""
    offset = (message.headers or {}).get("x-stream-offset")
    return offset if isinstance(offset, int) else default


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
        seen = max(seen, _offset_of(message, seen))
        heard.set()
        await message.ack()

    try:
        await channel.set_qos(prefetch_count=_PREFETCH)
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
    await run_journal_async(flows.probe(layout), connection)


class JournalWriter:
    """Appends records on a confirm channel of its own, kept open: a worker writes a
    claim before each keyed handler and a ``done`` after it, and a channel per write
    (as :func:`run_journal_async` opens) would double each one's round trips.

    Writes asked for in the same turn of the event loop go out as one stream message
    (up to ``RECORDS_PER_WRITE`` records) with one confirm: a worker handling keyed
    messages 64 at a time claims them about as fast as it receives them.
    """

    def __init__(self, connection: AbstractConnection, layout: Layout, timeout: float) -> None:
        self.name = flows.require_journal(layout, "writing to the schedule journal")
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
    """Follow the journal from ``since_ms`` onwards, calling ``on_record`` for each record.

    ``caught_up`` is set once the tail's own marker came back: every record confirmed
    before :meth:`start` has been seen. A worker waits for it before it consumes, so a
    cancel confirmed before the worker started is honoured.
    """

    def __init__(
        self,
        connection: AbstractConnection,
        layout: Layout,
        on_record: Callable[[JournalRecord], None],
        *,
        since_ms: int | None = None,
        wants: Callable[[bytes], bool] | None = None,
        on_marker: Callable[[str], None] | None = None,
        read_only: bool = False,
    ) -> None:
        """``wants``: which lines to decode and hand on (see ``Tombstones.wants``);
        ``on_marker``: told the id of each marker read (see ``UntilMarker``);
        ``read_only``: a broker user refused the write of the tail's marker still follows
        (``wrote_marker`` False, ``caught_up`` then never set: the caller learns the
        end otherwise, see :func:`stream_end`)."""
        self.name = flows.require_journal(layout, "following the schedule")
        self.read_only = read_only
        self.wrote_marker = False
        self.connection = connection
        self.layout = layout
        self.since_ms = now_ms() - layout.max_delay_ms if since_ms is None else since_ms
        self.caught_up = asyncio.Event()
        self._marker = flows.new_marker(now_ms())
        self._reader = UntilMarker(
            self._marker.message_id, on_record, wants=wants, on_marker=on_marker
        )
        self._stream = _Stream(self._take)

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

    async def read_to(self, offset: int) -> None:
        """Return once the tail has read the message at ``offset`` (or a later one);
        the tail then acks as it does past its marker."""
        stream = self._stream
        while stream.offset < offset:
            stream.heard.clear()
            await stream.heard.wait()
        stream.live = True

    def _take(self, body: bytes) -> bool:
        if self._reader(body):
            self._stream.live = True
            self.caught_up.set()
        return False  # a tail never stops by itself

    async def start(self) -> JournalTail:
        import aiormq

        try:
            await run_journal_async(flows.append(self.layout, [self._marker]), self.connection)
            self.wrote_marker = True
        except aiormq.exceptions.ChannelAccessRefused:
            if not self.read_only:
                raise
        offset = stream_offset(self.since_ms)
        try:
            await self._stream.start(self.connection, self.name, offset)
        except aiormq.exceptions.ChannelNotFoundEntity:
            raise journal_missing(self.layout) from None
        return self

    async def close(self) -> None:
        await self._stream.close()
