"""A publisher's journal follower: the :class:`~rmqdelay.core.journal.steps.Follow` step,
on pika and on aio-pika.

A keyed publish reads the journal back to its own record (:mod:`rmqdelay.core.journal.key_flows`).
Opening a stream consumer for each would cost a connection (pika) or a channel and a
seek (both) per publish, so the follower keeps its consumer open between publishes and
hands each step what came since the last. The consumer has a channel of its own on the
publisher's connection, so the stream's deliveries come in while the publisher waits for
its confirms (a connection of its own cost a keyed publish a fifth of its rate). Never
on a connection given to a pika publisher: pika cancels a consumer, when its channel
closes, by rejecting what it buffers, and a stream answers a reject by closing the
whole connection; such a publisher's follower opens a connection of its own. When the
consumer is lost, the next step opens another at the offset the fold has read to
(``take`` skips what it was given before).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pika
import pika.exceptions

from ..core.journal.steps import Follow, ReadEnd

if TYPE_CHECKING:
    from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage

__all__ = ["AsyncFollower", "BlockingFollower"]

_PREFETCH = 2000
_ACK_EVERY = 100
"""Acks go as one multiple ack per this many messages read: a stream consumer needs
them for credit, and one per publish would be as much work for the broker as the write."""
_OFFSET = "x-stream-offset"


def _offset_of(headers: Any) -> int:
    value = (headers or {}).get(_OFFSET)
    return int(value) if value is not None else -1


class BlockingFollower:
    """The Follow step on pika, on a connection of its own from ``open_reader``."""

    def __init__(
        self, open_reader: Callable[[], pika.BlockingConnection], *, shared: bool = False
    ) -> None:
        """``shared``: ``open_reader`` gives the publisher's own connection (one it
        opened, and closes whole): the stream's deliveries then come in while the
        publisher waits for its confirms, instead of one round after."""
        self._open_reader = open_reader
        self._shared = shared
        self._connection: pika.BlockingConnection | None = None
        self._channel: Any = None
        self._waiting: deque[tuple[int, int, bytes]] = deque()
        self._acked = 0
        self._taken = 0

    def follow(self, step: Follow) -> ReadEnd:
        if step.reached():
            return "done"
        for attempt in (1, 2):
            try:
                return self._follow(step)
            except pika.exceptions.ChannelClosedByBroker as exc:
                self.close()
                if exc.reply_code == 404:
                    return "missing"
                if attempt == 2:
                    raise
            except pika.exceptions.AMQPError:
                # the reader's connection dropped (an idle one misses heartbeats): once
                # more on a new one, from the offset read to
                self.close()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def _follow(self, step: Follow) -> ReadEnd:
        connection = self._consumer(step)
        deadline = time.monotonic() + step.timeout
        while True:
            while self._waiting:
                tag, offset, body = self._waiting.popleft()
                self._taken = tag
                deadline = time.monotonic() + step.timeout
                if step.take(offset, body):
                    self._ack(_ACK_EVERY)
                    return "done"
            self._ack(_ACK_EVERY)
            if time.monotonic() > deadline:
                return "silent"
            # a poll first: the write is usually in by the time its confirm came, and a
            # wait with a time limit costs pika a timer
            connection.process_data_events(time_limit=0)
            if not self._waiting:
                connection.process_data_events(time_limit=0.05)

    def _consumer(self, step: Follow) -> pika.BlockingConnection:
        if self._shared:
            connection = self._open_reader()
            channel = self._channel
            if connection is self._connection and channel is not None and channel.is_open:
                return connection
        elif self._connection is not None and self._connection.is_open:
            return self._connection
        self.close()
        self._connection = connection = self._open_reader()
        channel = connection.channel()
        channel.basic_qos(prefetch_count=_PREFETCH)
        waiting = self._waiting

        def on_message(_ch: object, method: Any, properties: Any, body: bytes) -> None:
            waiting.append((method.delivery_tag or 0, _offset_of(properties.headers), body))

        channel.basic_consume(step.stream, on_message, arguments={_OFFSET: step.offset})
        self._channel = channel
        return connection

    def _ack(self, every: int) -> None:
        if self._channel is not None and self._taken - self._acked >= every:
            self._channel.basic_ack(self._taken, multiple=True)
            self._acked = self._taken

    def close(self) -> None:
        """Close the reader's connection (what it buffered is read again next time)."""
        connection, self._connection, self._channel = self._connection, None, None
        self._waiting.clear()
        self._acked = self._taken = 0
        # a shared connection is the publisher's to close: closing the channel alone
        # would reject what it buffers, and a stream answers that by closing the connection
        if connection is not None and not self._shared:
            with contextlib.suppress(pika.exceptions.AMQPError, OSError):
                connection.close()


class AsyncFollower:
    """The Follow step on aio-pika, on a channel of its own on the publisher's connection.

    Steps of concurrent publishes take turns (a lock): each reads on from where the last
    stopped, and one whose marker a turn before it read answers at once (``reached``).
    """

    def __init__(self) -> None:
        self._channel: AbstractChannel | None = None
        self._waiting: deque[tuple[AbstractIncomingMessage, int, bytes]] = deque()
        self._heard = asyncio.Event()
        self._lock = asyncio.Lock()
        self._unacked = 0

    async def follow(self, connection: AbstractConnection, step: Follow) -> ReadEnd:
        import aiormq

        async with self._lock:
            if step.reached():
                return "done"
            for attempt in (1, 2):
                try:
                    return await self._follow(connection, step)
                except aiormq.exceptions.ChannelNotFoundEntity:
                    await self.close()
                    return "missing"
                except (aiormq.exceptions.AMQPError, ConnectionError):
                    await self.close()
                    if attempt == 2:
                        raise
            raise AssertionError("unreachable")

    async def _follow(self, connection: AbstractConnection, step: Follow) -> ReadEnd:
        await self._consumer(connection, step)
        while True:
            while self._waiting:
                message, offset, body = self._waiting.popleft()
                self._unacked += 1
                done = step.take(offset, body)
                if self._unacked >= _ACK_EVERY:
                    self._unacked = 0
                    await message.ack(multiple=True)
                if done:
                    return "done"
            self._heard.clear()
            try:
                await asyncio.wait_for(self._heard.wait(), step.timeout)
            except asyncio.TimeoutError:
                return "silent"

    async def _consumer(self, connection: AbstractConnection, step: Follow) -> None:
        channel = self._channel
        if channel is not None and not channel.is_closed:
            return
        self._waiting.clear()
        self._unacked = 0
        self._channel = channel = await connection.channel()
        await channel.set_qos(prefetch_count=_PREFETCH)
        queue = await channel.get_queue(step.stream, ensure=False)
        await queue.consume(self._on_message, arguments={_OFFSET: step.offset})

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        self._waiting.append((message, _offset_of(message.headers), message.body))
        self._heard.set()

    async def close(self) -> None:
        import aiormq

        channel, self._channel = self._channel, None
        self._waiting.clear()
        if channel is not None and not channel.is_closed:
            with contextlib.suppress(aiormq.exceptions.AMQPError, RuntimeError, ConnectionError):
                await channel.close()
