"""Stream consumers, one per client library: every journal and checkpoint read is one.

A RabbitMQ stream is read by a consumer with an ``x-stream-offset`` (an offset, a time,
``first`` or ``last``), a prefetch and manual acks (a stream needs them for credit).
:class:`BlockingStream` (pika) and :class:`AsyncStream` (aio-pika) carry out a
:class:`~rmqdelay.core.journal.steps.Read`: each message, in order, to its ``take``
until it says stop. A one-off read is a follow that stops; a kept one (``keep``) goes
on where the last read stopped, with what came meanwhile.

pika rejects what a consumer still buffers when it is cancelled or its channel closes,
and RabbitMQ answers a reject on a stream by closing the whole connection. So a pika
consumer is never cancelled while its connection lives: a one-off read runs on a
connection of its own (or on a reader connection kept for one call and closed after it,
:class:`Readers`), a kept one lives as long as its connection, and before a connection
closes its consumers are told to drop what they buffer (:func:`_let_go`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

import pika
import pika.exceptions

from ..core.journal.steps import Read, ReadEnd, Start, StreamMessage
from . import pika_private

if TYPE_CHECKING:
    from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage

__all__ = ["AsyncStream", "BlockingStream", "Readers", "offset_of", "peek_last"]

PREFETCH = 2000
"""Messages a consumer may hold unacked (unless a read says otherwise): a journal write
is a few hundred records, mostly a few KB."""
ACK_EVERY = 500
"""Acks go as one multiple ack per this many messages read (or fewer: a quarter of a
read's own prefetch)."""
LIVE_ACK_S = 0.1
"""A live tail acks what it read within this long (see :meth:`AsyncStream.follow`)."""
_OFFSET = "x-stream-offset"


def _ack_every(step: Read) -> int:
    """How many messages go unacked before a multiple ack: fewer than the prefetch."""
    return min(ACK_EVERY, max(1, (step.prefetch or PREFETCH) // 4))


def offset_of(headers: Any, default: int = -1) -> int:
    """The stream offset the broker stamps on each delivery."""
    value = (headers or {}).get(_OFFSET)
    return int(value) if isinstance(value, int) else default


# ------------------------------------------------------------------ pika


class BlockingStream:
    """One consumer on pika, on the connection ``open_connection`` gives.

    ``shared``: that is the publisher's own connection (which it closes whole): the
    consumer is then never cancelled, and a read that must start elsewhere skips what
    comes before instead. Otherwise the connection is the reader's own, and closed with
    it (:meth:`close`)."""

    def __init__(
        self, open_connection: Callable[[], pika.BlockingConnection], *, shared: bool = False
    ) -> None:
        self._open = open_connection
        self._shared = shared
        self._connection: pika.BlockingConnection | None = None
        self._channel: Any = None
        self._waiting: deque[tuple[int, StreamMessage]] = deque()
        self._next = -1
        """The offset after the last message handed to a take (-1: none yet)."""
        self._acked = 0
        self._taken = 0
        self._every = ACK_EVERY

    def read(self, step: Read) -> ReadEnd:
        if step.reached():
            return "done"
        for attempt in (1, 2):
            try:
                return self._read(step)
            except pika.exceptions.ChannelClosedByBroker as exc:
                self.close()
                if exc.reply_code == 404:
                    return "missing"
                if attempt == 2:
                    raise
            except pika.exceptions.AMQPError:
                # the connection dropped (an idle one misses heartbeats): once more on a
                # new one, from where the reads got to
                self.close()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def _read(self, step: Read) -> ReadEnd:
        connection = self._consumer(step)
        deadline = time.monotonic() + step.timeout
        while True:
            while self._waiting:
                tag, message = self._waiting.popleft()
                self._taken = tag
                self._next = message.offset + 1
                deadline = time.monotonic() + step.timeout
                if (
                    message.offset >= 0
                    and isinstance(step.start, int)
                    and message.offset < step.start
                ):
                    continue  # before where this read starts (a shared consumer, behind)
                if step.take(message):
                    self._ack(self._every)
                    return "done"
            self._ack(self._every)
            if time.monotonic() > deadline:
                return "silent"
            # a poll first: a write is usually in by the time its confirm came, and a
            # wait with a time limit costs pika a timer
            connection.process_data_events(time_limit=0)
            if not self._waiting:
                connection.process_data_events(time_limit=0.05)

    def _consumer(self, step: Read) -> pika.BlockingConnection:
        start = step.start
        behind = isinstance(start, int) and 0 <= self._next < start - PREFETCH
        connection, channel = self._connection, self._channel
        open_now = connection is not None and connection.is_open and channel is not None
        if open_now and channel.is_open and (self._shared or not behind):
            assert connection is not None
            return connection
        if not self._shared:
            self.close()
        if self._next >= 0 and not (isinstance(start, int) and start > self._next):
            start = self._next  # a kept reader, opened again: from where it got to
        self._connection = connection = self._open()
        channel = connection.channel()
        self._every = _ack_every(step)
        channel.basic_qos(prefetch_count=step.prefetch or PREFETCH)
        waiting = self._waiting
        waiting.clear()

        def on_message(_ch: object, method: Any, properties: Any, body: bytes) -> None:
            headers = properties.headers or {}
            message = StreamMessage(offset_of(headers), body, headers)
            waiting.append((method.delivery_tag or 0, message))

        channel.basic_consume(step.stream, on_message, arguments={_OFFSET: start})
        self._channel = channel
        self._acked = self._taken = 0
        return connection

    def _ack(self, every: int) -> None:
        if self._channel is not None and self._taken - self._acked >= every:
            self._channel.basic_ack(self._taken, multiple=True)
            self._acked = self._taken

    def let_go(self) -> None:
        """Before the connection closes: what the consumer buffers, dropped."""
        waiting = self._waiting
        _let_go(self._channel, lambda: len(waiting))

    def close(self) -> None:
        """Close the reader's own connection (what it buffered is read again next time);
        a shared one is the publisher's to close."""
        self.let_go()  # a shared connection closes after it, the channel with it
        connection, self._connection, self._channel = self._connection, None, None
        self._waiting.clear()
        if connection is not None and not self._shared:
            with contextlib.suppress(pika.exceptions.AMQPError, OSError):
                connection.close()


DRAIN_S = 0.3
"""How long a consumer is drained with nothing arriving before its channel closes, on a
pika whose internals were not checked (:func:`_let_go`)."""
DRAIN_MAX_S = 3.0
"""The longest such a drain goes on while deliveries keep arriving."""


def _let_go(channel: Any, arrived: Callable[[], int] = lambda: 0) -> None:
    """Before a consumer's channel or connection closes: what pika buffers for it, and
    what is on its way, dropped rather than rejected (a reject on a stream closes the
    connection). On a pika not checked, what is on its way is dispatched first, until
    :data:`DRAIN_S` pass with nothing more (``arrived``: how many came so far; a
    consumer past its read gets at most its prefetch more). A fixed 0.2 s was seen too
    short on a loaded machine."""
    if channel is None or not channel.is_open or pika_private.drop_deliveries(channel):
        return
    start = time.monotonic()
    quiet_at, seen = start + DRAIN_S, arrived()
    with contextlib.suppress(pika.exceptions.AMQPError, OSError):
        while (left := min(quiet_at, start + DRAIN_MAX_S) - time.monotonic()) > 0:
            channel.connection.process_data_events(time_limit=left)  # returns once some came
            if (count := arrived()) != seen:
                quiet_at, seen = time.monotonic() + DRAIN_S, count


def peek_last(connection: pika.BlockingConnection, step: Read) -> ReadEnd:
    """A read of a stream's last message alone (the checkpoint stream's: who wrote last),
    on any connection: a prefetch of one, and the channel closed with that message
    unacked, so the broker sends nothing more that pika would reject on closing it."""
    channel = connection.channel()
    got: list[tuple[int, StreamMessage]] = []

    def on_message(_ch: object, method: Any, properties: Any, body: bytes) -> None:
        headers = properties.headers or {}
        got.append((method.delivery_tag or 0, StreamMessage(offset_of(headers), body, headers)))

    try:
        channel.basic_qos(prefetch_count=1)
        channel.basic_consume(step.stream, on_message, arguments={_OFFSET: "last"})
        deadline = time.monotonic() + step.timeout
        while not got and time.monotonic() < deadline:
            connection.process_data_events(time_limit=0.05)
        if not got:
            return "silent"
        return "done" if step.take(got[0][1]) else "silent"
    except pika.exceptions.ChannelClosedByBroker as exc:
        if exc.reply_code == 404:
            return "missing"
        raise
    finally:
        if channel.is_open:
            _let_go(channel)
            channel.close()
        # what the consumer left for pika to dispatch, dispatched now: else the
        # publisher's next poll (is the connection still open?) would do only that
        connection.process_data_events(0)


class Readers:
    """The one-off reads of one call (``scheduled list``, ``cancel``: the latest
    checkpoint, its parts, the journal's tail) on one connection of their own, each on a
    channel of its own, none cancelled (see the module's docstring): the connection,
    closed by :meth:`close` when the call ends, takes them all with it.

    ``peek``: a connection that may carry a read of a stream's last message alone
    (:func:`peek_last`), so that a publisher's check opens no second connection."""

    def __init__(
        self,
        open_connection: Callable[[], pika.BlockingConnection],
        peek: Callable[[], pika.BlockingConnection] | None = None,
    ) -> None:
        self._open = open_connection
        self._peek = peek
        self._connection: pika.BlockingConnection | None = None
        self._streams: list[BlockingStream] = []

    def read(self, step: Read) -> ReadEnd:
        if step.start == "last" and self._peek is not None and self._connection is None:
            return peek_last(self._peek(), step)
        if self._connection is None or not self._connection.is_open:
            self._connection = self._open()
        connection = self._connection
        stream = BlockingStream(lambda: connection, shared=True)
        self._streams.append(stream)
        return stream.read(step)

    def close(self) -> None:
        connection, self._connection = self._connection, None
        streams, self._streams = self._streams, []
        for stream in streams:
            stream.let_go()
        if connection is not None:
            with contextlib.suppress(pika.exceptions.AMQPError, OSError):
                connection.close()


# ------------------------------------------------------------------ aio-pika


class AsyncStream:
    """One consumer on aio-pika, on a channel of its own on ``connection``.

    :meth:`read` carries out a Read step (steps of concurrent callers take turns: a lock);
    :meth:`follow` hands every message to a callback as it comes, for a live tail. Acks
    go as one multiple ack per :data:`ACK_EVERY` messages and, once the tail is live
    (records come one at a time), within :data:`LIVE_ACK_S` of a message: a worker's
    tail sees every journal write of every publisher, and an ack per write was as much
    work for the broker as the write."""

    def __init__(self) -> None:
        self.channel: AbstractChannel | None = None
        self.offset = -1
        """The offset of the latest message delivered (-1: none yet)."""
        self.live = False
        self._waiting: deque[tuple[AbstractIncomingMessage, StreamMessage]] = deque()
        self._heard = asyncio.Event()
        self._lock = asyncio.Lock()
        self._acking = asyncio.Lock()
        self._unacked = 0
        self._acked = 0
        self._latest: AbstractIncomingMessage | None = None
        self._flush: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._push: Callable[[StreamMessage], object] | None = None
        self._every = ACK_EVERY

    async def open(
        self,
        connection: AbstractConnection,
        stream: str,
        start: Start,
        prefetch: int | None = None,
    ) -> None:
        """Consume ``stream`` from ``start``."""
        self._waiting.clear()
        self._unacked = 0
        self._every = min(ACK_EVERY, max(1, (prefetch or PREFETCH) // 4))
        self.channel = channel = await connection.channel()
        await channel.set_qos(prefetch_count=prefetch or PREFETCH)
        queue = await channel.get_queue(stream, ensure=False)
        await queue.consume(self._on_message, arguments={_OFFSET: start})

    async def read(self, connection: AbstractConnection, step: Read) -> ReadEnd:
        import aiormq

        async with self._lock:
            if step.reached():
                return "done"
            for attempt in (1, 2):
                try:
                    return await self._read(connection, step)
                except aiormq.exceptions.ChannelNotFoundEntity:
                    await self.close()
                    return "missing"
                except (aiormq.exceptions.AMQPError, ConnectionError):
                    await self.close()
                    if attempt == 2:
                        raise
            raise AssertionError("unreachable")

    async def _read(self, connection: AbstractConnection, step: Read) -> ReadEnd:
        channel = self.channel
        behind = isinstance(step.start, int) and 0 <= self.offset < step.start - PREFETCH
        if channel is None or channel.is_closed or behind:
            if channel is not None:
                await self.close()
            start = step.start
            if self.offset >= 0 and not isinstance(start, int):
                start = self.offset + 1  # a kept reader, opened again
            await self.open(connection, step.stream, start, step.prefetch)
        while True:
            while self._waiting:
                message, got = self._waiting.popleft()
                self._unacked += 1
                skip = isinstance(step.start, int) and 0 <= got.offset < step.start
                done = not skip and step.take(got)
                if self._unacked >= self._every:
                    self._unacked = 0
                    await self._ack_up_to(message)
                if done:
                    return "done"
            self._heard.clear()
            try:
                await asyncio.wait_for(self._heard.wait(), step.timeout)
            except asyncio.TimeoutError:
                return "silent"

    def follow(self, push: Callable[[StreamMessage], object]) -> None:
        """From now on hand each message to ``push`` as it comes (a live tail), instead of
        keeping it for a read; what waits is handed over first."""
        self._push = push
        while self._waiting:
            message, got = self._waiting.popleft()
            if self._note(message):
                self._spawn(self._ack_quietly(message))
            push(got)

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        headers = message.headers or {}
        got = StreamMessage(offset_of(headers, self.offset), message.body, headers)
        self.offset = max(self.offset, got.offset)
        if self._push is None:
            self._waiting.append((message, got))
            self._heard.set()
            return
        if self._note(message):
            await self._ack_up_to(message)
        self._push(got)

    def _note(self, message: AbstractIncomingMessage) -> bool:
        """One more message read: True when a batch's ack is due now; once live, one is
        set to go within :data:`LIVE_ACK_S`."""
        self._unacked += 1
        self._latest = message
        if self._unacked >= self._every:
            self._unacked = 0
            return True
        if self.live and self._flush is None:
            loop = asyncio.get_running_loop()
            self._flush = loop.call_later(LIVE_ACK_S, self._flush_acks)
        return False

    def _spawn(self, ack: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(ack)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _flush_acks(self) -> None:
        self._flush = None
        message = self._latest
        if message is None or not self._unacked:
            return
        self._unacked = 0
        self._spawn(self._ack_quietly(message))

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
        import aiormq

        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        channel, self.channel = self.channel, None
        self._waiting.clear()
        self._acked = 0
        if channel is not None and not channel.is_closed:
            with contextlib.suppress(aiormq.exceptions.AMQPError, RuntimeError, ConnectionError):
                await channel.close()
