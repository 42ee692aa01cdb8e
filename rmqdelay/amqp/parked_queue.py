"""The parking queue's operations: list, replay and purge (asyncio, aio-pika).

Reading uses ``basic.get`` without ack and lets the channel's close give every
message back, so ``list`` changes nothing but the messages' redelivered flag.
``replay`` removes a message from parking only after the broker confirmed its copy.
Each read counts toward the quorum parking queue's delivery limit, which is why it
declares the largest (``core.topology.PARKING_DELIVERY_LIMIT``).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import timedelta

from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage, AbstractQueue

from ..core.handling.parking import ParkedMessage, read_parked, replay_headers
from ..core.messages import carried_properties
from ..errors import PublishError, TopologyError, UnknownDestinationError
from ..settings import Settings
from .aio_publisher import AsyncPublisher
from .connections import connect_async
from .passive import ready_messages_async

__all__ = ["ParkedQueue", "ReplayReport"]

Progress = Callable[[int], None]
"""Called with the number of messages looked at so far."""


@dataclass
class ReplayReport:
    """What ``replay`` did: how many went back, and which stayed parked and why."""

    replayed: int = 0
    skipped: list[tuple[str | None, str]] = field(default_factory=list)


class ParkedQueue:
    """The parking queue of one prefix. ``async with ParkedQueue(settings) as parked:``."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.layout = settings.layout
        self._connection: AbstractConnection | None = None

    async def __aenter__(self) -> ParkedQueue:
        self._connection = await connect_async(self.settings, "parked")
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._connection is not None:
            await self._connection.close()
            self._connection = None

    async def _open(self) -> tuple[AbstractChannel, AbstractQueue, int]:
        if self._connection is None:
            raise RuntimeError("use `async with ParkedQueue(settings)`")
        timeout = self.settings.confirm_timeout
        total = await ready_messages_async(self._connection, self.layout.parking, timeout)
        if total is None:
            raise TopologyError(
                f"parking queue {self.layout.parking!r} does not exist: run "
                "`rmqdelay topology apply` (or check --prefix)"
            )
        channel = await asyncio.wait_for(
            self._connection.channel(publisher_confirms=False), timeout
        )
        queue = await channel.get_queue(self.layout.parking, ensure=False)
        return channel, queue, total

    async def count(self) -> int:
        channel, _queue, total = await self._open()
        await channel.close()
        return total

    async def _walk(
        self, queue: AbstractQueue, total: int
    ) -> AsyncIterator[tuple[AbstractIncomingMessage, ParkedMessage]]:
        """Each ready message once, unacked: held ones are not handed out again."""
        for _ in range(total):
            message = await queue.get(no_ack=False, fail=False)
            if message is None:
                return
            yield message, read_parked(message.headers, message.message_id, self.layout)

    async def list(
        self, destination: str | None = None, limit: int | None = None
    ) -> tuple[int, list[ParkedMessage]]:
        """The queue's size and its messages (of ``destination``), without removing any."""
        channel, queue, total = await self._open()
        found: list[ParkedMessage] = []
        try:
            async for _message, parked in self._walk(queue, total):
                if destination is None or parked.destination == destination:
                    found.append(parked)
                    if limit is not None and len(found) >= limit:
                        break
        finally:
            await channel.close()  # every unacked message goes back
        return total, found

    async def replay(
        self,
        destination: str | None = None,
        *,
        delay: timedelta = timedelta(0),
        limit: int | None = None,
        progress: Progress | None = None,
        message_id: str | None = None,
    ) -> ReplayReport:
        """Publish parked messages back to their destinations as attempt 1 (those of
        ``destination``, or the one of ``message_id``, when given).

        Each one leaves parking only once its copy is confirmed; one that cannot be
        sent (its work queue is gone, say) stays parked and is listed in the report.
        """
        channel, queue, total = await self._open()
        report = ReplayReport()
        publisher = await AsyncPublisher(self.settings, connection=self._connection).connect()
        seen = 0
        try:
            async for message, parked in self._walk(queue, total):
                seen += 1
                if progress is not None:
                    progress(seen)
                if destination is not None and parked.destination != destination:
                    continue
                if message_id is not None and parked.message_id != message_id:
                    continue
                if parked.destination is None:
                    report.skipped.append((parked.message_id, "no destination is known"))
                    continue
                try:
                    await publisher.publish(
                        parked.destination,
                        message.body,
                        delay=delay,
                        headers=replay_headers(message.headers),
                        message_id=message.message_id or str(uuid.uuid4()),
                        **carried_properties(message),
                    )
                except (UnknownDestinationError, PublishError) as exc:
                    report.skipped.append((parked.message_id, str(exc)))
                    continue
                await message.ack()
                report.replayed += 1
                if limit is not None and report.replayed >= limit:
                    break
        finally:
            await publisher.close()
            await channel.close()
        return report

    async def purge(
        self,
        destination: str | None = None,
        *,
        message_id: str | None = None,
        progress: Progress | None = None,
    ) -> int:
        """Delete parked messages (of ``destination``, or the one of ``message_id``);
        return how many."""
        channel, queue, total = await self._open()
        try:
            if destination is None and message_id is None:
                result = await queue.purge()
                return int(result.message_count or 0)
            deleted = seen = 0
            async for message, parked in self._walk(queue, total):
                seen += 1
                if progress is not None:
                    progress(seen)
                if destination is not None and parked.destination != destination:
                    continue
                if message_id is None or parked.message_id == message_id:
                    await message.ack()
                    deleted += 1
            return deleted
        finally:
            await channel.close()
