"""The stream consumer on aio-pika: :class:`AsyncStream`, the asyncio side of
:mod:`.streams` (which holds the pika one, and what both share).

A worker's live tail sees every journal write of every publisher, so acks are batched:
one multiple ack per :data:`~.streams.ACK_EVERY` messages and, once live, within
:data:`LIVE_ACK_S` of a message.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from ..core.journal.steps import Read, ReadEnd, Start, StreamMessage
from .streams import ACK_EVERY, OFFSET_ARG, PREFETCH, offset_of

if TYPE_CHECKING:
    from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage

__all__ = ["LIVE_ACK_S", "AsyncStream"]

LIVE_ACK_S = 0.1
"""A live tail acks what it read within this long (see :meth:`AsyncStream.follow`)."""


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
        await queue.consume(self._on_message, arguments={OFFSET_ARG: start})

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
