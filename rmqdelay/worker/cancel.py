"""The cancel filter: a hook that skips the copies cancelled through the schedule journal.

It owns the worker's one journal tail; other hooks that fold the journal (keys,
recurring schedules) follow it through :meth:`CancelFilter.follow` instead of reading the
stream again.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

import aiormq
from aio_pika.abc import AbstractConnection

from ..amqp.journal import JournalTail
from ..core.clock import now_ms
from ..core.journal.records import JournalRecord
from ..core.journal.tombstones import Tombstones
from ..core.layout import Layout
from ..errors import TopologyError, WorkerError
from .delivery import Delivery
from .hooks import WorkerHook

__all__ = ["CancelFilter", "Follower"]

log = logging.getLogger("rmqdelay.worker")
_EXPIRE_EVERY_MS = 60_000


class Follower(Protocol):
    """A fold of the journal fed by the cancel filter's tail, in stream order."""

    def add(self, record: JournalRecord) -> None:
        """One record; the same stretch may come twice (each connect reads again)."""

    def wants(self, line: bytes) -> bool:
        """Whether a line must be decoded for it (see ``Tombstones.wants``)."""

    def expire(self, now_ms: int) -> object:
        """Forget what can no longer matter (called about once a minute)."""


class CancelFilter(WorkerHook):
    """Skip a delivery a tombstone names: its id and its due time, so a cancel skips
    every copy it named, and not a later re-schedule of the id.

    On each connect it reads the journal's tombstones up to now before consuming (so a
    cancel confirmed before the worker (re)started is honoured too), then follows the
    journal live. Losing the journal's channel ends the session: cancels would go unseen.
    """

    def __init__(self, layout: Layout, read_timeout: float) -> None:
        self.layout = layout
        self.read_timeout = read_timeout
        self.tombstones = Tombstones()
        self._tail: JournalTail | None = None
        self._expired_at_ms = 0
        self.followers: list[Follower] = []

    def follow(self, follower: Follower) -> None:
        """Feed ``follower`` every record too, from the next connect on."""
        self.followers.append(follower)

    def _add(self, record: JournalRecord) -> None:
        self.tombstones.add(record)
        for follower in self.followers:
            follower.add(record)

    def _wants(self, line: bytes) -> bool:
        return self.tombstones.wants(line) or any(f.wants(line) for f in self.followers)

    async def on_connect(self, connection: AbstractConnection, lost: asyncio.Event) -> None:
        if self.followers:
            tail = JournalTail(connection, self.layout, self._add, wants=self._wants)
        else:  # the usual worker: not a call more per record
            tail = JournalTail(
                connection, self.layout, self.tombstones.add, wants=self.tombstones.wants
            )
        self._tail = tail
        try:
            await tail.start()
            await asyncio.wait_for(tail.caught_up.wait(), self.read_timeout)
        except TopologyError as exc:
            raise WorkerError(str(exc)) from None
        except asyncio.TimeoutError:
            raise aiormq.exceptions.AMQPConnectionError(
                "the schedule journal was not read to its end in time"
            ) from None
        if tail.channel is not None:
            tail.channel.close_callbacks.add(lambda *_: lost.set())
        log.info(
            "schedule journal read: %d record(s), %d cancelled id(s) pending",
            tail.count,
            len(self.tombstones),
        )

    async def on_disconnect(self) -> None:
        tail, self._tail = self._tail, None
        if tail is not None:
            await tail.close()

    def before_handle(self, delivery: Delivery) -> bool:
        now = now_ms()
        if now - self._expired_at_ms > _EXPIRE_EVERY_MS:  # forget tombstones past their time
            self.tombstones.expire(now)
            for follower in self.followers:
                follower.expire(now)
            self._expired_at_ms = now
        return self.tombstones.is_cancelled(delivery.message_id, now, delivery.due_ms)
