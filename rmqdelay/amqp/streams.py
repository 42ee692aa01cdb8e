"""Stream consumers, one per client library: every journal and checkpoint read is one.

A RabbitMQ stream is read by a consumer with an ``x-stream-offset`` (an offset, a time,
``first`` or ``last``), a prefetch and manual acks (a stream needs them for credit).
:class:`BlockingStream` (pika, here) and :class:`~.aio_streams.AsyncStream` (aio-pika,
:mod:`.aio_streams`) carry out a
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

import contextlib
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import pika
import pika.exceptions

from ..core.journal.steps import Read, ReadEnd, StreamMessage
from . import pika_private

__all__ = [
    "ACK_EVERY",
    "OFFSET_ARG",
    "PREFETCH",
    "BlockingStream",
    "Readers",
    "offset_of",
    "peek_last",
]

PREFETCH = 2000
"""Messages a consumer may hold unacked (unless a read says otherwise): a journal write
is a few hundred records, mostly a few KB."""
ACK_EVERY = 500
"""Acks go as one multiple ack per this many messages read (or fewer: a quarter of a
read's own prefetch)."""
OFFSET_ARG = "x-stream-offset"


def _ack_every(step: Read) -> int:
    """How many messages go unacked before a multiple ack: fewer than the prefetch."""
    return min(ACK_EVERY, max(1, (step.prefetch or PREFETCH) // 4))


def offset_of(headers: Any, default: int = -1) -> int:
    """The stream offset the broker stamps on each delivery."""
    value = (headers or {}).get(OFFSET_ARG)
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

        channel.basic_consume(step.stream, on_message, arguments={OFFSET_ARG: start})
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
        channel.basic_consume(step.stream, on_message, arguments={OFFSET_ARG: "last"})
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
